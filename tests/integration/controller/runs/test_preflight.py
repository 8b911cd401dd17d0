"""Pre-flight and "why it is not running" against the local control plane: a submission that
names what does not exist is refused before anything is created; a run admitted with pods
the real scheduler cannot place says why, and what Kueue will do with its quota."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller import marks
from tests import support
from tests.integration.controller.runs.test_runs_api import tau
from tests.runskit import RESEARCHER_RULES, Env, job_spec, make_token

pytestmark = pytest.mark.cluster

READER_RULES = [
    *RESEARCHER_RULES,
    {"apiGroups": [""], "resources": ["persistentvolumeclaims", "configmaps"],
     "verbs": ["get"]},
]  # fmt: skip
"""A researcher who may also read the namespace's claims and ConfigMaps: told what pre-flight
finds of them (review 3, finding 10; the researcher of `env` may read neither)."""


async def no_run(env: Env, name: str) -> None:
    status, body = await env.get(f"/v1/runs/{env.namespace}/{name}")
    assert status == 404, body


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        pytest.param({"queue": "nope"}, "queue", id="a queue that does not exist"),
        pytest.param({"volumes": [{"claim": "datasets", "mountPath": "/data"}]},
                     "volumes[0].claim", id="a claim that does not exist"),
        pytest.param({"checkpoint": {"dir": "/ckpt", "volume": "ckpts"}}, "checkpoint.volume",
                     id="a checkpoint claim that does not exist"),
        pytest.param({"priority": "no-such-class"}, "priority",
                     id="an allow-listed priority class that does not exist",
                     marks=pytest.mark.controller(allowed_priority_classes=("no-such-class",))),
    ],
)  # fmt: skip
async def test_what_does_not_exist_is_refused_before_anything_is_created(
    env: Env, extra: dict[str, Any], field: str
) -> None:
    """422 naming the field; no TauRun, no Job. (To a caller who may read the claims; the
    allow-list is public, so a class on it may be confirmed missing to anyone.)"""
    reader = await make_token(env.api, env.namespace, "reader", READER_RULES)
    status, body = await env.submit(job_spec("pre", **extra), token=reader)
    assert (status, body["error"]["field"], body["error"]["code"]) == (422, field, "Preflight")
    await no_run(env, "pre")
    jobs = await client.BatchV1Api(env.api).list_namespaced_job(env.namespace)
    assert jobs.items == []


async def claim(env: Env, name: str) -> None:
    """A claim no volume will ever bind (no provisioner, no matching volume): it stays Pending."""
    await client.CoreV1Api(env.api).create_namespaced_persistent_volume_claim(
        env.namespace,
        {"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
         "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}},
    )  # fmt: skip


@pytest.mark.controller(pods_ready_timeout_s=300)
async def test_an_unbound_claim_is_a_warning_and_the_admitted_run_says_why(env: Env) -> None:
    """The submission goes ahead with a warning; once Kueue admits it, the scheduler's
    reason is the run's message with Kueue's deadline, and `tau status` shows it. (Submitted
    by a caller who may read the claim: only they are told its phase.)"""
    await claim(env, "scratch")
    reader = await make_token(env.api, env.namespace, "reader", READER_RULES)
    status, body = await env.submit(
        job_spec("waits", volumes=[{"claim": "scratch", "mountPath": "/scratch"}]), token=reader
    )
    assert status == 201, body
    assert "claim 'scratch' (volumes[0].claim) is Pending, not Bound" in " ".join(body["warnings"])

    async def why() -> dict[str, Any]:
        run = await env.run("waits")
        assert "unbound immediate PersistentVolumeClaims" in run["message"], run["message"]
        return run

    await env.wait_phase("waits", "Admitted")
    run = await support.eventually(why, what="the run's message")
    assert "Kueue releases its 1 GPU and queues it again (waitForPodsReady, 5m)" in run["message"]
    code, out = await tau(env, env.token, "waits", 1, "status", "waits")
    assert code == 0, out
    assert "Message:" in out
    assert "unbound immediate PersistentVolumeClaims" in out


async def test_a_run_made_with_kubectl_names_the_missing_claim(env: Env) -> None:
    """A TauRun applied directly (no pre-flight) whose claim does not exist: the real
    scheduler's `persistentvolumeclaim "datasets" not found` becomes its message."""
    body = {
        "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
        "metadata": {"name": "direct", "namespace": env.namespace,
                     "annotations": {marks.MANAGED_BY_ANNOTATION: f"test/{env.namespace}"}},
        "spec": job_spec("direct", volumes=[{"claim": "datasets", "mountPath": "/data"}]),
    }  # fmt: skip
    await client.CustomObjectsApi(env.api).create_namespaced_custom_object(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns", body
    )

    async def why() -> dict[str, Any]:
        run = await env.run("direct")
        assert 'persistentvolumeclaim "datasets" not found' in run["message"], run["message"]
        return run

    run = await support.eventually(why, what="the run's message")
    assert run["phase"] == "Admitted"
    assert "nothing releases its 1 GPU while it waits" in run["message"]


async def dry_run(env: Env, spec: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    """`POST /v1/runs?dryRun=true` as `token`."""
    async with env.http.post(
        f"{env.url}/v1/runs", json=spec, headers={"Authorization": f"Bearer {token}"},
        params={"namespace": env.namespace, "dryRun": "true"},
    ) as resp:  # fmt: skip
        return resp.status, await resp.json()


def same_shape(body: dict[str, Any]) -> str:
    """A dry run's answer without the one part bound to differ between two calls made the
    same: the owner UID the API server's dry run hands out."""
    text = json.dumps(body, sort_keys=True)
    for obj in body.get("objects") or []:
        for ref in obj["metadata"].get("ownerReferences") or []:
            text = text.replace(ref["uid"], "UID")
    return text


async def test_a_caller_who_may_not_read_claims_or_configmaps_cannot_tell_them_from_missing(
    env: Env,
) -> None:
    """Review 3, finding 10 on the real API server: to the researcher of `env` (no `get` on
    claims or ConfigMaps), a dry run naming a claim, and needing a ConfigMap name, answers
    exactly the same (status and body) before and after somebody creates both; a real
    submission goes ahead (201, the same warnings) and ends Failed NameTaken. A caller who
    may read them is told: the claim's phase, 422 for a missing claim, 409 NameTaken."""
    core = client.CoreV1Api(env.api)
    there = job_spec("there", volumes=[{"claim": "held", "mountPath": "/d"}])
    absent = job_spec("absent", volumes=[{"claim": "never", "mountPath": "/d"}])

    status_absent, body_absent = await dry_run(env, there, env.token)
    await claim(env, "held")
    theirs = {"metadata": {"name": "there-checkpoint"}, "data": {"latest": "someone's"}}
    await core.create_namespaced_config_map(env.namespace, theirs)
    status_there, body_there = await dry_run(env, there, env.token)
    assert (status_there, same_shape(body_there)) == (status_absent, same_shape(body_absent))
    assert status_there == 200, body_there
    assert body_there["warnings"][1:] == [
        "claim 'held' (volumes[0].claim) was not checked: you may not get"
        " persistentvolumeclaims in " + env.namespace,
        "whether the names run 'there' needs are free (ConfigMap 'there-checkpoint',"
        " Job 'there-a1') was not checked: you may not get configmaps, jobs.batch in "
        + env.namespace + " (a run whose name is taken ends Failed NameTaken)",
    ]  # fmt: skip

    status, created = await env.submit(there)
    assert (status, created["warnings"]) == (201, body_there["warnings"]), created
    run = await env.wait_phase("there", "Failed")
    kept = await core.read_namespaced_config_map("there-checkpoint", env.namespace)
    assert (run["reason"], kept.data) == ("NameTaken", {"latest": "someone's"})

    reader = await make_token(env.api, env.namespace, "reader", READER_RULES)
    other = job_spec("other", volumes=[{"claim": "held", "mountPath": "/d"}])
    status, body = await dry_run(env, other, reader)
    assert status == 200, body
    assert any("claim 'held' (volumes[0].claim) is Pending, not Bound" in w
               for w in body["warnings"]), body["warnings"]  # fmt: skip
    status, body = await dry_run(env, absent, reader)
    assert (status, body["error"]["field"]) == (422, "volumes[0].claim"), body
    status, body = await dry_run(env, job_spec("there2", volumes=[]), reader)
    assert status == 200, body
    await core.create_namespaced_config_map(
        env.namespace, {"metadata": {"name": "there2-checkpoint"}}
    )
    status, body = await dry_run(env, job_spec("there2"), reader)
    assert (status, body["error"]["code"]) == (409, "NameTaken"), body


@contextlib.asynccontextmanager
async def priority_class(env: Env) -> AsyncIterator[str]:
    """A WorkloadPriorityClass of this test's own (cluster-scoped: deleted after)."""
    custom = client.CustomObjectsApi(env.api)
    name = f"{env.namespace}-tier"[:63]
    await custom.create_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
         "metadata": {"name": name}, "value": 10},
    )  # fmt: skip
    try:
        yield name
    finally:
        await custom.delete_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", name
        )


async def test_a_priority_class_off_the_allow_list_is_not_confirmed_to_who_may_not_read_it(
    env: Env,
) -> None:
    """A class before and after it exists, to a researcher who may not get
    WorkloadPriorityClasses (no allow-list): the same answer, not checked, never refused."""
    name = f"{env.namespace}-tier"[:63]
    status_absent, body_absent = await dry_run(env, job_spec("p", priority=name), env.token)
    async with priority_class(env) as tier:
        status_there, body_there = await dry_run(env, job_spec("p", priority=tier), env.token)
    assert (status_there, same_shape(body_there)) == (status_absent, same_shape(body_absent))
    assert status_there == 200, body_there
    assert f"priority {tier!r} was not checked: you may not get" in " ".join(body_there["warnings"])
