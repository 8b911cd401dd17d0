"""Pre-flight and "why it is not running" against the local control plane: a submission that
names what does not exist is refused before anything is created; a run admitted with pods
the real scheduler cannot place says why, and what Kueue will do with its quota."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from controller import marks
from tests import support
from tests.integration.controller.runs.test_runs_api import tau
from tests.runskit import Env, job_spec

pytestmark = pytest.mark.cluster


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
                     id="a priority class that does not exist"),
    ],
)  # fmt: skip
async def test_what_does_not_exist_is_refused_before_anything_is_created(
    env: Env, extra: dict[str, Any], field: str
) -> None:
    """422 naming the field; no TauRun, no Job."""
    status, body = await env.submit(job_spec("pre", **extra))
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
    reason is the run's message with Kueue's deadline, and `tau status` shows it."""
    await claim(env, "scratch")
    status, body = await env.submit(
        job_spec("waits", volumes=[{"claim": "scratch", "mountPath": "/scratch"}])
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
