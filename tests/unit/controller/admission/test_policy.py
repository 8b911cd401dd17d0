"""The admission gate's pure decisions: node-by-node fit, health, fencing, and when to stay
silent (DESIGN.md section 7, "Admission gate")."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from controller import marks, timestamps
from controller.admission import entries, policy, views
from tests.unit.controller.fleet.fakes import T0, at

CHECK = "taugrid-gpu-health"
FLAVOR = "h100"
PRODUCT = {"nvidia.com/gpu.product": "H100"}
FLAVORS = {FLAVOR: views.Flavor(FLAVOR, node_labels=PRODUCT)}
GI = 2**30


def node(
    name: str,
    *,
    gpus: int = 8,
    used: int = 0,
    labels: dict[str, str] | None = None,
    **kwargs: Any,
) -> views.NodeCapacity:
    """A 96-CPU, 1 TiB node of the h100 flavor with `used` of its GPUs taken."""
    return views.NodeCapacity(
        name=name,
        allocatable=views.Resources(gpus, 96_000, 1024 * GI),
        used=views.Resources(used, 0, 0),
        labels=PRODUCT if labels is None else labels,
        **kwargs,
    )


def raw_workload(
    name: str = "wl",
    *,
    pod_sets: list[tuple[str, int, int]] | None = None,
    state: str = "Pending",
    message: str = "",
    conditions: tuple[str, ...] = ("QuotaReserved",),
    priority: int = 0,
    created: str = "2025-03-01T11:00:00Z",
    labels: dict[str, str] | None = None,
    cpu: str = "1",
    namespace: str = "ns",
    active: bool = True,
) -> dict[str, Any]:
    """A Workload with quota reserved in flavor h100 and our check in `state`; each pod set is
    (name, pods, GPUs per pod)."""
    sets = pod_sets if pod_sets is not None else [("main", 2, 8)]
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "7",
                     "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {
            "active": active,
            "priority": priority,
            "podSets": [
                {"name": ps, "count": count, "template": {
                    "metadata": {"labels": labels or {}},
                    "spec": {"containers": [{"name": "c", "resources": {
                        "requests": {"cpu": cpu, "memory": "1Gi"},
                        "limits": {"nvidia.com/gpu": str(g)}}}]}}}
                for ps, count, g in sets
            ],
        },
        "status": {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": ps, "count": count,
                 "flavors": {"nvidia.com/gpu": FLAVOR, "cpu": FLAVOR, "memory": FLAVOR}}
                for ps, count, _ in sets]},
            "admissionChecks": [{"name": CHECK, "state": state, "message": message,
                                 "lastTransitionTime": "2025-03-01T11:30:00Z"}],
        },
    }  # fmt: skip


def workload(**kwargs: Any) -> views.Workload:
    """Parse `raw_workload(**kwargs)`."""
    return views.parse_workload(raw_workload(**kwargs))


def pod(
    name: str,
    *,
    node_name: str = "",
    phase: str = "Running",
    run: str = "",
    attempt: int | None = None,
    gpus: int = 8,
    namespace: str = "ns",
    labels: dict[str, str] | None = None,
) -> views.PodUsage:
    """A pod, optionally of a run attempt."""
    all_labels = dict(labels or {})
    if run:
        all_labels[marks.RUN_LABEL] = run
    if attempt is not None:
        all_labels[marks.ATTEMPT_LABEL] = str(attempt)
    return views.PodUsage(namespace, name, node_name, views.Resources(gpus, 1000, GI), phase,
                           all_labels)  # fmt: skip


def decide(
    w: views.Workload,
    nodes: list[views.NodeCapacity],
    pods: list[views.PodUsage] | None = None,
    *,
    flavors: dict[str, views.Flavor] | None = None,
) -> policy.Decision | None:
    """`policy.decide` at T0 with a 15 s retry delay."""
    return policy.decide(w, nodes, flavors or FLAVORS, pods or [], T0, check=CHECK,
                         retry_after_s=15)  # fmt: skip


# ---------------------------------------------------------------- fit, node by node


def test_two_pods_of_eight_gpus_fit_on_two_nodes_with_eight_free_each() -> None:
    """2 × 8 GPUs is Ready when two healthy nodes each have 8 free GPUs, one pod on each."""
    decision = decide(workload(), [node("n0"), node("n1"), node("n2", used=4)])

    assert decision is not None
    assert decision.state == views.CheckState.READY
    assert sorted(n for n, _ in decision.placement) == ["n0", "n1"]
    assert decision.requeue_after_s is None
    assert decision.message == "fits on healthy nodes of flavor h100: n0, n1"


def test_a_flavor_total_of_sixteen_spread_four_four_eight_does_not_fit_two_pods_of_eight() -> None:
    """16 free GPUs in the flavor, spread 4 + 4 + 8, cannot hold two 8-GPU pods: Retry."""
    nodes = [node("n0", used=4), node("n1", used=4), node("n2")]

    decision = decide(workload(), nodes)

    assert decision is not None
    assert decision.state == views.CheckState.RETRY
    assert decision.message == (
        "needs 2 nodes with 8 free GPUs on healthy nodes of flavor h100;"
        " only 1 healthy node has them: n2"
    )


@pytest.mark.parametrize(
    ("sick", "why"),
    [
        pytest.param({"gpu_status": "False", "gpu_reason": "XidFallenOffBus"}, "XidFallenOffBus",
                     id="GPUHealthy False excludes a node and names its reason"),
        pytest.param({"gpu_status": "Unknown", "gpu_reason": "HeartbeatStale"},
                     "GPU health unknown (HeartbeatStale)",
                     id="GPUHealthy Unknown excludes a node"),
        pytest.param({"taints": (views.Taint("taugrid.dev/gpu-unhealthy", "", "NoSchedule"),)},
                     "tainted taugrid.dev/gpu-unhealthy", id="our taint excludes a node"),
        pytest.param({"unschedulable": True}, "cordoned", id="a cordoned node is excluded"),
        pytest.param({"ready": False}, "NotReady", id="a NotReady node is excluded"),
    ],
)  # fmt: skip
def test_unhealthy_or_unschedulable_nodes_do_not_count(sick: dict[str, Any], why: str) -> None:
    """A node that is not healthy and schedulable is not counted, and the message says why."""
    decision = decide(workload(), [node("n0"), node("n1", **sick)])

    assert decision is not None
    assert decision.state == views.CheckState.RETRY
    assert decision.message == (
        "needs 2 nodes with 8 free GPUs on healthy nodes of flavor h100;"
        f" only 1 healthy node has them: n0 (1 unhealthy: n1 {why})"
    )


def test_a_healthy_gpu_condition_is_healthy() -> None:
    """GPUHealthy True (or no condition at all) leaves a node in the count."""
    nodes = [node("n0", gpu_status="True", gpu_reason="Healthy"), node("n1")]

    decision = decide(workload(), nodes)

    assert decision is not None
    assert decision.state == views.CheckState.READY


def test_nodes_of_another_flavor_do_not_count() -> None:
    """Only nodes carrying the assigned flavor's labels hold its pods."""
    other = {"nvidia.com/gpu.product": "A100"}

    decision = decide(workload(), [node("n0"), node("n1", labels=other)])

    assert decision is not None
    assert decision.state == views.CheckState.RETRY
    assert "only 1 healthy node has them: n0" in decision.message
    assert "n1" not in decision.message


def test_no_node_of_the_flavor_at_all_is_said_plainly() -> None:
    """When no node carries the flavor's labels, the message says so."""
    decision = decide(workload(), [node("n0", labels={})])

    assert decision is not None
    assert decision.message == (
        "needs 2 nodes with 8 free GPUs on healthy nodes of flavor h100;"
        " no node matches the flavor's labels and the pod's selector"
    )


def test_a_taint_the_pods_do_not_tolerate_keeps_them_off_a_node() -> None:
    """A foreign NoSchedule taint excludes the node unless the flavor or pod tolerates it."""
    tainted = node("n1", taints=(views.Taint("dedicated", "infra", "NoSchedule"),))
    tolerating = {FLAVOR: dataclasses.replace(
        FLAVORS[FLAVOR], tolerations=(views.Toleration("dedicated", "Exists"),))}  # fmt: skip

    refused = decide(workload(), [node("n0"), tainted])
    tolerated = decide(workload(), [node("n0"), tainted], flavors=tolerating)

    assert refused is not None
    assert tolerated is not None
    assert (refused.state, tolerated.state) == (views.CheckState.RETRY, views.CheckState.READY)


def test_cpu_counts_too() -> None:
    """A pod asking for more CPU than a node has free does not fit there."""
    decision = decide(workload(pod_sets=[("main", 1, 0)], cpu="200"), [node("n0")])

    assert decision is not None
    assert decision.state == views.CheckState.RETRY
    assert decision.message.startswith("needs room for 1 pod of 200 CPU and 1Gi memory")


def test_largest_pods_go_first_on_the_tightest_node() -> None:
    """A 4-GPU pod listed first must not take the only node an 8-GPU pod fits on."""
    w = workload(pod_sets=[("small", 1, 4), ("big", 1, 8)])

    decision = decide(w, [node("n0"), node("n1", used=4)])

    assert decision is not None
    assert decision.state == views.CheckState.READY
    assert sorted(decision.placement) == [("n0", views.Resources(8, 1000, GI)),
                                          ("n1", views.Resources(4, 1000, GI))]  # fmt: skip


def test_several_pod_sets_name_the_one_that_does_not_fit() -> None:
    """With more than one pod set, the message names the pod set short of room."""
    w = workload(pod_sets=[("head", 1, 0), ("workers", 2, 8)])

    decision = decide(w, [node("n0")])

    assert decision is not None
    assert decision.message.startswith("pod set workers needs 2 nodes with 8 free GPUs")


def test_retry_carries_requeue_after_whole_seconds_and_changes_the_transition_time() -> None:
    """Retry sets requeueAfterSeconds (rounded up): without it Kueue retries at once."""
    decision = policy.decide(workload(), [node("n0")], FLAVORS, [], T0, check=CHECK,
                             retry_after_s=2.5)  # fmt: skip

    assert decision is not None
    body = entries.check_state_body(CHECK, decision, ["main"])
    assert body == {
        "name": CHECK,
        "state": "Retry",
        "message": decision.message,
        "lastTransitionTime": "2025-03-01T12:00:00Z",
        "requeueAfterSeconds": 3,
    }


# ---------------------------------------------------------------- when to write nothing


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"conditions": ("QuotaReserved", "Evicted")}, id="an Evicted Workload"),
        pytest.param({"conditions": ()}, id="a Workload without reserved quota"),
        pytest.param({"conditions": ("QuotaReserved", "Finished")}, id="a finished Workload"),
        pytest.param({"conditions": ("QuotaReserved", "Admitted")}, id="an admitted Workload"),
        pytest.param({"active": False}, id="a deactivated Workload"),
        pytest.param({"state": "Retry"}, id="a check Kueue has not acted on yet"),
        pytest.param({"state": "Rejected"}, id="a rejected check"),
        pytest.param({"state": "Ready"}, id="a check already Ready"),
    ],
)
def test_no_write_at_all(kwargs: dict[str, Any]) -> None:
    """Nothing is written where Retry would misfire (evicted, unreserved, finished) or where
    the check is not ours to change now; even though nothing fits here."""
    assert decide(workload(**kwargs), []) is None


def test_no_write_when_the_check_already_says_the_same() -> None:
    """A check already Pending with the same fencing message is left alone."""
    w = workload(labels={marks.RUN_LABEL: "r", marks.ATTEMPT_LABEL: "2"})
    first = decide(w, [node("n0"), node("n1")], [pod("r-a1-0", run="r", attempt=1)])
    assert first is not None

    again = workload(labels={marks.RUN_LABEL: "r", marks.ATTEMPT_LABEL: "2"},
                     message=first.message)  # fmt: skip

    assert decide(again, [node("n0"), node("n1")], [pod("r-a1-0", run="r", attempt=1)]) is None


def test_a_workload_our_check_does_not_list_is_not_ours() -> None:
    """A Workload without our entry in `status.admissionChecks` is left alone."""
    raw = raw_workload()
    raw["status"]["admissionChecks"][0]["name"] = "someone-else"

    assert decide(views.parse_workload(raw), [node("n0"), node("n1")]) is None


# ---------------------------------------------------------------- fencing


RUN_LABELS = {marks.RUN_LABEL: "train", marks.ATTEMPT_LABEL: "3"}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("train-a2-0", run="train", attempt=2, node_name="n9")],
                     "waiting for attempt 2's pods to end: train-a2-0",
                     id="a running pod of the previous attempt fences"),
        pytest.param([pod("train-a1-0", run="train", attempt=1, phase="Pending")],
                     "waiting for attempt 1's pods to end: train-a1-0",
                     id="a pending pod of an older attempt fences"),
        pytest.param([pod("train-a2-0", run="train", attempt=2, phase="Failed")], None,
                     id="an ended pod runs nothing and does not fence"),
        pytest.param([pod("train-a3-0", run="train", attempt=3)], None,
                     id="a pod of the same attempt does not fence"),
        pytest.param([pod("other-a1-0", run="other", attempt=1)], None,
                     id="a pod of another run does not fence"),
        pytest.param([pod("train-a1-0", run="train", attempt=1, namespace="elsewhere")], None,
                     id="a pod of a same-named run elsewhere does not fence"),
    ],
)  # fmt: skip
def test_fencing_waits_for_earlier_attempts(
    pods: list[views.PodUsage], expected: str | None
) -> None:
    """While pods of an earlier attempt still run, stay Pending (no Retry: they end within
    their grace period); otherwise decide on fit as usual."""
    decision = decide(workload(labels=RUN_LABELS), [node("n0"), node("n1")], pods)

    assert decision is not None
    if expected is None:
        assert decision.state == views.CheckState.READY
    else:
        assert (decision.state, decision.message) == (views.CheckState.PENDING, expected)
        assert decision.requeue_after_s is None
        assert decision.since is not None
        assert decision.since < T0  # still Pending: the transition time is kept


def test_the_owner_labels_name_the_run_and_attempt() -> None:
    """The owner Job's labels win over the pod template's (Kueue copies none by default)."""
    raw = raw_workload(labels={marks.RUN_LABEL: "tmpl", marks.ATTEMPT_LABEL: "1"})

    parsed = views.parse_workload(raw, {marks.RUN_LABEL: "train", marks.ATTEMPT_LABEL: "4"})
    fallback = views.parse_workload(raw)

    assert (parsed.run, parsed.attempt, fallback.run, fallback.attempt) == ("train", 4, "tmpl", 1)


# ---------------------------------------------------------------- a whole pass


def test_one_pass_never_promises_the_same_gpus_twice() -> None:
    """Two 2 × 8 Workloads, two free nodes: the higher priority one is Ready, the other
    must Retry rather than count on the same nodes."""
    low = workload(name="low", created="2025-03-01T10:00:00Z")
    high = workload(name="high", priority=10)

    decisions = policy.plan([low, high], [node("n0"), node("n1")], FLAVORS, [], T0, check=CHECK)

    states = {name: d.state for (_, name), d in decisions.items()}
    assert states == {"high": views.CheckState.READY, "low": views.CheckState.RETRY}


def test_an_admitted_workload_whose_pods_are_not_bound_yet_keeps_its_room() -> None:
    """Room promised to an admitted Workload is not offered again before its pods land; its
    bound pods are counted on their nodes instead."""
    labels = {"batch.kubernetes.io/job-name": "first"}
    first = workload(name="first", conditions=("QuotaReserved", "Admitted"), state="Ready",
                     labels=labels)  # fmt: skip
    second = workload(name="second")
    nodes = [node("n0"), node("n1"), node("n2")]
    bound = [pod("first-0", node_name="n0", labels=labels)]

    decisions = policy.plan([first, second], nodes, FLAVORS, bound, T0, check=CHECK)

    assert list(decisions) == [("ns", "second")]
    assert decisions[("ns", "second")].state == views.CheckState.RETRY
    assert "only 1 healthy node has them" in decisions[("ns", "second")].message


def test_a_pass_can_be_limited_to_some_cluster_queues() -> None:
    """Workloads admitted through a ClusterQueue that does not name our check are skipped."""
    decisions = policy.plan([workload()], [node("n0"), node("n1")], FLAVORS, [], T0,
                            check=CHECK, queues=frozenset({"other"}))  # fmt: skip

    assert decisions == {}


# ---------------------------------------------------------------- parsing and conditions


def test_pod_requests_follow_the_scheduler_rules() -> None:
    """Containers add up, the largest init container counts if bigger, limits stand in for
    missing requests, and the overhead is added."""
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "2"}}},
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"},
    }

    assert views.pod_requests(spec) == views.Resources(2, 4100, GI)


def test_a_raw_node_is_read_with_its_health() -> None:
    """GPUs, CPU and memory from allocatable; the GPUHealthy condition, Ready, the cordon."""
    raw = {
        "metadata": {"name": "n0", "labels": PRODUCT},
        "spec": {"unschedulable": True},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
            "conditions": [{"type": "Ready", "status": "True"},
                           {"type": "GPUHealthy", "status": "False", "reason": "RowRemapFailure"}],
        },
    }  # fmt: skip

    n = views.parse_node(raw)

    assert n.allocatable == views.Resources(8, 96_000, 1024 * GI)
    assert (n.ready, n.gpu_status, n.problem) == (True, "False", "RowRemapFailure")


def test_bound_running_pods_use_their_node_and_ended_ones_do_not() -> None:
    """Usage is the sum of the non-terminal pods bound to each node."""
    pods = [pod("a", node_name="n0", gpus=2), pod("b", node_name="n0", phase="Succeeded"),
            pod("c", gpus=8)]  # fmt: skip

    (n0,) = views.with_usage([node("n0")], pods)

    assert n0.free.gpus == 6


def test_cluster_queues_naming_the_check() -> None:
    """Only ClusterQueues whose admissionChecksStrategy lists the check are ours."""
    queues: list[dict[str, Any]] = [
        {"metadata": {"name": "a"},
         "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}}},
        {"metadata": {"name": "b"}, "spec": {}},
    ]  # fmt: skip

    assert policy.queues_with_check(queues, CHECK) == frozenset({"a"})


@pytest.mark.parametrize(
    ("condition", "expected_time"),
    [
        pytest.param(None, "2025-03-01T12:00:00Z", id="no condition yet: Active since now"),
        pytest.param({"type": "Active", "status": "False", "reason": "X", "message": "m",
                      "lastTransitionTime": "2025-01-01T00:00:00Z"},
                     "2025-03-01T12:00:00Z", id="False turns True now"),
        pytest.param({"type": "Active", "status": "True", "reason": "Other", "message": "m",
                      "lastTransitionTime": "2025-01-01T00:00:00Z"},
                     "2025-01-01T00:00:00Z", id="True with other words keeps its time"),
    ],
)  # fmt: skip
def test_the_check_is_made_active(condition: dict[str, Any] | None, expected_time: str) -> None:
    """Our AdmissionCheck gets Active=True for its current generation."""
    raw = {"metadata": {"name": CHECK, "generation": 3},
           "spec": {"controllerName": marks.ADMISSION_CHECK_CONTROLLER},
           "status": {"conditions": [condition] if condition else []}}  # fmt: skip

    wanted = policy.active_condition(raw, T0, "answered by us")

    assert wanted == {
        "type": "Active",
        "status": "True",
        "reason": marks.CHECK_ACTIVE_REASON,
        "message": "answered by us",
        "observedGeneration": 3,
        "lastTransitionTime": expected_time,
    }
    assert policy.owns_check(raw)


def test_an_active_check_is_not_written_again() -> None:
    """Active True with our reason and message for this generation needs no write."""
    raw = {"metadata": {"name": CHECK, "generation": 3},
           "status": {"conditions": [policy.active_condition(
               {"metadata": {"generation": 3}}, at(-60), "answered by us")]}}  # fmt: skip

    assert policy.active_condition(raw, T0, "answered by us") is None


def test_a_check_of_another_controller_is_not_ours() -> None:
    """A check whose controllerName is someone else's, or no check, is not answered."""
    raw = {"metadata": {"name": CHECK}, "spec": {"controllerName": "example.com/other"}}

    assert (policy.owns_check(raw), policy.owns_check(None)) == (False, False)


def test_times_are_written_in_whole_seconds() -> None:
    """Kubernetes timestamps: whole seconds, UTC, `Z`."""
    when = dt.datetime(2025, 3, 1, 13, 0, 0, 500_000, tzinfo=dt.timezone(dt.timedelta(hours=1)))

    assert timestamps.rfc3339(when) == "2025-03-01T12:00:00Z"
