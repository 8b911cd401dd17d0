"""The admission gate takes its Workloads from its queue: which change queues which Workload,
and when (`admitting.Gate`, module docstring). The store is the real `AdmissionStore` whose
caches are fed by hand as a watch would (`Informer.listed`/`event`); nothing here reaches an
API server, and a pass with nothing due must not try to."""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from controller import leading, metrics
from controller.admission import admitting, views
from controller.kube import admission as kube_admission
from tests import support
from tests.unit.controller.admission import test_policy
from tests.unit.controller.fleet.fakes import T0

CHECK = test_policy.CHECK


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


Kit = tuple[admitting.Gate, kube_admission.AdmissionStore, Clock]


@pytest.fixture
async def kit() -> AsyncIterator[Kit]:
    """A gate on a store whose caches are synced and empty, at T0."""
    clock = Clock()
    api = client.ApiClient()
    store = kube_admission.AdmissionStore(api)
    gate = admitting.Gate(
        store, typing.cast("leading.Elector", support.AlwaysLeading()), metrics.make_metrics(),
        check=CHECK, pass_interval_s=1.0, full_pass_interval_s=30.0, clock=clock,
    )  # fmt: skip
    for cache in (store.nodes, store.pods, store.claims, *store.kueue.values()):
        cache.listed([], "1")
    yield gate, store, clock
    await api.close()


def _dra(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with its pod sets' GPUs asked through a ResourceClaim template."""
    for ps in raw["spec"]["podSets"]:
        ps["template"]["spec"]["resourceClaims"] = [
            {"name": "gpus", "resourceClaimTemplateName": "gpus"}
        ]
    return raw


def _take(gate: admitting.Gate, clock: Clock) -> tuple[bool, set[tuple[str, str]]]:
    batch = gate.queue.take(clock.now.timestamp())
    return batch.everything, set(batch.keys)


async def test_a_workload_is_queued_when_it_comes_to_wait_and_forgotten_when_not(kit: Kit) -> None:
    gate, store, clock = kit
    workloads = store.kueue["workloads"]
    assert _take(gate, clock) == (True, set()), "the first take is a resync"

    gate.queue.wake.clear()
    workloads.event("ADDED", test_policy.raw_workload("waits"))
    workloads.event("ADDED", test_policy.raw_workload("no-quota", conditions=()))
    workloads.event("ADDED", test_policy.raw_workload("retried", state="Retry"))
    assert gate.queue.wake.is_set(), "a Workload that waits is decided at once"
    assert _take(gate, clock) == (False, {("ns", "waits")})

    gate._messages[("ns", "waits")] = "no GPUs"
    admitted = test_policy.raw_workload("waits", conditions=("QuotaReserved", "Admitted"),
                                        state="Ready")  # fmt: skip
    admitted["metadata"]["resourceVersion"] = "8"
    workloads.event("MODIFIED", admitted)
    gate.poke()
    assert _take(gate, clock) == (False, set()), "admitted without DRA: it waits no more"
    assert gate.message_for("ns", "waits") == "no GPUs", "kept while the Workload is there"
    workloads.event("DELETED", admitted)
    assert gate.message_for("ns", "waits") is None


async def test_a_dra_workload_passed_but_not_running_is_looked_at_again_on_the_timer_only(
    kit: Kit,
) -> None:
    """Its own changes (claims allocated, pods created) do not wake the gate: a recheck in
    that window would count its own devices against it; it comes every pass interval."""
    gate, store, clock = kit
    _take(gate, clock)
    gate.queue.wake.clear()
    ready = _dra(test_policy.raw_workload("dra", state="Ready",
                                          conditions=("QuotaReserved", "Admitted")))  # fmt: skip
    store.kueue["workloads"].event("ADDED", ready)
    assert not gate.queue.wake.is_set()
    assert _take(gate, clock) == (False, set())
    clock.now += dt.timedelta(seconds=1)
    assert _take(gate, clock) == (False, {("ns", "dra")})

    running = _dra(
        test_policy.raw_workload(
            "dra", state="Ready", conditions=("QuotaReserved", "Admitted", "PodsReady")
        )
    )
    running["metadata"]["resourceVersion"] = "8"
    store.kueue["workloads"].event("MODIFIED", running)
    clock.now += dt.timedelta(seconds=5)
    assert _take(gate, clock) == (False, set()), "its pods run: no longer checked"


async def test_a_capacity_change_queues_every_waiting_workload_a_queue_change_all(kit: Kit) -> None:
    gate, store, clock = kit
    _take(gate, clock)
    for name in ("a", "b"):
        store.kueue["workloads"].event("ADDED", test_policy.raw_workload(name))
    _take(gate, clock)
    waiting = {("ns", "a"), ("ns", "b")}

    gate.queue.wake.clear()
    store.pods.event("ADDED", {"metadata": {"namespace": "ns", "name": "p", "resourceVersion": "9"},
                               "spec": {"nodeName": "n1", "containers": []}})  # fmt: skip
    assert not gate.queue.wake.is_set(), "a pod change waits for the next pass"
    assert _take(gate, clock) == (False, waiting)
    gate.poke()
    assert gate.queue.wake.is_set(), "a node change is seen at once"
    assert _take(gate, clock) == (False, waiting)
    store.kueue["clusterqueues"].event(
        "ADDED", {"metadata": {"name": "cq", "resourceVersion": "3"}}
    )
    assert _take(gate, clock) == (True, set())
    clock.now += dt.timedelta(seconds=31)
    assert _take(gate, clock) == (True, set()), "the resync, every full pass interval"


async def test_a_pass_with_nothing_due_reads_nothing(kit: Kit) -> None:
    gate, store, _clock = kit
    reads: list[str] = []

    async def get_admission_check(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return None  # not ours to answer: the pass stops there

    store.get_admission_check = get_admission_check  # type: ignore[method-assign]
    await gate.pass_once()
    assert reads == [CHECK], "the first pass is a resync"
    await gate.pass_once()
    assert reads == [CHECK]
    store.kueue["workloads"].event("ADDED", test_policy.raw_workload("w"))
    await gate.pass_once()
    assert reads == [CHECK, CHECK]


def test_views_waits_is_the_gates_filter() -> None:
    queues = frozenset({"cq"})
    pending = test_policy.workload()
    assert views.waits(pending, CHECK, queues)
    assert not views.waits(pending, CHECK, frozenset({"other"}))
    assert not views.waits(pending, "another-check", queues)
    assert not views.waits(test_policy.workload(conditions=("QuotaReserved", "Evicted")), CHECK)
    assert not views.waits(test_policy.workload(conditions=("QuotaReserved", "Finished")), CHECK)
    assert not views.waits(test_policy.workload(state="Ready"), CHECK)
