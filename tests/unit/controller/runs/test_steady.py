"""A run pass decides what changed: a run that nothing it reads changed for is kept, not
decided again (the queue of `reconciling.Reconciler`, fed by the caches' changes). Checked
against a reconciler that decides every run on every pass, over the same histories, and step
by step."""

from __future__ import annotations

import datetime as dt
import typing
from typing import Any

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controller import leading, marks, metrics
from controller.kube import runs as kube_runs
from controller.runs import reconciling, rendering
from shared import spec as specs
from tests import support
from tests.unit.controller.runs import test_reconciling as tr
from tests.unit.controller.runs.builders import SPEC, T0, cond, ts

CachedStore = tr.FakeStore
"""The in-memory store, which tells its changes as the caches do."""


def _reconciler(
    store: tr.FakeStore,
    clock: typing.Callable[[], dt.datetime],
    *,
    full_pass_interval_s: float,
    pods_ready_timeout_s: float | None = 60.0,
) -> reconciling.Reconciler:
    return reconciling.Reconciler(
        typing.cast("kube_runs.RunStore", store),
        typing.cast("leading.Elector", support.AlwaysLeading()),
        metrics.make_metrics(),
        rendering.RenderSettings(controller_url="http://taugrid:8080"),
        pass_interval_s=1.0, ttl_after_finished_s=60.0,
        resume_priority_class="taugrid-resume", pods_ready_timeout_s=pods_ready_timeout_s,
        clock=clock, full_pass_interval_s=full_pass_interval_s,
    )  # fmt: skip


def _decisions(rec: reconciling.Reconciler) -> dict[str, int]:
    """What the reconciler's passes counted so far: runs decided and runs kept."""
    registry = rec.metrics.registry
    return {
        kind: int(registry.get_sample_value("taugrid_run_decisions_total", {"kind": kind}) or 0)
        for kind in ("decided", "kept")
    }


def _spec(**fields: Any) -> specs.TauSpec:
    return specs.validate_spec({**specs.spec_to_wire(SPEC), **fields}).spec


def _pods(store: tr.FakeStore, shape: str) -> list[dict[str, Any]]:
    """The current attempt's pods in one of a few shapes."""
    status = store.runs[("team", "demo")].get("status") or {}
    attempt = int(status.get("currentAttempt") or 1)
    if shape == "none":
        return []
    if shape == "lost":
        return [tr._raw_pod("Failed", node="bad", exit_code=143, attempt=attempt)]
    if shape == "failed":
        return [tr._raw_pod("Failed", exit_code=3, attempt=attempt)]
    if shape == "succeeded":
        return [tr._raw_pod("Succeeded", exit_code=0, attempt=attempt)]
    pod = tr._raw_pod("Pending" if shape == "unschedulable" else "Running", attempt=attempt)
    if shape == "unschedulable":
        pod["status"]["conditions"] = [cond("PodScheduled", "False", "Unschedulable", "0/4")]
    return [pod]


def _apply(store: tr.FakeStore, event: tuple[str, Any]) -> None:
    """One change of the world, as the API server would hold it (objects replaced)."""
    kind, arg = event
    if kind == "admit":
        store.admit(cond("Admitted", at=float(arg)))
    elif kind == "pods":
        store.pods = _pods(store, str(arg))
    elif kind == "cancel":
        run = store.runs[("team", "demo")]
        run["metadata"]["annotations"][marks.CANCEL_ANNOTATION] = "by-test"
        store.rv += 1
        run["metadata"]["resourceVersion"] = str(store.rv)
    elif kind == "quarantine":
        quarantined = {marks.QUARANTINED_BY_ANNOTATION: "x"}
        name = f"q{len(store.nodes)}"
        store.nodes = [*store.nodes, {"metadata": {"name": name, "annotations": quarantined}}]
    elif kind == "requeue":
        store.workloads = [tr._raw_workload(cond("Evicted", reason="PodsReadyTimeout", at=5))]
        store.workloads[0]["status"]["requeueState"] = {"count": 1, "requeueAt": ts(arg)}


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.floats(0, 120)),
        st.tuples(st.just("pass"), st.none()),
        st.tuples(st.just("admit"), st.sampled_from([0, 20, 40])),
        st.tuples(st.just("pods"), st.sampled_from(
            ["none", "running", "unschedulable", "failed", "lost", "succeeded"])),
        st.tuples(st.just("cancel"), st.none()),
        st.tuples(st.just("quarantine"), st.none()),
        st.tuples(st.just("requeue"), st.sampled_from([30, 90, 400])),
    ),
    max_size=14,
)  # fmt: skip
SPECS = st.sampled_from([
    _spec(), _spec(timeout="3m"),
    _spec(retry={"maxAttempts": 3, "backoff": "30s", "when": ["AppError", "NodeFailure"]}),
])  # fmt: skip


@given(spec=SPECS, ready_s=st.sampled_from([None, 45.0]), events=EVENTS)
@hsettings(max_examples=150, deadline=None)
async def test_a_pass_that_keeps_steady_runs_writes_what_deciding_every_run_writes(
    spec: specs.TauSpec, ready_s: float | None, events: list[tuple[str, Any]]
) -> None:
    """Two stores with the same history: one reconciled by passes that keep steady runs (no
    full pass after the first), one by passes that decide every run every time. After each
    change and its pass, both hold the same TauRun and the same objects, and both passes
    say the same next due time."""
    clock = [T0]
    stores = [CachedStore(), CachedStore()]
    recs = [
        _reconciler(s, lambda: clock[0], full_pass_interval_s=full, pods_ready_timeout_s=ready_s)
        for s, full in zip(stores, (1e9, 0.0), strict=True)
    ]
    for store, rec in zip(stores, recs, strict=True):
        store.add_run(spec)
        await rec.reconcile_now("team", "demo")
    for event in [("pass", None), *events]:
        if event[0] == "wait":
            clock[0] += dt.timedelta(seconds=float(event[1]))
        else:
            for store in stores:
                _apply(store, event)
        due = [await rec.pass_once() for rec in recs]
        kept, full = stores
        assert (kept.runs, kept.objects, due[0]) == (full.runs, full.objects, due[1])
    assert _decisions(recs[1])["kept"] == 0


async def test_a_steady_live_run_is_kept_until_something_it_reads_changes() -> None:
    """A Running run whose pods keep running is decided until a step writes nothing, then
    kept pass after pass; a node quarantined anywhere gets it decided again, the slow full
    pass decides it even when nothing changed, and a pod that fails gets it decided (and
    retried) at once."""
    store = CachedStore()
    spec = _spec(retry={"maxAttempts": 3, "when": ["AppError"]})
    clock = [T0]
    rec = _reconciler(store, lambda: clock[0], full_pass_interval_s=30.0)
    store.add_run(spec)
    await rec.reconcile_now("team", "demo")
    store.admit()
    store.pods = _pods(store, "running")
    seen: list[tuple[str, dict[str, int], str]] = []
    for step in ("writes Running", "writes nothing", "kept", "kept", "node quarantined",
                 "kept", "full pass", "kept", "pod failed"):  # fmt: skip
        before = _decisions(rec)
        clock[0] += dt.timedelta(seconds=1)
        if step == "node quarantined":
            _apply(store, ("quarantine", None))
        if step == "full pass":
            clock[0] += dt.timedelta(seconds=30)
        if step == "pod failed":
            store.pods = _pods(store, "failed")
        await rec.pass_once()
        after = _decisions(rec)
        status = store.runs[("team", "demo")]["status"]
        seen.append((step, {k: after[k] - before[k] for k in after}, status["phase"]))
    running, kept = "Running", {"decided": 0, "kept": 1}
    decided = {"decided": 1, "kept": 0}
    expected = [("writes Running", decided, running), ("writes nothing", decided, running),
                ("kept", kept, running), ("kept", kept, running),
                ("node quarantined", decided, running), ("kept", kept, running),
                ("full pass", decided, running), ("kept", kept, running),
                ("pod failed", decided, "Queued")]  # fmt: skip
    assert expected == seen
    assert store.runs[("team", "demo")]["status"]["currentAttempt"] == 2


async def test_a_kept_run_is_decided_when_its_requeue_comes() -> None:
    """An admitted run whose pod cannot be scheduled says when Kueue's waitForPodsReady
    deadline comes; kept once a step wrote nothing, it is decided again at the deadline and
    says the deadline passed, without anything it reads having changed. (A step that wrote
    is decided once more: what it wrote is read back.)"""
    store = CachedStore()
    clock = [T0 + dt.timedelta(seconds=1)]
    rec = _reconciler(store, lambda: clock[0], full_pass_interval_s=1e9,
                      pods_ready_timeout_s=60.0)  # fmt: skip
    store.add_run(_spec())
    await rec.reconcile_now("team", "demo")
    store.admit()
    store.pods = _pods(store, "unschedulable")
    messages = []
    for at in (2, 3, 4, 59, 60, 61, 62):
        clock[0] = T0 + dt.timedelta(seconds=at)
        before = _decisions(rec)["kept"]
        due = await rec.pass_once()
        message = store.runs[("team", "demo")]["status"]["message"]
        messages.append((at, _decisions(rec)["kept"] - before, "missed" in message, due))
    # Admitted at T0: the deadline is T0 + 60 s.
    expected = [(2, 0, False, 58.0), (3, 0, False, 57.0), (4, 1, False, 56.0),
                (59, 1, False, 1.0), (60, 0, True, None), (61, 0, True, None),
                (62, 1, True, None)]  # fmt: skip
    assert expected == messages
