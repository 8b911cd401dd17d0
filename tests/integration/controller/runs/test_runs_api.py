"""The run API and the run reconciler against the local control plane (real Kueue).

Each test gets its own namespace with a private ClusterQueue and LocalQueue `q` (no
admission checks), a researcher ServiceAccount whose Role allows what DESIGN.md section 4
needs, and an in-process controller that tells KWOK to keep pods running (`run-for`).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devcluster import cluster
from shared import spec as specs
from tests import controllerkit, kueue, runskit, support
from tests.runskit import IMAGE, RESEARCHER_RULES, Env, job_spec, make_token

pytestmark = pytest.mark.cluster


async def read_job(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """A Job as raw JSON (404 means not yet)."""

    async def read() -> dict[str, Any]:
        resp = await client.BatchV1Api(api).read_namespaced_job(
            name, namespace, _preload_content=False
        )
        return dict(await resp.json())

    return await support.eventually(support.not_found_is_not_yet(read), what=f"Job {name}")


# ---------------------------------------------------------------------- bad input
BIG = (
    b"name: big\nimage: x\ncommand: [a]\nargs: ["
    + b"'aaaaaaaaaa'," * (5 * 1024 * 1024 // 13)
    + b"]\n"
)
BOMB = (
    b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    b"e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    b"g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nname: bomb\nimage: x\ncommand: [a]\n"
)


@pytest.mark.parametrize(
    ("body", "status", "field", "words"),
    [
        pytest.param(b"name: a\ncommand: [x]\n", 422, "image", "required",
                     id="a missing image is named"),
        pytest.param(f"name: a\nimage: {IMAGE}\ncommand: [x]\nresources: {{gpus: -1}}\n".encode(),
                     422, "resources.gpus", "at least 0", id="negative GPUs are refused"),
        pytest.param(f"name: a\nimage: {IMAGE}\ncommand: [x]\ngpu: 1\n".encode(), 422, "gpu",
                     "unknown field", id="an unknown field is named"),
        pytest.param(f"name: a\nimage: {IMAGE}\ncommand: [x]\nworkers: two\n".encode(), 422,
                     "workers", "whole number", id="a wrong type is named"),
        pytest.param(BOMB, 400, "", "alias", id="an alias bomb is refused"),
        pytest.param(BIG, 413, "", "limit", id="a 5 MiB body is refused naming the limit"),
        pytest.param(b"name: caf\xe9\nimage: x\ncommand: [a]\n", 400, "", "UTF-8",
                     id="non-UTF-8 input is refused"),
        pytest.param(f"name: a\nimage: {IMAGE}\ncommand: [x]\nretry: {{on: [NodeFailure]}}\n"
                     .encode(), 422, "retry.on", "unknown field",
                     id="on under retry stays the key on and is refused as unknown"),
    ],
)  # fmt: skip
async def test_invalid_specs_get_4xx_naming_the_field(
    env: Env, body: bytes, status: int, field: str, words: str
) -> None:
    """Each bad tau.yaml gets a 4xx whose error names the field or the limit."""
    got, answer = await env.submit(body)
    assert status == got, answer
    assert field == answer["error"]["field"]
    assert words.lower() in answer["error"]["message"].lower()


# ---------------------------------------------------------------------- RBAC
async def test_no_rbac_means_403_everywhere(env: Env) -> None:
    """A token without RBAC in the namespace gets 403 for submit, list, get and logs."""
    status, _ = await env.submit(job_spec("mine"))
    assert status == 201
    stranger = await make_token(env.api, env.namespace, "stranger", None)
    hdrs = {"Authorization": f"Bearer {stranger}"}
    status, body = await env.submit(job_spec("theirs"), token=stranger)
    assert (status, body["error"]["code"]) == (403, "Forbidden")
    base = f"{env.url}/v1/runs"
    for url, params in [
        (base, {"namespace": env.namespace}),
        (f"{base}/{env.namespace}/mine", {}),
        (f"{base}/{env.namespace}/mine/logs", {}),
    ]:
        async with env.http.get(url, headers=hdrs, params=params) as resp:
            assert resp.status == 403, (url, await resp.text())


# ---------------------------------------------------------------------- submit
async def test_submit_creates_a_suspended_queued_job(env: Env) -> None:
    """A submission answers 201 with the run Queued, and its Job already exists, suspended,
    labelled for Kueue, owned by the TauRun."""
    status, run = await env.submit(job_spec("one"))
    assert (status, run["phase"], run["attempt"]) == (201, "Queued", 1), run
    job = await read_job(env.api, env.namespace, "one-a1")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "TauRun"
    assert job["spec"]["backoffLimit"] == 0


async def test_same_name_is_a_conflict_unless_the_idempotency_key_matches(env: Env) -> None:
    """A second POST of a name is 409; with the first one's Idempotency-Key it is 200."""
    first, _ = await env.submit(job_spec("twice"), **{"Idempotency-Key": "k-1"})
    again, replay = await env.submit(job_spec("twice"), **{"Idempotency-Key": "k-1"})
    other, conflict = await env.submit(job_spec("twice"), **{"Idempotency-Key": "k-2"})
    plain, _ = await env.submit(job_spec("twice"))
    assert (first, again, other, plain) == (201, 200, 409, 409)
    assert replay["name"] == "twice"
    assert conflict["error"]["field"] == "name"


async def test_schema_and_client_are_served(env: Env) -> None:
    """The JSON Schema and the tau script are served without a token."""
    async with env.http.get(f"{env.url}/v1/schema/run") as resp:
        schema = await resp.json()
    assert "image" in schema["required"]
    async with env.http.get(f"{env.url}/tau") as resp:
        script = await resp.read()
    assert script == (pathlib.Path(__file__).parents[4] / "controller/assets/tau.py").read_bytes()


# ---------------------------------------------------------------------- quota
async def in_kueue_order(env: Env, *runs: str) -> list[str]:
    """The runs in the order Kueue queues their Workloads. Of one priority, as here, that is
    by creation time, in whole seconds, and then by UID: runs made within one second go in
    UID order, not in the order they were made (Kueue's `baseCompareFunc`; its visibility API,
    which the dev cluster's Kueue serves, lists them so)."""

    async def key(run: str) -> tuple[str, str, str]:
        wl = await support.eventually(
            lambda: kueue.workload_of(env.api, env.namespace, f"{run}-a1"),
            what=f"{run}'s Workload",
        )
        return (wl["metadata"]["creationTimestamp"], wl["metadata"]["uid"], run)

    return [run for *_, run in sorted([await key(run) for run in runs])]


async def test_over_quota_stays_queued_with_position_and_reason(env: Env) -> None:
    """With the quota taken, later runs stay Queued with their place in line and why."""
    assert (await env.submit(job_spec("big", gpus=8)))[0] == 201
    await env.wait_phase("big", "Admitted", "Running")
    assert (await env.submit(job_spec("second", gpus=4)))[0] == 201
    assert (await env.submit(job_spec("third", gpus=4)))[0] == 201
    first, then = await in_kueue_order(env, "second", "third")

    async def positions() -> tuple[dict[str, Any], dict[str, Any]]:
        ahead, behind = await env.run(first), await env.run(then)
        assert (ahead["queuePosition"], behind["queuePosition"]) == (0, 1), (ahead, behind)
        assert "waiting for quota" in behind["message"], behind["message"]
        return ahead, behind

    _, behind = await support.eventually(positions, what="queue positions")
    assert behind["phase"] == "Queued"
    assert behind["queuePositionSource"] in {"visibility", "computed"}
    if cluster.Cluster().operators_in_chart:  # Kueue in a pod serves its visibility API
        assert behind["queuePositionSource"] == "visibility"
    assert "waiting for quota" in behind["message"]
    assert "1 run is ahead of it" in behind["message"]
    status, queues = await env.get("/v1/queues", namespace=env.namespace)
    assert status == 200
    (q,) = queues["items"]
    assert [w["name"] for w in q["waiting"]] == [first, then]


async def test_cancel_frees_quota_for_the_run_behind(env: Env) -> None:
    """Cancelling the run that holds the quota lets the queued one in; the TauRun stays."""
    assert (await env.submit(job_spec("holder", gpus=8)))[0] == 201
    await env.wait_phase("holder", "Admitted", "Running")
    assert (await env.submit(job_spec("waiter", gpus=8)))[0] == 201
    await env.wait_phase("waiter", "Queued")
    async with env.http.delete(
        f"{env.url}/v1/runs/{env.namespace}/holder", headers=env.headers()
    ) as resp:
        body = await resp.json()
        assert (resp.status, body["phase"]) == (200, "Cancelled"), body
    await env.wait_phase("waiter", "Admitted", "Running")
    assert (await env.run("holder"))["phase"] == "Cancelled"

    async def job_gone() -> None:
        jobs = await client.BatchV1Api(env.api).list_namespaced_job(env.namespace)
        names = [j.metadata.name for j in jobs.items if not j.metadata.deletion_timestamp]
        assert "holder-a1" not in names, names

    await support.eventually(job_gone, what="the cancelled Job to go")


# ---------------------------------------------------------------------- checkpoints
TAU = pathlib.Path(__file__).parents[4] / "controller/assets/tau.py"


async def tau(env: Env, token: str, run: str, attempt: int, *argv: str) -> tuple[int, str]:
    """Run the `tau` client the way a run's pod does: everything from TAU_* variables."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), *argv,
        env={"TAU_URL": env.url, "TAU_TOKEN": token, "TAU_NAMESPACE": env.namespace,
             "TAU_RUN": run, "TAU_ATTEMPT": str(attempt), "PATH": os.environ["PATH"]},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode()


async def report(env: Env, token: str, run: str, body: Any) -> tuple[int, dict[str, Any]]:
    """POST a checkpoint report with a given token."""
    async with env.http.post(
        f"{env.url}/v1/runs/{env.namespace}/{run}/checkpoints", json=body,
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:  # fmt: skip
        return resp.status, await resp.json()


async def test_a_run_token_reports_checkpoints_for_its_own_run_only(env: Env) -> None:
    """`tau checkpoint` inside a run is recorded in the status and in the mounted file;
    the same token is refused (403) for another run, and bad reports name their field."""
    for name in ("mine", "theirs"):
        status, _ = await env.submit(job_spec(name, checkpoint={"dir": "/c"}))
        assert status == 201
    token = await runskit.run_token(env.api, env.namespace, "mine")

    code, out = await tau(env, token, "mine", 1, "checkpoint", "--step", "100", "--path", "/c/100")
    assert code == 0, out
    code, out = await tau(env, token, "mine", 1, "checkpoint", "latest", "--path-only")
    assert (code, out.strip()) == (0, "/c/100")
    cm = await client.CoreV1Api(env.api).read_namespaced_config_map("mine-checkpoint",
                                                                    env.namespace)  # fmt: skip
    assert cm.data["latest"] == "/c/100"
    assert [c["step"] for c in (await env.run("mine"))["checkpoints"]] == [100]

    status, body = await report(env, token, "theirs", {"attempt": 1, "step": 1, "path": "/x"})
    assert (status, body["error"]["code"]) == (403, "Forbidden"), body
    code, out = await tau(env, token, "theirs", 1, "checkpoint", "--step", "1", "--path", "/x")
    assert code == 4, out
    assert (await env.run("theirs"))["checkpoints"] == []

    status, body = await report(env, token, "mine", {"attempt": 1, "step": -5, "path": "/x"})
    assert (status, body["error"]["field"]) == (422, "step"), body


async def test_only_a_pods_own_run_token_reports_for_its_run(env: Env) -> None:
    """The run audience alone is not enough: a token of it bound to no pod, or to a pod that
    is not a run's, is refused (403 naming Authorization); the same pod's token for the API
    server's audience is a Kubernetes identity like any other, which RBAC refuses here; the
    pod's own run token is taken."""
    assert (await env.submit(job_spec("own", checkpoint={"dir": "/c"})))[0] == 201
    core = client.CoreV1Api(env.api)
    good = await runskit.run_token(env.api, env.namespace, "own")
    pod = (await core.list_namespaced_pod(env.namespace, label_selector="taugrid.dev/run=own")
           ).items[0]  # fmt: skip
    bound = {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name, "uid": pod.metadata.uid}

    async def minted(audiences: list[str], bind: bool) -> str:
        spec: dict[str, Any] = {"audiences": audiences, "expirationSeconds": 3600}
        if bind:
            spec["boundObjectRef"] = bound
        tr = await core.create_namespaced_service_account_token(
            "default", env.namespace, {"spec": spec}
        )
        return str(tr.status.token)

    stray = await core.create_namespaced_pod(env.namespace, {
        "metadata": {"name": "stray", "labels": {"app": "stray"}},
        "spec": {"containers": [{"name": "c", "image": IMAGE}],
                 "nodeSelector": {"taugrid.dev/nowhere": "true"}},
    })  # fmt: skip
    stray_token = await core.create_namespaced_service_account_token(
        "default", env.namespace, {"spec": {"audiences": [runskit.RUN_AUDIENCE],
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "stray",
                           "uid": stray.metadata.uid}}},
    )  # fmt: skip
    body = {"attempt": 1, "step": 10, "path": "/c/10"}
    cases = {
        "unbound": await minted([runskit.RUN_AUDIENCE], bind=False),
        "stray pod": str(stray_token.status.token),
        "API audience": await minted(["https://kubernetes.default.svc.cluster.local"], bind=True),
        "own": good,
    }
    actual = {}
    for case, token in cases.items():
        status, answer = await report(env, token, "own", body)
        actual[case] = (status, (answer.get("error") or {}).get("field"))
    expected = {
        "unbound": (403, "Authorization"),
        "stray pod": (403, "Authorization"),
        "API audience": (403, ""),
        "own": (201, None),
    }
    assert expected == actual


async def test_a_look_alike_pod_with_the_runs_labels_is_not_the_run(env: Env) -> None:
    """Review 3, finding 10: a pod somebody makes in the run's namespace with the run's
    labels, bare or owned by the TauRun itself (its real UID), is not the attempt Job's pod:
    its run token is refused (403 naming Authorization) and nothing it reports is kept; the
    run's own pod's token is taken."""
    assert (await env.submit(job_spec("real", checkpoint={"dir": "/c"})))[0] == 201
    core = client.CoreV1Api(env.api)
    good = await runskit.run_token(env.api, env.namespace, "real")
    run = await client.CustomObjectsApi(env.api).get_namespaced_custom_object(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns", "real"
    )
    by_run = [{"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun", "name": "real",
               "uid": run["metadata"]["uid"], "controller": True}]  # fmt: skip
    labels = {"taugrid.dev/run": "real", "taugrid.dev/attempt": "1"}

    async def look_alike(name: str, owners: list[dict[str, Any]]) -> str:
        pod = await core.create_namespaced_pod(env.namespace, {
            "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "image": IMAGE}],
                     "nodeSelector": {"taugrid.dev/nowhere": "true"}},
        })  # fmt: skip
        tr = await core.create_namespaced_service_account_token(
            "default", env.namespace, {"spec": {"audiences": [runskit.RUN_AUDIENCE],
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name,
                               "uid": pod.metadata.uid}}},
        )  # fmt: skip
        return str(tr.status.token)

    cases = {
        "labels only": await look_alike("real-a1-fake", []),
        "owned by the TauRun": await look_alike("real-a1-fake2", by_run),
    }
    actual = {}
    for case, token in cases.items():
        status, answer = await report(env, token, "real", {"attempt": 1, "step": 7, "path": "/c/7"})
        actual[case] = (status, (answer.get("error") or {}).get("field"))
    assert actual == dict.fromkeys(cases, (403, "Authorization"))
    assert (await env.run("real"))["checkpoints"] == []
    status, _ = await report(env, good, "real", {"attempt": 1, "step": 8, "path": "/c/8"})
    assert status == 201
    assert [c["step"] for c in (await env.run("real"))["checkpoints"]] == [8]


async def test_a_stale_attempt_cannot_report_after_a_resume(env: Env) -> None:
    """Cancel, then resume by hand from a named checkpoint: attempt 2 starts from it, and
    attempt 1's late report is refused (409) while attempt 2's is taken."""
    status, _ = await env.submit(job_spec("again", checkpoint={"dir": "/c"}))
    assert status == 201
    token = await runskit.run_token(env.api, env.namespace, "again")
    assert (await report(env, token, "again", {"attempt": 1, "step": 100, "path": "/c/100"}))[
        0
    ] == 201
    async with env.http.post(f"{env.url}/v1/runs/{env.namespace}/again/resume",
                             headers=env.headers()) as resp:  # fmt: skip
        assert resp.status == 409, await resp.text()  # still queued: nothing to resume
    async with env.http.delete(f"{env.url}/v1/runs/{env.namespace}/again",
                               headers=env.headers()) as resp:  # fmt: skip
        assert resp.status == 200
    resume = f"{env.url}/v1/runs/{env.namespace}/again/resume"
    async with env.http.post(resume, json={"checkpoint": "/c/50"}, headers=env.headers()) as resp:
        run = await resp.json()
        assert resp.status == 200, run
    assert (run["phase"], run["attempt"]) == ("Queued", 2)
    job = await read_job(env.api, env.namespace, "again-a2")
    env_vars = {e["name"]: e.get("value") for e in
                job["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert (env_vars["TAU_RESUME_FROM"], env_vars["TAU_ATTEMPT"]) == ("/c/50", "2")

    # Attempt 1's pod reporting late: refused whichever comes first, the reconciler's fence
    # (409 StaleAttempt, while the review and the pod's mapping are cached) or the token's
    # death with its pod (401/403).
    status, body = await report(env, token, "again", {"attempt": 1, "step": 150, "path": "/late"})
    assert status in (401, 403, 409), body
    second = await runskit.run_token(env.api, env.namespace, "again", attempt=2)
    status, body = await report(env, second, "again", {"attempt": 1, "step": 150, "path": "/x"})
    assert (status, body["error"]["field"]) == (403, "attempt"), body
    status, _ = await report(env, second, "again", {"attempt": 2, "step": 200, "path": "/c/200"})
    assert status == 201
    latest = await env.get(f"/v1/runs/{env.namespace}/again/checkpoints/latest")
    assert latest == (200, {"attempt": 2, "step": 200, "path": "/c/200",
                            "time": latest[1]["time"]})  # fmt: skip


async def test_a_name_somebody_elses_object_holds_is_refused_and_that_object_kept(
    env: Env,
) -> None:
    """Review M4 on the real API server: a ConfigMap `<run>-checkpoint` made by someone else
    makes the submission 409 NameTaken naming it, before anything is created (to a caller
    who may get ConfigMaps there: review 3, finding 10); a TauRun made with kubectl past the
    API (no pre-check) ends Failed NameTaken; the ConfigMap's data is untouched either way."""
    core = client.CoreV1Api(env.api)
    theirs = {"metadata": {"name": "taken-checkpoint"}, "data": {"latest": "mine, not yours"}}
    await core.create_namespaced_config_map(env.namespace, theirs)
    rules = [*RESEARCHER_RULES, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    reader = await make_token(env.api, env.namespace, "reader", rules)
    status, body = await env.submit(job_spec("taken"), token=reader)
    runs = await client.CustomObjectsApi(env.api).list_namespaced_custom_object(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns"
    )
    expected: tuple[int, str, str, bool, list[Any]] = (409, "NameTaken", "name", True, [])
    actual = (status, body["error"]["code"], body["error"]["field"],
              "taken-checkpoint" in body["error"]["message"], runs["items"])  # fmt: skip
    assert expected == actual

    manifest = {
        "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
        "metadata": {"name": "taken", "namespace": env.namespace,
                     "annotations": {"taugrid.dev/managed-by": f"test/{env.namespace}"}},
        "spec": specs.spec_to_wire(specs.validate_spec(job_spec("taken")).spec),
    }  # fmt: skip
    await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns", manifest
    )
    run = await env.wait_phase("taken", "Failed")
    kept = await core.read_namespaced_config_map("taken-checkpoint", env.namespace)
    expected_end = ("NameTaken", {"latest": "mine, not yours"}, None)
    actual_end = (run["reason"], kept.data, kept.metadata.owner_references)
    assert expected_end == actual_end


async def test_a_namespace_this_install_does_not_run_work_in_is_refused(
    dev_cluster: cluster.Cluster, k8s: client.ApiClient, namespace: str
) -> None:
    """With `run_namespaces` set (the chart grants the controller run rights only there), a
    submission to any other namespace is 403 NamespaceNotServed and creates no TauRun."""
    token = await make_token(k8s, namespace, "researcher", RESEARCHER_RULES)
    ctl = await controllerkit.start_controller(
        dev_cluster.kubeconfig, namespace, run_namespaces=("team-elsewhere",),
        run_manager=f"test/{namespace}",
    )  # fmt: skip
    try:
        await controllerkit.wait_leader(ctl)
        async with aiohttp.ClientSession() as http:
            env = Env(ctl.url, namespace, token, http, k8s, ctl)
            status, body = await env.submit(job_spec("elsewhere"))
        runs = await client.CustomObjectsApi(k8s).list_namespaced_custom_object(
            "taugrid.dev", "v1alpha1", namespace, "tauruns"
        )
    finally:
        await ctl.stop()
    expected: tuple[int, str, str, list[Any]] = (403, "NamespaceNotServed", "namespace", [])
    actual = (status, body["error"]["code"], body["error"]["field"], runs["items"])
    assert expected == actual


# ---------------------------------------------------------------------- secrets into runs
SECRET_VALUE = "hf_s3cr3t-never-stored"


async def test_secret_env_needs_get_on_the_secret_and_stores_only_its_name(env: Env) -> None:
    """Issue 30: `secretEnv` is refused (403 naming the variable) when the caller may not
    `get` the Secret; allowed, the run, its Job and its evidence carry the Secret's name and
    key, never its value."""
    core = client.CoreV1Api(env.api)
    for name in ("readable", "hidden"):
        await core.create_namespaced_secret(
            env.namespace, {"metadata": {"name": name}, "stringData": {"token": SECRET_VALUE}}
        )
    rules = [*RESEARCHER_RULES, {"apiGroups": [""], "resources": ["secrets"],
                                 "resourceNames": ["readable"], "verbs": ["get"]}]  # fmt: skip
    token = await make_token(env.api, env.namespace, "reader", rules)

    def spec(name: str, secret: str) -> dict[str, Any]:
        return job_spec(name, secretEnv={"HF_TOKEN": {"secret": secret, "key": "token"}})

    refused, answer = await env.submit(spec("theirs", "hidden"), token=token)
    created, run = await env.submit(spec("mine", "readable"), token=token)
    assert (refused, answer["error"]["field"], created) == (403, "secretEnv.HF_TOKEN", 201), (
        answer, run,
    )  # fmt: skip
    job = await read_job(env.api, env.namespace, "mine-a1")
    (ref,) = [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "HF_TOKEN"]  # fmt: skip
    taurun = await client.CustomObjectsApi(env.api).get_namespaced_custom_object(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns", "mine"
    )
    _, evidence = await env.get(f"/v1/runs/{env.namespace}/mine/evidence")
    stored = [str(taurun), str(job), str(evidence), str(run)]
    expected = ({"secretKeyRef": {"name": "readable", "key": "token"}}, [False] * 4)
    assert expected == (ref["valueFrom"], [SECRET_VALUE in s for s in stored])
