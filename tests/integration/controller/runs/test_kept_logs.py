"""Logs kept as evidence, against the local control plane: KWOK serves a worker's log from a
file (as a kubelet serves a container's), the controller keeps its tail in a TauRunLog while
it runs and when the attempt ends, and serves it once the pod is gone, to exactly whoever may
read pods/log in the namespace."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller.runs import context as runs_context
from devcluster import cluster
from tests import support
from tests.integration.controller.runs.test_runs_api import TAU
from tests.runskit import IMAGE, Env, job_spec, make_token

pytestmark = pytest.mark.cluster

KWOK_LOGS = ("kwok.x-k8s.io", "v1alpha1")
TAURUNLOG = ("taugrid.dev", "v1alpha1")


async def the_pod(env: Env, run: str) -> dict[str, Any]:
    """The run's first pod, once it is bound to a node and running."""

    async def probe() -> dict[str, Any]:
        resp = await client.CoreV1Api(env.api).list_namespaced_pod(
            env.namespace, label_selector=f"taugrid.dev/run={run}", _preload_content=False
        )
        pods = [p for p in (await resp.json())["items"] if p["status"].get("phase") == "Running"]
        assert pods, "no running pod yet"
        return dict(pods[0])

    return await support.eventually(probe, what=f"a running pod of {run}")


async def serve_log(env: Env, dev: cluster.Cluster, pod: str, *lines: str) -> None:
    """Make KWOK serve these lines as the pod's container log."""
    with cluster.pod_log_file(dev, env.namespace, pod, "main") as path:
        cluster.append_log(path, *(cluster.cri_log_line(line) for line in lines))
        await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
            *KWOK_LOGS, env.namespace, "logs", cluster.kwok_logs_object(env.namespace, pod, "main",
                                                                         path),
        )  # fmt: skip


async def kept(env: Env, name: str) -> dict[str, Any]:
    """A TauRunLog (404 is "not yet")."""

    async def read() -> dict[str, Any]:
        return dict(await client.CustomObjectsApi(env.api).get_namespaced_custom_object(
            *TAURUNLOG, env.namespace, "taurunlogs", name))  # fmt: skip

    return await support.eventually(support.not_found_is_not_yet(read), what=f"TauRunLog {name}")


async def tau_logs(env: Env, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(TAU), "logs", *argv,
        env={"TAU_URL": env.url, "TAU_TOKEN": env.token, "TAU_NAMESPACE": env.namespace,
             "PATH": os.environ["PATH"]},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    return int(proc.returncode or 0), out.decode(), err.decode()


@pytest.mark.controller(run_log_capture_interval_s=0.5, run_log_keep_kib=1,
                        run_pod_annotations={"kwok.taugrid.dev/run-for": "6s"})  # fmt: skip
async def test_a_workers_tail_outlives_its_pod(env: Env, dev_cluster: cluster.Cluster) -> None:
    """While the worker runs its tail is kept (the last 1 KiB of 2000 lines); when the run
    ends it is kept complete; with the pod deleted, `tau logs --attempt 1` prints the kept
    tail and says so on stderr."""
    assert (await env.submit(job_spec("evid")))[0] == 201
    pod = (await the_pod(env, "evid"))["metadata"]["name"]
    await serve_log(
        env, dev_cluster, pod, *(f"step {i} loss {1 / (i + 1):.4f}" for i in range(2000))
    )

    async def running_tail() -> dict[str, Any]:
        obj = await kept(env, "evid-a1-w0")
        assert "step 1999 " in obj["spec"]["log"], obj["spec"]["log"][-80:]
        return obj

    obj = await support.eventually(running_tail, what="the running worker's tail kept")
    assert (obj["spec"]["truncated"], obj["spec"]["bytes"] <= 1024) == (True, True)
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "TauRun"
    await env.wait_phase("evid", "Succeeded")

    async def complete() -> None:
        assert (await kept(env, "evid-a1-w0"))["spec"]["complete"] is True

    await support.eventually(complete, what="the tail kept complete at the end")
    core = client.CoreV1Api(env.api)
    await core.delete_namespaced_pod(pod, env.namespace, grace_period_seconds=0)

    async def gone() -> None:
        pods = await core.list_namespaced_pod(env.namespace, label_selector="taugrid.dev/run=evid")
        assert not pods.items, [p.metadata.name for p in pods.items]

    await support.eventually(gone, what="the pod gone")
    code, out, err = await tau_logs(env, "evid", "--attempt", "1")
    assert code == 0, err
    assert out.endswith("step 1999 loss 0.0005\n"), out[-80:]
    assert "is gone; this is the kept tail of its log (complete" in err, err
    async with env.http.get(f"{env.url}/v1/runs/{env.namespace}/evid/logs",
                            headers=env.headers(), params={"attempt": "1"}) as resp:  # fmt: skip
        assert (resp.status, resp.headers["X-TauGrid-Log-Source"]) == (200, "kept")
    status, evidence = await env.get(f"/v1/runs/{env.namespace}/evid/evidence")
    assert status == 200
    assert [(k["attempt"], k["worker"], k["complete"]) for k in evidence["keptLogs"]] == [
        (1, 0, True)
    ]


@pytest.mark.controller(run_log_capture_interval_s=0.5)
async def test_kept_logs_need_pods_log_and_are_never_someone_elses(
    env: Env, dev_cluster: cluster.Cluster
) -> None:
    """Reading a kept log needs `get pods/log` in the namespace, exactly like live logs (a
    token that may read runs but not pod logs gets 403); a TauRunLog of that name that is
    not the run's own is left alone, and not served as its log (409 naming it)."""
    assert (await env.submit(job_spec("other")))[0] == 201
    rules = [{"apiGroups": ["taugrid.dev"], "resources": ["tauruns"], "verbs": ["get", "list"]}]
    reader = await make_token(env.api, env.namespace, "runs-only", rules)
    async with env.http.get(f"{env.url}/v1/runs/{env.namespace}/other/logs",
                            headers={"Authorization": f"Bearer {reader}"},
                            params={"kept": "true"}) as resp:  # fmt: skip
        assert resp.status == 403, await resp.text()
    foreign = {
        "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRunLog",
        "metadata": {"name": "other-a1-w0", "namespace": env.namespace},
        "spec": {"run": "other", "attempt": 1, "worker": 0, "log": "planted\n"},
    }  # fmt: skip
    await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
        *TAURUNLOG, env.namespace, "taurunlogs", foreign
    )
    async with env.http.get(f"{env.url}/v1/runs/{env.namespace}/other/logs",
                            headers=env.headers(), params={"kept": "true"}) as resp:  # fmt: skip
        body = await resp.json()
        assert (resp.status, body["error"]["code"]) == (409, "NotOurs"), body
        assert "other-a1-w0" in body["error"]["message"]
    pod = (await the_pod(env, "other"))["metadata"]["name"]
    await serve_log(env, dev_cluster, pod, "the run's own line")
    keeper = env.controller.app[runs_context.RUNS].keeper

    async def refused() -> None:
        assert keeper.refused >= 1, keeper.refused

    await support.eventually(refused, what="the keeper to refuse the planted TauRunLog")
    obj = await kept(env, "other-a1-w0")
    assert obj["spec"]["log"] == "planted\n"


@pytest.mark.controller(run_log_capture_interval_s=3600)
async def test_a_kept_log_is_served_only_as_the_controller_writes_it_and_never_breaks_headers(
    env: Env,
) -> None:
    """Review 3, finding 9: a TauRunLog that the run controls but that is not labelled as the
    controller labels its own is not served (409); once it is, a CR/LF planted in its pod
    name never reaches the `X-TauGrid-Pod` header (before: aiohttp refused it, a 500)."""
    assert (await env.submit(job_spec("forged")))[0] == 201
    custom = client.CustomObjectsApi(env.api)
    uid = (await custom.get_namespaced_custom_object(
        *TAURUNLOG, env.namespace, "tauruns", "forged"))["metadata"]["uid"]  # fmt: skip
    owner = {"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun", "name": "forged",
             "uid": uid, "controller": True}  # fmt: skip
    forged = {
        "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRunLog",
        "metadata": {"name": "forged-a1-w0", "namespace": env.namespace,
                     "ownerReferences": [owner]},
        "spec": {"run": "forged", "attempt": 1, "worker": 0, "pod": "p\r\nX-Evil: 1",
                 "container": "main", "complete": True, "log": "planted\n"},
    }  # fmt: skip
    await custom.create_namespaced_custom_object(*TAURUNLOG, env.namespace, "taurunlogs", forged)
    url = f"{env.url}/v1/runs/{env.namespace}/forged/logs"
    answers = []
    for labels in (None, {"taugrid.dev/run": "forged"}):
        if labels:
            await custom.patch_namespaced_custom_object(
                *TAURUNLOG, env.namespace, "taurunlogs", "forged-a1-w0",
                {"metadata": {"labels": labels}}, _content_type="application/merge-patch+json",
            )  # fmt: skip
        async with env.http.get(url, headers=env.headers(), params={"kept": "true"}) as resp:
            answers.append(
                (resp.status, resp.headers.get("X-TauGrid-Pod"), "X-Evil" in resp.headers)
            )
    expected = [(409, None, False), (200, "", False)]
    assert expected == answers


def decisions(env: Env) -> float:
    """How many times the reconciler's passes have looked at a run (decided or kept)."""
    registry = env.controller.app[runs_context.RUNS].reconciler.metrics.registry
    return sum(
        registry.get_sample_value("taugrid_run_decisions_total", {"kind": kind}) or 0.0
        for kind in ("decided", "kept")
    )


@pytest.mark.controller(run_log_capture_interval_s=0.5)
async def test_a_look_alike_pod_changes_neither_the_runs_status_nor_its_logs(
    env: Env, dev_cluster: cluster.Cluster
) -> None:
    """Review 3, finding 10: a pod somebody makes in the run's namespace with attempt 1's
    labels, controlled by the TauRun itself (its real UID), on the run pod's node, that
    ends Failed with exit 143 (what a lost GPU looks like) and serves a log, is not the
    run's: through passes after it failed the run stays Running with no exit code in its
    evidence, `GET …/logs` has no worker 1 (404 NoPod) and serves worker 0 from the run's
    own pod, and the keeper keeps the run's pod's log and never the look-alike's."""
    assert (await env.submit(job_spec("seen")))[0] == 201
    real = await the_pod(env, "seen")
    core = client.CoreV1Api(env.api)
    run = await client.CustomObjectsApi(env.api).get_namespaced_custom_object(
        *TAURUNLOG, env.namespace, "tauruns", "seen"
    )
    by_run = [{"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun", "name": "seen",
               "uid": run["metadata"]["uid"], "controller": True}]  # fmt: skip
    await core.create_namespaced_pod(env.namespace, {
        "metadata": {"name": "seen-a1-alike", "ownerReferences": by_run,
                     "labels": {"taugrid.dev/run": "seen", "taugrid.dev/attempt": "1"},
                     "annotations": {"kwok.taugrid.dev/run-for": "3s",
                                     "kwok.taugrid.dev/exit-code": "143"}},
        "spec": {"nodeName": real["spec"]["nodeName"], "restartPolicy": "Never",
                 "tolerations": real["spec"].get("tolerations") or [],
                 "containers": [{"name": "main", "image": IMAGE}]},
    })  # fmt: skip
    await serve_log(env, dev_cluster, "seen-a1-alike", "planted by a look-alike")

    async def failed() -> None:
        pod = await core.read_namespaced_pod("seen-a1-alike", env.namespace)
        assert pod.status.phase == "Failed", pod.status.phase

    await support.eventually(failed, what="the look-alike pod Failed")
    await serve_log(env, dev_cluster, real["metadata"]["name"], "the run's own line")

    async def kept_own() -> None:
        assert "the run's own line" in (await kept(env, "seen-a1-w0"))["spec"]["log"]

    await support.eventually(kept_own, what="the run pod's log kept as worker 0")
    seen_at = decisions(env)

    async def passes() -> None:
        assert decisions(env) >= seen_at + 3, (seen_at, decisions(env))

    await support.eventually(passes, what="three more looks at the run by the reconciler")
    status, body = await env.get(f"/v1/runs/{env.namespace}/seen")
    assert status == 200, body
    _, evidence = await env.get(f"/v1/runs/{env.namespace}/seen/evidence")
    url = f"{env.url}/v1/runs/{env.namespace}/seen/logs"
    served = []
    for worker in ("0", "1"):
        async with env.http.get(url, headers=env.headers(), params={"worker": worker}) as resp:
            text = await resp.text()
            served.append((resp.status, resp.headers.get("X-TauGrid-Pod"),
                           "the run's own line" in text, "look-alike" in text,
                           "NoPod" in text))  # fmt: skip
    logs = await client.CustomObjectsApi(env.api).list_namespaced_custom_object(
        *TAURUNLOG, env.namespace, "taurunlogs"
    )
    expected: tuple[Any, ...] = (
        ("Running", 1), [], [("seen-a1-w0", real["metadata"]["name"])],
        [(200, real["metadata"]["name"], True, False, False), (404, None, False, False, True)],
    )  # fmt: skip
    actual = (
        (body["phase"], body["attempt"]),
        [c for a in evidence["attempts"] for c in a.get("exitCodes") or []],
        sorted((k["metadata"]["name"], k["spec"]["pod"]) for k in logs["items"]),
        served,
    )
    assert expected == actual
