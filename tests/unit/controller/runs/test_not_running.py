"""Why an admitted run is not running, in words: from its pods' own status (the scheduler's
message, the kubelet's waiting reasons) and what Kueue's waitForPodsReady will do with the
quota it holds. Pod statuses are fixtures under tests/fixtures/pods (their README says which
are captured)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib

import pytest

from controller.runs import policy, positions, records, views
from tests.unit.controller.runs.builders import ADMITTED, T0, a_job, a_workload, cond
from tests.unit.controller.runs.test_policy import SETTINGS, run

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "pods"
MISSING_PVC = 'pod capture-missing-pvc cannot be scheduled: 0/4 nodes are available: persistentvolumeclaim "datasets" not found. not found'  # noqa: E501


def fixture(name: str) -> views.PodView:
    return views.parse_pod(json.loads((FIXTURES / f"{name}.json").read_text()))


def renamed(pod: views.PodView, name: str) -> views.PodView:
    return dataclasses.replace(pod, name=name)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([fixture("missing-pvc")], MISSING_PVC, id="a claim that does not exist"),
        pytest.param(
            [fixture("unbound-pvc")],
            "pod capture-unbound-pvc cannot be scheduled: 0/4 nodes are available: pod has unbound"
            " immediate PersistentVolumeClaims. not found", id="a claim bound to no volume",
        ),
        pytest.param(
            [fixture("image-pull-backoff")],
            'pod llama-ft-a1-0-7x2kq cannot pull its image: ImagePullBackOff: Back-off pulling'
            ' image "registry.example.com/llama:v2"', id="an image that cannot be pulled",
        ),
        pytest.param(
            [fixture("create-container-config-error")],
            "pod llama-ft-a1-1-q9w3n cannot start its container: CreateContainerConfigError:"
            " couldn't find key token in Secret team-a/wandb", id="a missing Secret key",
        ),
        pytest.param(
            [fixture("image-pull-backoff"), renamed(fixture("missing-pvc"), "w1"),
             renamed(fixture("missing-pvc"), "w2")],
            'pod w1 (and 1 more) cannot be scheduled: 0/4 nodes are available:'
            ' persistentvolumeclaim "datasets" not found. not found',
            id="the scheduler's word comes first and the others are counted",
        ),
        pytest.param([], "", id="no pods yet is not a problem of the pods"),
    ],
)  # fmt: skip
def test_why_pods_do_not_run(pods: list[views.PodView], expected: str) -> None:
    """The first cause found, in the order a person fixes them: placement, image, start."""
    assert expected == positions.pods_not_running(pods)


ADMITTED_AT = a_workload(*ADMITTED, cq="cq")
CTX = positions.WaitContext("q", "team", True, gpus_per_worker=8, workers=2)


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        pytest.param(
            dataclasses.replace(CTX, pods_ready_timeout_s=300.0, now=T0),
            f"admitted, but {MISSING_PVC}; unless its pods are ready by 2026-01-01T00:05:00Z,"
            " Kueue releases its 16 GPUs and queues it again (waitForPodsReady, 5m)",
            id="with waitForPodsReady: what Kueue will do, and when",
        ),
        pytest.param(
            dataclasses.replace(CTX, pods_ready_timeout_s=300.0, now=T0 + dt.timedelta(minutes=6)),
            f"admitted, but {MISSING_PVC}; its pods missed Kueue's waitForPodsReady deadline"
            " (2026-01-01T00:05:00Z): Kueue is releasing its 16 GPUs and queues it again",
            id="past the deadline: Kueue is about to act",
        ),
        pytest.param(
            CTX,
            f"admitted, but {MISSING_PVC}; nothing releases its 16 GPUs while it waits (the"
            " platform has not enabled Kueue's waitForPodsReady): fix it, or `tau cancel` the"
            " run",
            id="without waitForPodsReady: nothing frees the quota, and what to do",
        ),
    ],
)  # fmt: skip
def test_an_admitted_run_says_why_its_pods_do_not_run(
    ctx: positions.WaitContext, expected: str
) -> None:
    """The message names the pod's problem and the fate of the quota it holds."""
    assert expected == positions.admitted_message(ctx, ADMITTED_AT, [fixture("missing-pvc")])


def test_a_run_evicted_for_pods_not_ready_says_when_it_is_queued_again() -> None:
    """After Kueue's PodsReadyTimeout the run is Queued again; its message says what
    happened, what was last seen (kept on the attempt), and Kueue's requeue time."""
    workload = dataclasses.replace(
        a_workload(cond("QuotaReserved", "False"),
                   cond("Evicted", reason="PodsReadyTimeout", at=300,
                        message="Exceeded the PodsReady timeout team/job-demo-a1-x")),
        requeue_at=T0 + dt.timedelta(seconds=360), requeue_count=1,
    )  # fmt: skip
    ctx = dataclasses.replace(CTX, pods_ready_timeout_s=300.0, now=T0 + dt.timedelta(seconds=301),
                              not_ready="pod w0 cannot be scheduled: no")  # fmt: skip
    assert positions.waiting_message(ctx, workload) == (
        "Kueue released its quota at 2026-01-01T00:05:00Z: its pods were not ready within the"
        " waitForPodsReady timeout of 5m (last seen: pod w0 cannot be scheduled: no); it is"
        " queued again at 2026-01-01T00:06:00Z (backoff)"
    )
    deactivated = dataclasses.replace(
        a_workload(cond("Evicted", reason="Deactivated", message="The workload is deactivated"
                        " due to exceeding the maximum number of re-queuing retries"),
                   active=False),
        requeue_count=3,
    )  # fmt: skip
    assert positions.waiting_message(ctx, deactivated) == (
        "Kueue deactivated it after 3 tries: its pods were never ready within the"
        " waitForPodsReady timeout (last seen: pod w0 cannot be scheduled: no); fix the cause,"
        " then `tau cancel` and `tau resume` it"
    )


def test_the_decision_writes_why_and_keeps_it_on_the_attempt() -> None:
    """decide_run: an admitted attempt with an unschedulable pod gets the message, and its
    record keeps the cause for after Kueue takes the pods away."""
    settings = dataclasses.replace(SETTINGS, pods_ready_timeout_s=300.0)
    plan = policy.decide_run(
        run(attempt_object=a_job(), workload=ADMITTED_AT, pods=(fixture("missing-pvc"),)),
        settings, T0 + dt.timedelta(seconds=30),
    )  # fmt: skip
    assert plan.status.phase == records.Phase.ADMITTED
    assert plan.status.message.startswith(f"admitted, but {MISSING_PVC}; unless its pods")
    assert plan.status.attempts[-1].not_ready == MISSING_PVC
    evicted = a_workload(cond("QuotaReserved", "False"),
                         cond("Evicted", reason="PodsReadyTimeout", at=300))  # fmt: skip
    later = policy.decide_run(
        run(plan.status, attempt_object=a_job(suspended=True), workload=evicted), settings,
        T0 + dt.timedelta(seconds=301),
    )  # fmt: skip
    assert later.status.phase == records.Phase.QUEUED
    assert f"(last seen: {MISSING_PVC})" in later.status.message
