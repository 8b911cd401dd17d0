"""Runs, computed: phase, failure class, queue position, waiting message, evidence."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from controller import marks, timestamps
from controller.runs import outcomes, policy, positions, records, retries, views
from shared import spec as specs
from tests.unit.controller.runs.builders import (
    ADMITTED,
    NODES,
    QUOTA_MSG,
    SPEC,
    T0,
    a_job,
    a_pod,
    a_rayjob,
    a_workload,
    cond,
    ts,
)


@pytest.mark.parametrize(
    ("obj", "workload", "pods", "expected"),
    [
        pytest.param(None, None, [], records.Phase.QUEUED, id="no object yet is queued"),
        pytest.param(
            a_job(suspended=True),
            None,
            [],
            records.Phase.QUEUED,
            id="a job without a workload is queued",
        ),
        pytest.param(
            a_job(suspended=True),
            a_workload(cond("QuotaReserved", "False", "Pending", "insufficient quota")),
            [],
            records.Phase.QUEUED,
            id="a workload without reserved quota is queued",
        ),
        pytest.param(
            a_job(),
            a_workload(*ADMITTED),
            [a_pod(phase="Pending")],
            records.Phase.ADMITTED,
            id="an admitted workload with pending pods is admitted",
        ),
        pytest.param(
            a_job(),
            a_workload(*ADMITTED, cond("PodsReady")),
            [],
            records.Phase.RUNNING,
            id="pods ready means running",
        ),
        pytest.param(
            a_job(),
            a_workload(*ADMITTED),
            [a_pod()],
            records.Phase.RUNNING,
            id="a running pod means running even before PodsReady",
        ),
        pytest.param(
            a_job(cond("Complete")),
            a_workload(*ADMITTED, cond("Finished")),
            [a_pod(phase="Succeeded", exit_code=0)],
            records.Phase.SUCCEEDED,
            id="a complete job succeeded",
        ),
        pytest.param(
            a_job(cond("Failed", reason="BackoffLimitExceeded")),
            a_workload(*ADMITTED),
            [a_pod(phase="Failed", exit_code=1)],
            records.Phase.FAILED,
            id="a failed job failed",
        ),
        pytest.param(
            a_job(),
            a_workload(*ADMITTED),
            [a_pod(phase="Failed", exit_code=2)],
            records.Phase.FAILED,
            id="a failed pod of an admitted job fails the attempt before the job controller does",
        ),
        pytest.param(
            a_job(suspended=True),
            a_workload(cond("Evicted", reason="Preempted"), cond("Requeued")),
            [a_pod(phase="Failed", exit_code=143, disruption="PreemptionByKueue")],
            records.Phase.QUEUED,
            id="kueue preemption suspends the job and is not a failure",
        ),
        pytest.param(
            a_rayjob("SUCCEEDED", "Complete"),
            a_workload(*ADMITTED),
            [],
            records.Phase.SUCCEEDED,
            id="a succeeded rayjob succeeded",
        ),
        pytest.param(
            a_rayjob("FAILED", "Failed", "AppFailed"),
            a_workload(*ADMITTED),
            [],
            records.Phase.FAILED,
            id="a failed rayjob failed",
        ),
        pytest.param(
            a_rayjob("RUNNING", "Running"),
            a_workload(*ADMITTED, cond("PodsReady")),
            [],
            records.Phase.RUNNING,
            id="a running rayjob with ready pods is running",
        ),
    ],
)
def test_attempt_phase(
    obj: views.AttemptObjectView | None,
    workload: views.WorkloadView | None,
    pods: list[views.PodView],
    expected: records.Phase,
) -> None:
    """The attempt's phase follows the Workload conditions, then the object and its pods."""
    assert expected == outcomes.attempt_outcome(obj, workload, pods, NODES).phase


@pytest.mark.parametrize(
    ("pods", "object_reason", "expected"),
    [
        pytest.param(
            [a_pod(phase="Failed", node="bad", exit_code=143, disruption="EvictionByEvictionAPI")],
            "",
            specs.FailureClass.NODE_FAILURE,
            id="a pod evicted from a node we quarantined is a node failure",
        ),
        pytest.param(
            [a_pod(phase="Failed", node="gone", exit_code=137)],
            "",
            specs.FailureClass.NODE_FAILURE,
            id="a pod whose node vanished is a node failure",
        ),
        pytest.param(
            [a_pod(phase="Failed", exit_code=143, disruption="DeletionByDeviceTaintManager")],
            "",
            specs.FailureClass.NODE_FAILURE,
            id="a pod deleted for a NoExecute device taint on its GPU is a node failure",
        ),
        pytest.param(
            [a_pod(phase="Failed", exit_code=143, disruption="EvictionByEvictionAPI")],
            "",
            specs.FailureClass.EVICTED,
            id="an eviction from a healthy node is evicted",
        ),
        pytest.param(
            [a_pod(phase="Failed", exit_code=137, reason="OOMKilled")],
            "",
            specs.FailureClass.OOM_KILLED,
            id="an OOM kill is OOMKilled",
        ),
        pytest.param(
            [a_pod(phase="Failed", exit_code=3, reason="Error")],
            "",
            specs.FailureClass.APP_ERROR,
            id="a non-zero exit code is an app error",
        ),
        pytest.param(
            [],
            "DeadlineExceeded",
            specs.FailureClass.TIMEOUT,
            id="a job deadline is a timeout",
        ),
        pytest.param(
            [],
            "",
            specs.FailureClass.UNKNOWN,
            id="a failure without evidence is unknown",
        ),
    ],
)
def test_failure_class(
    pods: list[views.PodView], object_reason: str, expected: specs.FailureClass
) -> None:
    """Infrastructure causes win over the application's exit code; no evidence is Unknown."""
    failure, message = outcomes.classify_failure(pods, NODES, object_reason=object_reason)
    assert expected == failure
    assert message


def test_failed_attempt_records_exit_codes_and_nodes() -> None:
    """A failed attempt carries its exit codes, nodes and class into the status record."""
    outcome = outcomes.attempt_outcome(
        a_job(), a_workload(*ADMITTED, cq="cq"), [a_pod(phase="Failed", exit_code=3)], NODES
    )
    record = outcomes.attempt_record(
        1, object_kind="Job", object_name="demo-a1", outcome=outcome,
        workload=a_workload(*ADMITTED, cq="cq"),
    )  # fmt: skip
    expected = {
        "number": 1, "objectKind": "Job", "objectName": "demo-a1", "phase": "Failed",
        "nodes": ["n0"], "exitCodes": [3], "startTime": ts(1), "endTime": ts(9),
        "failureClass": "AppError", "message": "pod demo-a1-abc exited with code 3",
        "workload": "job-demo-a1-x", "clusterQueue": "cq", "flavors": {"nvidia.com/gpu": "h100"},
    }  # fmt: skip
    assert expected == record.model_dump(mode="json", by_alias=True, exclude_defaults=True)


@pytest.mark.parametrize(
    ("workloads", "expected"),
    [
        pytest.param(
            [a_workload(name="a", created=1), a_workload(name="b", created=2)],
            {"a": (0, 0), "b": (1, 1)},
            id="equal priority goes by creation",
        ),
        pytest.param(
            [a_workload(name="a", created=1, uid="f0"), a_workload(name="b", created=1, uid="0f")],
            {"b": (0, 0), "a": (1, 1)},
            id="made in the same second: the smaller UID first, as Kueue orders them",
        ),
        pytest.param(
            [a_workload(name="a", created=1), a_workload(name="b", created=2, priority=10)],
            {"b": (0, 0), "a": (1, 1)},
            id="higher priority goes first",
        ),
        pytest.param(
            [
                a_workload(name="a", created=1),
                a_workload(name="b", created=2, queue="other"),
                a_workload(name="c", created=3),
            ],
            {"a": (0, 0), "b": (1, 0), "c": (2, 1)},
            id="local queue positions count only their own queue",
        ),
        pytest.param(
            [
                a_workload(cond("Evicted", reason="Preempted", at=50), name="a", created=1),
                a_workload(name="b", created=2),
            ],
            {"b": (0, 0), "a": (1, 1)},
            id="a requeued workload is ordered by its eviction",
        ),
        pytest.param(
            [a_workload(*ADMITTED, name="a", created=1), a_workload(name="b", created=2)],
            {"b": (0, 0)},
            id="admitted workloads are not pending",
        ),
        pytest.param(
            [a_workload(name="a", created=1, queue="nowhere")],
            {},
            id="a workload of an unknown queue has no position",
        ),
    ],
)
def test_computed_positions(
    workloads: list[views.WorkloadView], expected: dict[str, tuple[int, int]]
) -> None:
    """Positions follow Kueue's order: priority, then the queue-order timestamp, then UID."""
    mapping = {("team", "q"): "cq", ("team", "other"): "cq"}
    computed = positions.compute_positions(workloads, mapping)
    actual = {name: (p.in_cluster_queue, p.in_local_queue) for (_, name), p in computed.items()}
    assert expected == actual
    assert all(p.source == positions.PositionSource.COMPUTED for p in computed.values())


def test_a_workload_kueue_set_aside_waits_for_what_holds_back_the_one_ahead() -> None:
    """Kueue (from v0.18, `SchedulingEquivalenceHashing`) writes no QuotaReserved message on a
    Workload shaped like one ahead that did not fit: it waits for what that one waits for,
    the nearest message ahead in its ClusterQueue, whatever LocalQueue; a Workload with a
    message of its own, an admitted one and one of another ClusterQueue are left out."""
    quota = cond("QuotaReserved", "False", "Pending", QUOTA_MSG)
    workloads = [
        a_workload(quota, name="first", created=1),
        a_workload(name="second", created=2, queue="other"),
        a_workload(cond("QuotaReserved", "False", "Pending", "another reason"), name="third",
                   created=3),
        a_workload(name="fourth", created=4),
        a_workload(*ADMITTED, name="admitted", created=5),
        a_workload(name="elsewhere", created=6, queue="far"),
    ]  # fmt: skip
    mapping = {("team", "q"): "cq", ("team", "other"): "cq", ("team", "far"): "cq2"}
    reasons = positions.quota_reasons_ahead(workloads, mapping)
    assert reasons == {("team", "second"): QUOTA_MSG, ("team", "fourth"): "another reason"}
    ctx = positions.WaitContext(
        "other", "team", True, gpus_per_worker=8, reason_ahead=reasons[("team", "second")],
        position=positions.QueuePosition(1, 0, positions.PositionSource.COMPUTED),
    )  # fmt: skip
    assert positions.waiting_message(ctx, workloads[1]) == (
        "waiting for quota: queue 'other' has not enough free GPUs for the 8 GPUs this run asks"
        " for (8 more needed in flavor h100); 1 run is ahead of it"
    )


def test_position_from_visibility() -> None:
    """A visibility API answer is read as is, and says where it came from."""
    items = [
        {"metadata": {"name": "x", "namespace": "team"}, "positionInClusterQueue": 4,
         "positionInLocalQueue": 1},
    ]  # fmt: skip
    expected = positions.QueuePosition(4, 1, positions.PositionSource.VISIBILITY)
    assert expected == positions.position_from_visibility(items, "team", "x")
    assert positions.position_from_visibility(items, "team", "y") is None


@pytest.mark.parametrize(
    ("ctx", "workload", "expected"),
    [
        pytest.param(
            positions.WaitContext("q", "team", queue_exists=False),
            None,
            "queue 'q' does not exist in namespace team; set `queue:` to one that `tau queues`"
            " lists, or ask your platform team for one",
            id="a missing queue is named",
        ),
        pytest.param(
            positions.WaitContext(
                "q",
                "team",
                True,
                gpus_per_worker=8,
                position=positions.QueuePosition(2, 1, positions.PositionSource.COMPUTED),
            ),
            a_workload(cond("QuotaReserved", "False", "Pending", QUOTA_MSG)),
            "waiting for quota: queue 'q' has not enough free GPUs for the 8 GPUs this run asks"
            " for (8 more needed in flavor h100); 2 runs are ahead of it",
            id="missing quota is said in GPUs with the position",
        ),
        pytest.param(
            positions.WaitContext(
                "q",
                "team",
                True,
                gpus_per_worker=8,
                position=positions.QueuePosition(0, 0, positions.PositionSource.COMPUTED),
            ),
            a_workload(cond("QuotaReserved", "False", "Pending", QUOTA_MSG)),
            "waiting for quota: queue 'q' has not enough free GPUs for the 8 GPUs this run asks"
            " for (8 more needed in flavor h100); it is next in line",
            id="the first in line is told so",
        ),
        pytest.param(
            positions.WaitContext("q", "team", True),
            a_workload(
                cond(
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "couldn't assign flavors to pod set main: insufficient quota for"
                    " nvidia.com/gpu in flavor h100, request > maximum capacity"
                    " (16 > 8)",
                )
            ),
            "waiting forever unless the queue grows: it asks for 16 GPUs but queue 'q' can never"
            " give more than 8 (flavor h100)",
            id="a run larger than the queue is told it can never fit",
        ),
        pytest.param(
            positions.WaitContext("q", "team", True),
            dataclasses.replace(
                a_workload(cond("QuotaReserved"), cond("Admitted", "False")),
                admission_checks=(("taugrid-gpu-health", "Retry", "no healthy node"),),
            ),
            "quota reserved; waiting for admission checks (taugrid-gpu-health: no healthy node)",
            id="pending admission checks are named with their message",
        ),
        pytest.param(
            positions.WaitContext("q", "team", True),
            None,
            "submitted to queue 'q'; waiting for Kueue to pick it up",
            id="no workload yet says so",
        ),
    ],
)
def test_waiting_message(
    ctx: positions.WaitContext, workload: views.WorkloadView | None, expected: str
) -> None:
    """Why a run waits is said in words a researcher uses, with Kueue's numbers."""
    assert expected == positions.waiting_message(ctx, workload)


def test_evidence_names_where_and_what_ran() -> None:
    """Evidence holds the spec hash, image and ID, cluster queue, flavors and nodes."""
    pod = a_pod(phase="Succeeded", exit_code=0)
    workload = a_workload(*ADMITTED, cq="cq")
    outcome = outcomes.attempt_outcome(a_job(cond("Complete")), workload, [pod], NODES)
    record = outcomes.attempt_record(1, object_kind="Job", object_name="demo-a1", outcome=outcome,
                                 workload=workload)  # fmt: skip
    ev = outcomes.evidence(
        SPEC, "team", attempts=[record], pods=[pod], workload=workload
    ).model_dump(mode="json", by_alias=True, exclude_defaults=True)
    assert specs.spec_hash(SPEC) == ev["specHash"]
    assert SPEC.image == ev["image"]
    assert ev["imageID"] == "reg/train@sha256:abc"
    assert ev["kueue"] == {"localQueue": "q", "workload": "job-demo-a1-x", "clusterQueue": "cq",
            "flavors": {"nvidia.com/gpu": "h100"}}  # fmt: skip
    assert ev["nodes"] == ["n0"]
    assert ev["experiment"] == {"project": "p", "tags": []}


def test_evidence_keeps_what_its_sources_no_longer_show() -> None:
    """Once pods are gone, the image ID and flavors recorded earlier remain."""
    first = outcomes.evidence(SPEC, "team", attempts=[], pods=[a_pod(exit_code=0)],
                          workload=a_workload(*ADMITTED, cq="cq"))  # fmt: skip
    later = outcomes.evidence(SPEC, "team", attempts=[], pods=[], workload=None, previous=first)
    assert first.image_id == later.image_id
    assert later.kueue.cluster_queue == "cq"


@pytest.mark.parametrize(
    ("failure", "attempt", "expected"),
    [
        pytest.param(specs.FailureClass.NODE_FAILURE, 1, True, id="a node failure is retried"),
        pytest.param(specs.FailureClass.NODE_FAILURE, 3, False, id="not past maxAttempts"),
        pytest.param(specs.FailureClass.APP_ERROR, 1, False, id="an app error is not by default"),
        pytest.param(specs.FailureClass.UNKNOWN, 1, False, id="unknown is never retried"),
    ],
)
def test_should_retry(failure: specs.FailureClass, attempt: int, expected: bool) -> None:
    """Retry follows `retry.when` and `retry.maxAttempts` (default: NodeFailure, 3)."""
    assert expected == retries.should_retry(SPEC, failure, attempt)


def test_phase_conditions_keep_the_first_time_reached() -> None:
    """Reaching a phase again changes nothing; a new phase adds a condition."""
    conditions, changed = records.set_phase_condition((), records.Phase.QUEUED, "", "", T0)
    assert changed
    later = T0 + dt.timedelta(seconds=5)
    conditions, changed = records.set_phase_condition(
        conditions, records.Phase.QUEUED, "", "", later
    )
    assert not changed
    conditions, changed = records.set_phase_condition(
        conditions, records.Phase.ADMITTED, "Admitted", "", later
    )
    assert changed
    assert [("Queued", ts(0)), ("Admitted", ts(5))] == [
        (c.type, timestamps.rfc3339(c.last_transition_time)) for c in conditions
    ]


@pytest.mark.parametrize(
    ("ended", "ttl", "expected"),
    [
        pytest.param(None, 60.0, False, id="a run that has not ended keeps its objects"),
        pytest.param(T0, None, False, id="no ttl keeps them forever"),
        pytest.param(T0, 60.0, True, id="past the ttl they go"),
        pytest.param(T0, 600.0, False, id="within the ttl they stay"),
    ],
)
def test_ttl(ended: dt.datetime | None, ttl: float | None, expected: bool) -> None:
    """Finished runs' objects are deleted once the TTL has passed since they ended."""
    assert expected == policy.ttl_expired(ended, ttl, T0 + dt.timedelta(seconds=120))


def test_a_running_pod_on_a_node_whose_gpu_failed_ends_the_attempt() -> None:
    """The node was quarantined Failed: the attempt is a NodeFailure now, before eviction;
    a Degraded quarantine lets it run, and a suspended (preempted) Job is never failed."""
    by = marks.QUARANTINED_BY_ANNOTATION
    record = marks.QUARANTINE_ANNOTATION
    facts = views.node_facts([
        {"metadata": {"name": "dead", "annotations": {by: "t", record: '{"failed":true}'}}},
        {"metadata": {"name": "sick", "annotations": {by: "t", record: '{"x":1}'}}},
    ])  # fmt: skip
    assert (facts.failed, facts.quarantined) == (frozenset({"dead"}), frozenset({"dead", "sick"}))
    admitted = a_workload(cond("QuotaReserved"), cond("Admitted"), cq="cq")
    lost = outcomes.attempt_outcome(
        a_job(), admitted, [a_pod(node="dead"), a_pod(node="n0")], facts
    )
    assert (lost.phase, lost.failure_class) == (
        records.Phase.FAILED,
        specs.FailureClass.NODE_FAILURE,
    )
    assert "dead" in lost.message
    degraded = outcomes.attempt_outcome(a_job(), admitted, [a_pod(node="sick")], facts)
    assert degraded.phase == records.Phase.RUNNING
    preempted = outcomes.attempt_outcome(
        a_job(suspended=True), admitted, [a_pod(node="dead")], facts
    )
    assert preempted.phase != records.Phase.FAILED


@pytest.mark.parametrize(
    ("attempt", "budget_from", "expected"), [(2, 0, True), (3, 0, False), (3, 1, True)]
)
def test_a_manual_resume_grants_a_fresh_attempt_budget(
    attempt: int, budget_from: int, expected: bool
) -> None:
    """maxAttempts (3 by default) counts the attempts since the last manual resume."""
    node = specs.FailureClass.NODE_FAILURE
    assert retries.should_retry(SPEC, node, attempt, budget_from=budget_from) is expected


def test_the_backoff_doubles_per_retry_up_to_an_hour() -> None:
    """retry.backoff, 2x, 4x... capped; 0s stays 0 (a node failure resumes at once)."""
    spec = specs.parse_spec(
        b"name: d\nimage: i\ncommand: [x]\nretry: {when: [AppError], backoff: 30s}\n"
    ).spec
    assert [retries.retry_backoff_s(spec, n) for n in range(4)] == [30, 60, 120, 240]
    assert retries.retry_backoff_s(spec, 20) == retries.MAX_BACKOFF_S
    assert retries.retry_backoff_s(SPEC, 3) == 0


@pytest.mark.parametrize(
    ("priority", "failure", "expected"),
    [
        (None, "NodeFailure", "taugrid-resume"),
        (None, "Evicted", "taugrid-resume"),
        (None, "AppError", None),
        (None, "OOMKilled", None),
        ("high", "NodeFailure", None),
    ],
)
def test_only_infrastructure_failures_keep_their_place_in_line(
    priority: str | None, failure: str, expected: str | None
) -> None:
    """The resume class applies after NodeFailure/Evicted to runs without their own class."""
    spec = SPEC.model_copy(update={"priority": priority})
    assert retries.resume_priority_class(spec, failure, "taugrid-resume") == expected
    assert retries.resume_priority_class(spec, failure, "") is None


@pytest.mark.parametrize(
    ("phase", "words"),
    [("Failed", ""), ("Cancelled", ""), ("Running", "cancel it first"),
     ("Succeeded", "only a Failed or Cancelled run")],
)  # fmt: skip
def test_only_failed_or_cancelled_runs_resume_by_hand(phase: str, words: str) -> None:
    """A running run must be cancelled first; a succeeded one has nothing to resume."""
    refusal = policy.resume_refusal("demo", phase)
    assert (refusal == "") == (words == ""), refusal
    assert words in refusal


def test_a_reopened_status_forgets_its_end_and_counts_attempts_afresh() -> None:
    """End conditions turn False with who resumed; the original status is not touched."""
    ended: dict[str, Any] = {"phase": "Failed", "currentAttempt": 2, "endTime": ts(9),
             "objectsDeleted": True,
             "conditions": [cond("Queued"), cond("Failed", reason="AppError")]}  # fmt: skip
    before = records.read(ended)
    status = policy.reopened(before, by="ada", now=T0)
    failed = status.conditions[1]
    assert (failed.status, failed.reason, failed.message) == (
        "False", "Resumed", "resumed by ada",
    )  # fmt: skip
    assert status.conditions[0].status == "True"
    assert (status.attempt_budget_from, status.end_time, status.objects_deleted) == (
        2, None, None,
    )  # fmt: skip
    assert before.conditions[1].status == "True"


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        pytest.param(("bad",), specs.FailureClass.NODE_FAILURE,
                     id="pods gone from a node we quarantined: a node failure"),
        pytest.param(("gone",), specs.FailureClass.NODE_FAILURE,
                     id="pods gone with a node that vanished: a node failure"),
        pytest.param(("n0",), specs.FailureClass.UNKNOWN,
                     id="pods gone from a healthy node: still unknown"),
        pytest.param((), specs.FailureClass.UNKNOWN, id="no node recorded: unknown"),
    ],
)  # fmt: skip
def test_an_attempt_whose_pods_are_gone_is_judged_by_its_recorded_nodes(
    recorded: tuple[str, ...], expected: specs.FailureClass
) -> None:
    """A real kubelet removes an evicted pod within a second of its exit, before a pass may
    see it Failed, and the Job says only BackoffLimitExceeded: the nodes the attempt was
    recorded on decide, as its pod would have."""
    failure, message = outcomes.classify_failure(
        [], NODES, object_reason="BackoffLimitExceeded", recorded_nodes=recorded
    )
    assert expected == failure
    assert message


def test_a_failed_job_without_pods_on_a_quarantined_node_is_a_node_failure() -> None:
    """The reconciler's path: the Job failed, its pods are gone, the record names the node."""
    outcome = outcomes.attempt_outcome(
        a_job(cond("Failed", reason="BackoffLimitExceeded")),
        a_workload(*ADMITTED),
        [],
        NODES,
        recorded_nodes=["bad"],
    )
    assert outcome.failure_class == specs.FailureClass.NODE_FAILURE
