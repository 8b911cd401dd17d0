"""The admission gate takes its Workloads from its queue: which change queues which Workload,
and when (`admitting.Gate`, module docstring). The store is the real `AdmissionStore` whose
caches are fed by hand as a watch would (`Informer.listed`/`event`); nothing here reaches an
API server, and a pass with nothing due must not try to."""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import typing
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from controller import leading, marks, metrics
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


async def test_a_pass_that_fails_queues_its_workloads_again_after_a_backoff(kit: Kit) -> None:
    """An API failure mid-pass loses no Workload to the resync's wait: each comes back after
    its backoff (1 s, then 2 s), and a pass that goes through forgets the failures."""
    gate, store, clock = kit
    calls: list[str] = []

    async def get_admission_check(name: str) -> dict[str, Any] | None:
        calls.append(name)
        if len(calls) <= 3:
            raise client.ApiException(status=500, reason="etcd is slow")
        return None

    store.get_admission_check = get_admission_check  # type: ignore[method-assign]
    _take(gate, clock)  # the first resync, taken and dropped
    store.kueue["workloads"].event("ADDED", test_policy.raw_workload("w"))
    with pytest.raises(client.ApiException):
        await gate.pass_once()
    assert gate.queue.next_scheduled(clock.now.timestamp()) == 1.0
    await gate.pass_once()
    assert len(calls) == 1, "nothing was due before its backoff"
    clock.now += dt.timedelta(seconds=1)
    with pytest.raises(client.ApiException):
        await gate.pass_once()
    assert gate.queue.next_scheduled(clock.now.timestamp()) == 2.0, "the backoff doubles"
    clock.now += dt.timedelta(seconds=2)
    with pytest.raises(client.ApiException):
        await gate.pass_once()
    clock.now += dt.timedelta(seconds=4)
    await gate.pass_once()
    assert len(calls) == 4
    assert gate.queue.next_scheduled(clock.now.timestamp()) is None


async def test_pod_changes_between_two_passes_walk_the_waiting_workloads_once(kit: Kit) -> None:
    """A busy cluster's pods change many times a second: the waiting Workloads are scheduled
    for the next pass by the first change, not walked again by each one after it; after a
    pass the next change schedules them again."""
    gate, store, clock = kit
    await gate.pass_once()
    for name in ("a", "b", "c"):
        store.kueue["workloads"].event("ADDED", test_policy.raw_workload(name))
    _take(gate, clock)
    scheduled: list[tuple[str, str]] = []
    due_at = gate.queue.due_at

    def counting(key: tuple[str, str], when: float | None) -> None:
        scheduled.append(key)
        due_at(key, when)

    gate.queue.due_at = counting  # type: ignore[method-assign]

    def pod(version: int) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "p", "resourceVersion": str(version),
                             "labels": {"v": str(version)}},
                "spec": {"nodeName": "n1", "containers": []}}  # fmt: skip

    told: list[int] = []
    store.pods.subscribe(lambda _change: told.append(1))
    for version in range(10, 110):
        store.pods.event("MODIFIED", pod(version))
    assert len(told) == 100, "each pod change is told"
    assert sorted(scheduled) == [("ns", "a"), ("ns", "b"), ("ns", "c")]
    store.get_admission_check = _never_ours  # type: ignore[method-assign,assignment]
    await gate.pass_once()
    store.pods.event("MODIFIED", pod(200))
    assert len(scheduled) == 6, "a change after the pass schedules them again"
    assert _take(gate, clock) == (False, {("ns", "a"), ("ns", "b"), ("ns", "c")})


async def _never_ours(_name: str) -> dict[str, Any] | None:
    return None


def test_views_waits_is_the_gates_filter() -> None:
    queues = frozenset({"cq"})
    pending = test_policy.workload()
    assert views.waits(pending, CHECK, queues)
    assert not views.waits(pending, CHECK, frozenset({"other"}))
    assert not views.waits(pending, "another-check", queues)
    assert not views.waits(test_policy.workload(conditions=("QuotaReserved", "Evicted")), CHECK)
    assert not views.waits(test_policy.workload(conditions=("QuotaReserved", "Finished")), CHECK)
    assert not views.waits(test_policy.workload(state="Ready"), CHECK)


# ---------------------------------------------------------------- the queue against full passes

NODES = ("n0", "n1", "n2")


class World:
    """The API server as one gate sees it: raw objects it is told of through its caches, and
    its own writes of our check applied and told back (as the watch would)."""

    def __init__(self, gate: admitting.Gate, store: kube_admission.AdmissionStore) -> None:
        self.gate, self.store = gate, store
        self.workloads: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.version = 100
        store.apply_check_state = self.apply_check_state  # type: ignore[method-assign]
        store.apply_active = self.apply_active  # type: ignore[method-assign]
        store.workload_event = self.workload_event  # type: ignore[method-assign]
        store.kueue["admissionchecks"].event("ADDED", {
            "metadata": {"name": CHECK, "generation": 1, "resourceVersion": "1"},
            "spec": {"controllerName": marks.ADMISSION_CHECK_CONTROLLER},
        })  # fmt: skip
        store.kueue["clusterqueues"].event("ADDED", {
            "metadata": {"name": "cq", "resourceVersion": "2"},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}},
        })  # fmt: skip
        store.kueue["resourceflavors"].event("ADDED", {
            "metadata": {"name": test_policy.FLAVOR, "resourceVersion": "3"},
            "spec": {"nodeLabels": test_policy.PRODUCT},
        })  # fmt: skip
        for name in NODES:
            self.node(name, cordoned=False)

    def _rv(self) -> str:
        self.version += 1
        return str(self.version)

    def node(self, name: str, *, cordoned: bool) -> None:
        self.store.nodes.event("MODIFIED", {
            "metadata": {"name": name, "labels": dict(test_policy.PRODUCT),
                         "resourceVersion": self._rv()},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
        self.gate.poke()  # as the fleet's node cache does (app.py)

    def pod(self, node: str, gpus: int) -> None:
        """A pod of someone else's on `node` taking `gpus` GPUs (0: none there)."""
        raw = {
            "metadata": {"namespace": "other", "name": f"p-{node}", "resourceVersion": self._rv()},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"},
        }  # fmt: skip
        self.store.pods.event("DELETED" if gpus == 0 else "MODIFIED", raw)

    def fence(self, name: str, *, running: bool) -> None:
        """A pod of attempt 1 of run `name` (its Workloads are attempt 2) runs, or is gone."""
        raw = {
            "metadata": {"namespace": "ns", "name": f"old-{name}", "resourceVersion": self._rv(),
                         "labels": {marks.RUN_LABEL: name, marks.ATTEMPT_LABEL: "1"}},
            "spec": {"nodeName": NODES[0], "containers": [{"name": "c", "resources": {}}]},
            "status": {"phase": "Running"},
        }  # fmt: skip
        self.store.pods.event("MODIFIED" if running else "DELETED", raw)

    def requeue(self) -> None:
        """What Kueue does after a Retry: our check Pending again, the quota reserved anew."""
        for raw in self.workloads.values():
            if raw["status"]["admissionChecks"][0]["state"] == "Retry":
                raw["status"]["admissionChecks"] = [{"name": CHECK, "state": "Pending",
                                                     "message": ""}]  # fmt: skip
                raw["metadata"]["resourceVersion"] = self._rv()
                self.store.kueue["workloads"].event("MODIFIED", copy.deepcopy(raw))

    def add(self, name: str, pods: int, gpus: int, created: int) -> None:
        run = {marks.RUN_LABEL: name, marks.ATTEMPT_LABEL: "2"}
        raw = test_policy.raw_workload(name, pod_sets=[("main", pods, gpus)], labels=run,
                                       created=f"2025-03-01T11:{created:02d}:00Z")  # fmt: skip
        raw["metadata"]["resourceVersion"] = self._rv()
        self.workloads[name] = raw
        self.store.kueue["workloads"].event("ADDED", copy.deepcopy(raw))

    def delete(self, name: str) -> None:
        if (raw := self.workloads.pop(name, None)) is not None:
            self.store.kueue["workloads"].event("DELETED", copy.deepcopy(raw))

    async def apply_check_state(
        self, namespace: str, name: str, resource_version: str, state: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        raw = self.workloads.get(name)
        if raw is None or raw["metadata"]["resourceVersion"] != resource_version:
            return None
        raw["status"]["admissionChecks"] = [dict(state)]
        raw["metadata"]["resourceVersion"] = self._rv()
        self.writes += 1
        self.store.kueue["workloads"].event("MODIFIED", copy.deepcopy(raw))
        return raw

    async def apply_active(self, name: str, condition: Mapping[str, Any]) -> dict[str, Any]:
        raw = copy.deepcopy(self.store.kueue["admissionchecks"].items[name])
        raw["status"] = {"conditions": [dict(condition)]}
        raw["metadata"]["resourceVersion"] = self._rv()
        self.store.kueue["admissionchecks"].event("MODIFIED", raw)
        return raw

    async def workload_event(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    async def settle(self) -> None:
        """Pass until a pass writes nothing."""
        for _ in range(20):
            before = self.writes
            await self.gate.pass_once()
            if self.writes == before:
                return
        raise AssertionError("the gate never settled")

    def checks(self) -> dict[str, tuple[str, str]]:
        return {
            name: (raw["status"]["admissionChecks"][0]["state"],
                   raw["status"]["admissionChecks"][0]["message"])
            for name, raw in self.workloads.items()
        }  # fmt: skip


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"), st.integers(0, 2), st.integers(1, 2), st.sampled_from([1, 2, 4, 8])
        ),
        st.tuples(st.just("delete"), st.integers(0, 2)),
        st.tuples(st.just("fence"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("requeue")),
        st.tuples(st.just("cordon"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("pod"), st.integers(0, 2), st.sampled_from([0, 2, 4, 8])),
    ),
    min_size=1,
    max_size=16,
)


@hsettings(max_examples=80, deadline=None)
@given(ops=OPS)
@example(ops=[("fence", 0, True), ("add", 0, 1, 8), ("fence", 0, False)])
@example(ops=[("fence", 0, True), ("add", 0, 1, 8), ("cordon", 0, True), ("fence", 0, False)])
@example(ops=[("add", 0, 2, 8), ("add", 1, 2, 8), ("delete", 0), ("requeue",)])
async def test_the_queue_driven_gate_answers_as_a_gate_deciding_everything_every_pass(
    ops: list[tuple[Any, ...]],
) -> None:
    """The same changes told to two gates: one that decides only what its queue hands out,
    and one whose queue resyncs on every take (each pass decides every waiting Workload, as
    the gate did before its queue). After each change both settle to the same checks. Runs
    whose earlier attempt still runs wait (Pending), so a pod's or a node's change must bring
    the waiting Workloads back; Kueue's requeue after a Retry brings a Workload back too."""
    clock = Clock()
    async with contextlib.AsyncExitStack() as stack:
        worlds = []
        for resync_s in (30.0, 0.0):
            api = client.ApiClient()
            stack.push_async_callback(api.close)
            store = kube_admission.AdmissionStore(api)
            gate = admitting.Gate(
                store, typing.cast("leading.Elector", support.AlwaysLeading()),
                metrics.make_metrics(), check=CHECK, full_pass_interval_s=resync_s, clock=clock,
            )  # fmt: skip
            for cache in (store.nodes, store.pods, store.claims, *store.kueue.values(),
                          *store.owners.values()):  # fmt: skip
                cache.listed([], "1")
            worlds.append(World(gate, store))
        for world in worlds:
            await world.settle()
        for step, op in enumerate(ops):
            clock.now += dt.timedelta(seconds=1)
            for world in worlds:
                match op:
                    case ("add", i, pods, gpus):
                        if f"w{i}" not in world.workloads:
                            world.add(f"w{i}", pods, gpus, created=step)
                    case ("delete", i):
                        world.delete(f"w{i}")
                    case ("cordon", n, cordoned):
                        world.node(NODES[n], cordoned=cordoned)
                    case ("pod", n, gpus):
                        world.pod(NODES[n], gpus)
                    case ("fence", i, running):
                        world.fence(f"w{i}", running=running)
                    case ("requeue",):
                        world.requeue()
                await world.settle()
            queued, full = worlds
            assert queued.checks() == full.checks(), f"after {op}"
