"""The admission gate on a DRA fleet: claims fit on healthy, untainted devices of fresh
nodes; stale health fails closed; a passed Workload whose devices went bad before its pods
started gives its quota back (DESIGN.md section 2, "the admission gate counts devices")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller import marks
from controller.admission import dra, policy, views
from tests.unit.controller.admission import test_policy as base
from tests.unit.controller.fleet.fakes import T0

CHECK = base.CHECK


def raw_dra_workload(
    name: str = "wl",
    *,
    pods: int = 2,
    gpus: int = 4,
    state: str = "Pending",
    conditions: tuple[str, ...] = ("QuotaReserved",),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Workload whose pods get GPUs through a claim template; Kueue's quota usage says
    how many (`nvidia.com/gpu`, the name NVIDIA's class is mapped to)."""
    raw = base.raw_workload(name, pod_sets=[("main", pods, 0)], state=state,
                            conditions=conditions, labels=labels or {"job-name": name})  # fmt: skip
    template = raw["spec"]["podSets"][0]["template"]["spec"]
    template["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"{name}-gpus"}]
    template["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                                              "claims": [{"name": "gpus"}]}  # fmt: skip
    raw["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] = {
        "cpu": str(pods),
        "memory": f"{pods}Gi",
        "nvidia.com/gpu": str(pods * gpus),
    }
    return raw


def dra_node(name: str, *, bad: tuple[int, ...] = (), fresh: bool = True,
             held: tuple[int, ...] = ()) -> tuple[views.NodeCapacity, dra.DeviceNode,
                                                 set[tuple[str, str]]]:  # fmt: skip
    """A DRA node of 8 GPUs (no nvidia.com/gpu in its allocatable), `bad` ones tainted."""
    capacity = base.node(name, gpus=0)
    slots = tuple(
        dra.DeviceSlot(name, f"gpu-{i}", i not in bad, "tainted" if i in bad else "")
        for i in range(8)
    )  # fmt: skip
    return capacity, dra.DeviceNode(fresh, slots), {(name, f"gpu-{i}") for i in held}


def fleet(*nodes: tuple[views.NodeCapacity, dra.DeviceNode, set[tuple[str, str]]]
          ) -> list[views.NodeCapacity]:  # fmt: skip
    allocated: set[tuple[str, str]] = set()
    for _, _, held in nodes:
        allocated |= held
    return dra.WithDevices()([n for n, _, _ in nodes], {n.name: d for n, d, _ in nodes},
                               holding(allocated))  # fmt: skip


def raw_claim(*devices: tuple[str, str], pods: tuple[str, ...] = ()) -> dict[str, Any]:
    """An allocated ResourceClaim of NVIDIA's driver holding these (pool, device)s."""
    results = [{"driver": marks.DRA_DRIVER, "pool": p, "device": d} for p, d in devices]
    return {"metadata": {"namespace": "ns"},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": n} for n in pods]}}  # fmt: skip


def holding(allocated: set[tuple[str, str]]) -> dra.Claims:
    """The gate's claims: one claim per device allocated."""
    return dra.Claims.of(dra.parse_claim(raw_claim(one)) for one in sorted(allocated))


def test_a_dra_pod_set_reads_its_gpus_from_kueues_quota_usage() -> None:
    """2 pods, 8 devices in all: 4 GPUs per pod, marked as DRA."""
    found = views.parse_workload(raw_dra_workload()).pod_sets[0]
    assert (found.requests.gpus, found.dra) == (4, True)


@pytest.mark.parametrize(
    ("nodes", "state", "message"),
    [
        pytest.param([dra_node("d0"), dra_node("d1")], views.CheckState.READY,
                     "fits on healthy nodes of flavor h100: d0",
                     id="two pods of 4 GPUs fit on one untainted DRA node"),
        pytest.param([dra_node("d0", bad=(0, 1, 2, 3)), dra_node("d1", bad=(5,))],
                     views.CheckState.READY, "fits on healthy nodes of flavor h100: d0, d1",
                     id="the untainted devices of nodes with fenced GPUs still count"),
        pytest.param([dra_node("d0", bad=(0, 1, 2, 3, 4)), dra_node("d1", bad=(2, 3, 4, 5, 6))],
                     views.CheckState.RETRY,
                     "needs 2 nodes with 4 free GPUs on healthy nodes of flavor h100; no healthy"
                     " node has them (10 GPUs not usable: d0 gpu-0, gpu-1, gpu-2, gpu-3, gpu-4"
                     " tainted, d1 gpu-2, gpu-3, gpu-4, gpu-5, gpu-6 tainted)",
                     id="tainted devices are counted and named, node by node"),
        pytest.param([dra_node("d0", held=(0, 1, 2, 3, 4)), dra_node("d1", held=(0, 1, 2, 3, 4))],
                     views.CheckState.RETRY, "no healthy node has room",
                     id="devices allocated to claims are not free"),
        pytest.param([dra_node("d0", fresh=False), dra_node("d1", bad=(0, 1, 2, 3, 4))],
                     views.CheckState.RETRY, "(1 unhealthy: d0 GPU health data stale)",
                     id="stale health data fails closed"),
    ],
)  # fmt: skip
def test_claims_fit_only_on_healthy_untainted_devices_of_fresh_nodes(
    nodes: list[Any], state: views.CheckState, message: str
) -> None:
    """The gate counts devices, not the flavor's total."""
    decision = base.decide(views.parse_workload(raw_dra_workload()), fleet(*nodes))
    assert decision is not None
    assert state == decision.state
    assert message in decision.message, decision.message


def test_a_dra_fleet_without_the_fleets_word_admits_nothing() -> None:
    """A DRA node the fleet does not report (no heartbeat yet) offers no GPUs."""
    nodes = dra.WithDevices()([base.node("d0", gpus=0)], {}, dra.Claims())
    decision = base.decide(views.parse_workload(raw_dra_workload(pods=1)), nodes)
    assert decision is not None
    assert decision.state == views.CheckState.RETRY


def test_claims_never_fit_on_device_plugin_nodes_nor_extended_requests_on_dra_nodes() -> None:
    """A DRA pod set needs DRA devices; a `nvidia.com/gpu` pod set needs a plugin node."""
    plugin = [base.node("p0")]
    claims = base.decide(views.parse_workload(raw_dra_workload(pods=1)), plugin)
    extended = base.decide(base.workload(pod_sets=[("main", 1, 4)]), fleet(dra_node("d0")))
    assert claims is not None
    assert extended is not None
    assert (claims.state, extended.state) == (views.CheckState.RETRY, views.CheckState.RETRY)


def _plan(
    workloads: list[dict[str, Any]],
    nodes: list[views.NodeCapacity],
    pods: list[views.PodUsage] | None = None,
) -> dict[tuple[str, str], policy.Decision]:
    return policy.plan([views.parse_workload(w) for w in workloads], nodes, base.FLAVORS,
                       pods or [], T0, check=CHECK, retry_after_s=15)  # fmt: skip


ADMITTED = ("QuotaReserved", "Admitted")


def test_an_admitted_workload_whose_devices_went_bad_before_its_pods_started_gets_retry() -> None:
    """Ready and admitted, no pod bound yet, and now only 4 usable GPUs for its 8: Retry
    with requeueAfterSeconds, so Kueue evicts it and its quota goes to work that fits."""
    w = raw_dra_workload(state="Ready", conditions=ADMITTED)
    nodes = fleet(dra_node("d0", bad=(0, 1, 2, 3)), dra_node("d1", bad=(0, 1, 2, 3, 4, 5, 6, 7)))
    decision = _plan([w], nodes)[("ns", "wl")]
    expected = (views.CheckState.RETRY, 15)
    assert expected == (decision.state, decision.requeue_after_s)
    assert decision.message.startswith("quota released before its pods started: ")


@pytest.mark.parametrize(
    ("pods", "conditions"),
    [
        pytest.param([base.pod("wl-0", node_name="d0", labels={"job-name": "wl"}, gpus=0)],
                     ADMITTED, id="a Workload with a pod bound keeps its quota"),
        pytest.param([], (*ADMITTED, "PodsReady"), id="a Workload whose pods run keeps it"),
    ],
)  # fmt: skip
def test_a_workload_that_started_is_never_taken_back(
    pods: list[views.PodUsage], conditions: tuple[str, ...]
) -> None:
    """Once a pod runs, bad devices are device quarantine's business (eviction), not ours."""
    w = raw_dra_workload(state="Ready", conditions=conditions)
    nodes = fleet(dra_node("d0", bad=tuple(range(8))), dra_node("d1", bad=tuple(range(8))))
    assert ("ns", "wl") not in _plan([w], nodes, pods)


def test_a_workload_whose_claims_the_scheduler_allocated_keeps_its_own_gpus() -> None:
    """Between allocating a pod's claims and binding the pod, the scheduler has the pod's
    devices held and no node on the pod: the Workload's own GPUs are not a reason to send
    it back (they were, and a re-check in that moment answered Retry)."""
    w = raw_dra_workload(pods=2, state="Ready", conditions=ADMITTED)
    nodes = fleet(dra_node("d0", held=tuple(range(8))), dra_node("d1", held=tuple(range(8))))
    being_bound = [
        dataclasses.replace(base.pod(f"wl-{i}", labels={"job-name": "wl"}, gpus=0), claimed=True)
        for i in range(2)
    ]
    unclaimed = [base.pod(f"wl-{i}", labels={"job-name": "wl"}, gpus=0) for i in range(2)]
    kept = ("ns", "wl") not in _plan([w], nodes, being_bound)
    taken = _plan([w], nodes, unclaimed)[("ns", "wl")].state
    assert (kept, taken) == (True, views.CheckState.RETRY)


def test_a_pod_is_claimed_when_an_allocated_claim_is_reserved_for_it() -> None:
    """Only allocated claims count, only their pod consumers, in the claim's namespace."""
    claims = [
        {"metadata": {"namespace": "ns"}, "status": {
            "allocation": {"devices": {"results": []}},
            "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u1"},
                            {"apiGroup": "example.com", "resource": "pods", "name": "x"}]}},
        {"metadata": {"namespace": "ns"}, "status": {
            "reservedFor": [{"resource": "pods", "name": "p2", "uid": "u2"}]}},
        {"metadata": {"namespace": "other"}, "status": {
            "allocation": {"devices": {}}, "reservedFor": [{"resource": "pods", "name": "p3"}]}},
    ]  # fmt: skip
    found = dra.Claims.of(map(dra.parse_claim, claims))
    assert set(found.pods) == {("ns", "p1"), ("other", "p3")}


def test_an_admitted_workload_that_still_fits_keeps_its_room_from_later_ones() -> None:
    """The re-checked Workload still fits: it keeps its devices, so a later one does not."""
    first = raw_dra_workload("a", pods=1, gpus=8, state="Ready", conditions=ADMITTED)
    later = raw_dra_workload("b", pods=1, gpus=8)
    later["metadata"]["creationTimestamp"] = "2025-03-01T11:10:00Z"
    decisions = _plan([first, later], fleet(dra_node("d0")))
    assert ("ns", "a") not in decisions
    assert decisions[("ns", "b")].state == views.CheckState.RETRY
