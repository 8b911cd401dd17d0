"""Which runs a cache's change queues (`Reconciler._on_change`): the keys a pass then decides
without deciding every run."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from controller import marks
from controller.kube import informer
from controller.runs import objects, views
from shared import spec as specs
from tests.unit.controller.runs import test_reconciling as tr
from tests.unit.controller.runs.builders import SPEC, T0, ts


@pytest.mark.parametrize(
    ("name", "run"),
    [
        pytest.param("demo-a1", "demo", id="attempt 1"),
        pytest.param("my-a-run-a12", "my-a-run", id="a run whose name has -a in it"),
        pytest.param("demo-a", None, id="no number"),
        pytest.param("demo-a01", None, id="a number attempt_name never writes"),
        pytest.param("-a1", None, id="no run"),
        pytest.param("demo", None, id="no attempt"),
    ],
)  # fmt: skip
def test_the_run_of_an_attempt_object_is_read_back_from_its_name(
    name: str, run: str | None
) -> None:
    """`run_of_attempt` inverts `attempt_name`, and names no run for other names."""
    assert run == objects.run_of_attempt(name)
    if run is not None:
        assert objects.attempt_name(run, int(name.rpartition("-a")[2])) == name


def _labelled(name: str, run: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "labels": {marks.RUN_LABEL: run}}}


async def test_each_kind_of_change_queues_the_runs_it_concerns() -> None:
    """A pod or Job: the run its label names (before or after the change); a Workload: the
    run of the attempt owning it; a LocalQueue: the runs of its namespace; a Node: the live
    runs, not a settled finished one; a WorkloadPriorityClass: every run (a resync)."""
    store = tr.FakeStore()
    store.add_run(SPEC)
    finished = specs.TauSpec.model_validate({**SPEC.model_dump(), "name": "old"})
    store.add_run(finished)
    store.runs[("team", "old")]["status"] = {
        "phase": "Succeeded", "endTime": ts(0), "objectsDeleted": True,
        "currentAttempt": 1,
    }  # fmt: skip
    rec = tr._reconciler(store, clock=lambda: T0 + dt.timedelta(seconds=1))
    await rec.pass_once()  # the first pass decides every run
    await rec.pass_once()  # and the next reads back what it wrote
    rec.queue.take(T0.timestamp() + 2)
    workload = views.parse_workload(tr._raw_workload(job="demo-a2"))
    changes: list[tuple[str, informer.Change[Any]]] = [
        ("Pod", informer.Change("team/p", _labelled("p", "demo"), _labelled("p", "other"))),
        ("Job", informer.Change("team/j", None, _labelled("j", "demo"))),
        ("workloads", informer.Change("team/job-demo-a2", None, workload)),
        ("localqueues", informer.Change("team/q", None, {"metadata": {"name": "q"}})),
        ("localqueues", informer.Change("elsewhere/q", None, {"metadata": {"name": "q"}})),
        ("Node", informer.Change("n7", None, {"metadata": {"name": "n7"}})),
    ]
    seen = []
    for kind, change in changes:
        rec._on_change(kind, change)
        batch = rec.queue.take(T0.timestamp() + 3)
        seen.append((kind, sorted(batch.keys), batch.everything))
    rec._on_change("workloadpriorityclasses", informer.Change("c", None, {}))
    assert seen == [
        ("Pod", [("team", "demo"), ("team", "other")], False),
        ("Job", [("team", "demo")], False),
        ("workloads", [("team", "demo")], False),
        ("localqueues", [("team", "demo"), ("team", "old")], False),
        ("localqueues", [], False),
        ("Node", [("team", "demo")], False),
    ]
    assert rec.queue.take(T0.timestamp() + 4).everything


async def test_a_change_no_decision_reads_queues_no_run() -> None:
    """A run pod's annotation (what a churn of kubectl annotate does) leaves its view, labels
    and owners as they were: no run is queued. Its phase changing queues its run."""
    store = tr.FakeStore()
    store.add_run(SPEC)
    rec = tr._reconciler(store, clock=lambda: T0)
    await rec.pass_once()
    rec.queue.take(T0.timestamp() + 1)
    pod = tr._raw_pod("Running")
    annotated = {**pod, "metadata": {**pod["metadata"], "annotations": {"x": "1"}}}
    failed = tr._raw_pod("Failed", exit_code=3)
    rec._on_change("Pod", informer.Change("team/demo-a1-x", pod, annotated))
    quiet = rec.queue.take(T0.timestamp() + 2).keys
    rec._on_change("Pod", informer.Change("team/demo-a1-x", annotated, failed))
    assert (quiet, rec.queue.take(T0.timestamp() + 3).keys) == (
        frozenset(), frozenset({("team", "demo")}),
    )  # fmt: skip


async def test_a_deleted_run_leaves_nothing_queued() -> None:
    """A finished run waits for its TTL (a scheduled look); once its TauRun is deleted the
    next pass forgets it, so no pass is woken for it."""
    store = tr.FakeStore()
    store.add_run(SPEC)
    store.runs[("team", "demo")]["status"] = {
        "phase": "Succeeded", "endTime": ts(0), "currentAttempt": 1,
    }  # fmt: skip
    rec = tr._reconciler(store, clock=lambda: T0 + dt.timedelta(seconds=1))
    await rec.pass_once()
    scheduled = rec.queue.next_scheduled(T0.timestamp() + 1)
    del store.runs[("team", "demo")]
    due = await rec.pass_once()
    assert (scheduled is not None, due, rec.queue.next_scheduled(T0.timestamp() + 1)) == (
        True, None, None,
    )  # fmt: skip
