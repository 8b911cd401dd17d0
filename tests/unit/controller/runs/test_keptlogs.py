"""Logs kept as evidence, computed: the worker numbering, the tail kept, the TauRunLog, and
which attempts a run's plan keeps the logs of before it deletes them."""

from __future__ import annotations

from typing import Any

import pytest

from controller import marks
from controller.runs import keptlogs, objects, policy, rendering
from tests.unit.controller.runs.builders import ADMITTED, T0, a_job, a_pod, a_workload, ts
from tests.unit.controller.runs.test_policy import SETTINGS, failed_once, run, status_with

REF = objects.RunRef(name="demo", namespace="team", uid="u1")


def pod(name: str, *, index: int | None = None, created: float = 0, deleting: bool = False,
        container: str = rendering.CONTAINER_NAME) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "creationTimestamp": ts(created), "annotations": {}}
    if index is not None:
        meta["annotations"][marks.JOB_COMPLETION_INDEX_ANNOTATION] = str(index)
    if deleting:
        meta["deletionTimestamp"] = ts(created + 1)
    return {"metadata": meta, "spec": {"containers": [{"name": container}]},
            "status": {"phase": "Running"}}  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("b", created=2), pod("a", created=1)], [("a", "main"), ("b", "main")],
                     id="plain pods by creation"),
        pytest.param([pod("x", index=1), pod("y", index=0)], [("y", "main"), ("x", "main")],
                     id="indexed pods by completion index"),
        pytest.param([pod("old", index=0, deleting=True), pod("new", index=0, created=5)],
                     [("new", "main")], id="a pod being deleted gives way to its replacement"),
        pytest.param([pod("w2", created=2, container="ray-worker"), pod("h", container="ray-head"),
                      pod("w1", created=1, container="ray-worker")],
                     [("h", "ray-head"), ("w1", "ray-worker"), ("w2", "ray-worker")],
                     id="ray: the head is worker 0"),
    ],
)  # fmt: skip
def test_workers_are_numbered_the_same_for_live_and_kept_logs(
    pods: list[dict[str, Any]], expected: list[tuple[str, str]]
) -> None:
    """`?worker=K` names one pod, whether its log is read live or from what was kept."""
    assert expected == [(p["metadata"]["name"], c) for p, c in keptlogs.workers(pods)]


@pytest.mark.parametrize(
    ("data", "limit", "expected"),
    [
        pytest.param(b"a\nb\n", 10, ("a\nb\n", False), id="a short log is kept whole"),
        pytest.param(b"line1\nline2\nline3\n", 10, ("line3\n", True),
                     id="a long one from the first whole line of its tail"),
        pytest.param(b"x" * 20, 10, ("x" * 10, True), id="one long line is cut, not dropped"),
        pytest.param(b"ok \xff\xfe\n", 10, ("ok \ufffd\ufffd\n", False),
                     id="invalid UTF-8 is replaced, never refused"),
    ],
)  # fmt: skip
def test_the_tail_kept(data: bytes, limit: int, expected: tuple[str, bool]) -> None:
    """The last `limit` bytes, starting at a line when one starts in them; `truncated` says
    whether older output went."""
    assert expected == keptlogs.keep(data, limit)


@pytest.mark.parametrize(
    ("got", "asked", "expected"),
    [
        pytest.param(100, 2048, None, id="under the byte limit: that was the end of the log"),
        pytest.param(4 * 1024, 2048, 512, id="cut by the limit: ask for fewer lines"),
        pytest.param(4 * 1024, 1, None, id="one line longer than the limit: keep its start"),
    ],
)
def test_a_tail_read_is_repeated_only_when_the_byte_limit_cut_it(
    got: int, asked: int, expected: int | None
) -> None:
    """`limitBytes` counts from the first line of the tail, so a cut read is not the end."""
    assert expected == keptlogs.read_again(got, asked, keep_bytes=1024)


def test_the_object_is_owned_labelled_and_reads_back() -> None:
    """A TauRunLog carries the run's owner reference and labels (what the admission policy
    for the controller's creates requires) and reads back as written."""
    body = keptlogs.render(REF, 2, 1, pod="demo-a2-1-x", container="main", log="boom\n",
                           now=T0, complete=True, truncated=False)  # fmt: skip
    meta = body["metadata"]
    assert (meta["name"], meta["labels"], meta["ownerReferences"][0]["uid"]) == (
        "demo-a2-w1",
        {marks.RUN_LABEL: "demo", marks.ATTEMPT_LABEL: "2", marks.WORKER_LABEL: "1"}, "u1",
    )  # fmt: skip
    kept = keptlogs.read(body)
    assert (kept.attempt, kept.worker, kept.log, kept.complete, kept.owner_uid) == (
        2, 1, "boom\n", True, "u1",
    )  # fmt: skip
    assert keptlogs.index([body])[0]["bytes"] == 5


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({"log": "a", "complete": False}, {"log": "ab", "complete": False}, True,
                     id="more output replaces"),
        pytest.param({"log": "a", "complete": False}, {"log": "a", "complete": False}, False,
                     id="the same output is not written again"),
        pytest.param({"log": "a", "complete": True}, {"log": "ab", "complete": False}, False,
                     id="a complete capture is never replaced by an incomplete one"),
        pytest.param({"log": "a", "complete": False}, {"log": "a", "complete": True}, True,
                     id="the final capture replaces"),
    ],
)  # fmt: skip
def test_what_replaces_what_is_kept(
    old: dict[str, Any], new: dict[str, Any], expected: bool
) -> None:
    """Only news is written, and the end of a worker is the best evidence of it."""

    def body(spec: dict[str, Any]) -> dict[str, Any]:
        return keptlogs.render(REF, 1, 0, pod="p", container="main", log=spec["log"], now=T0,
                               complete=spec["complete"], truncated=False)  # fmt: skip

    assert expected == keptlogs.replaces(keptlogs.read(body(old)), body(new))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({"workload": a_workload(*ADMITTED, cq="cq"), "attempt_object": a_job(),
                      "pods": (a_pod(),)}, (), id="a running attempt keeps nothing now"),
        pytest.param(failed_once("NodeFailure"), (1,),
                     id="a failed attempt that is retried: kept before it is deleted"),
        pytest.param(failed_once("AppError"), (1,),
                     id="a failed attempt that ends the run: kept at its end"),
        pytest.param({"cancel_requested": True}, (1,), id="a cancelled attempt, before delete"),
    ],
)  # fmt: skip
def test_the_plan_keeps_the_logs_of_attempts_that_end(
    given: dict[str, Any], expected: tuple[int, ...]
) -> None:
    """`keep_logs` names the attempts whose logs are captured before the plan's deletes."""
    plan = policy.decide_run(run(**given), SETTINGS, T0)
    assert expected == plan.keep_logs


def test_the_ttl_clean_up_keeps_every_attempts_logs_first() -> None:
    """A finished run's objects go after the TTL; their logs are kept (or found complete)
    first."""
    ended = status_with(phase="Failed", endTime=ts(0), currentAttempt=2,
                        attempts=[{"number": 1}, {"number": 2}])  # fmt: skip
    plan = policy.decide_run(run(ended), SETTINGS, T0.replace(hour=5))
    assert (plan.keep_logs, bool(plan.deletes)) == ((1, 2), True)
