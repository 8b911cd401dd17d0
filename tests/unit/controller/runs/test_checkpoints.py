"""Checkpoint reports, computed: validation naming the field, attempt fencing, the kept list."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from controller.runs import checkpoints, records

T0 = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.UTC)


def test_a_valid_report() -> None:
    """attempt, step and path: exactly what `tau checkpoint` sends."""
    report = checkpoints.parse_report({"attempt": 2, "step": 200, "path": "/ckpt/step-200"})
    assert report == checkpoints.Report(attempt=2, step=200, path="/ckpt/step-200")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1, 2], "body"),
        ({"step": 1, "path": "/p"}, "attempt"),
        ({"attempt": 0, "step": 1, "path": "/p"}, "attempt"),
        ({"attempt": True, "step": 1, "path": "/p"}, "attempt"),
        ({"attempt": 1, "step": -1, "path": "/p"}, "step"),
        ({"attempt": 1, "step": "7", "path": "/p"}, "step"),
        ({"attempt": 1, "step": 1, "path": ""}, "path"),
        ({"attempt": 1, "step": 1, "path": "/a\n/b"}, "path"),
        ({"attempt": 1, "step": 1, "path": "/" + "x" * 5000}, "path"),
        ({"attempt": 1, "step": 1, "path": "/p", "loss": 0.1}, "loss"),
    ],
)
def test_a_bad_report_names_its_field(body: Any, field: str) -> None:
    """Each problem is refused with the field it concerns."""
    with pytest.raises(checkpoints.ReportError) as err:
        checkpoints.parse_report(body)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("attempt", "current", "reason"),
    [(1, 2, "StaleAttempt"), (3, 2, "UnknownAttempt"), (2, 2, None)],
)
def test_only_the_current_attempt_may_report(
    attempt: int, current: int, reason: str | None
) -> None:
    """A report from an attempt that is over (or not yet begun) is refused."""
    report = checkpoints.Report(attempt=attempt, step=1, path="/p")
    if reason is None:
        checkpoints.fence(report, current)
        return
    with pytest.raises(checkpoints.FencedError) as err:
        checkpoints.fence(report, current)
    assert err.value.reason == reason
    assert f"attempt {attempt}" in str(err.value)


def test_the_status_keeps_the_newest_checkpoints() -> None:
    """New reports go last; only the newest `keep` stay."""
    kept: tuple[records.Checkpoint, ...] = ()
    for step in range(5):
        entry = checkpoints.record(checkpoints.Report(1, step * 100, f"/c/{step}"), T0)
        kept = checkpoints.add(kept, entry, keep=3)
    assert [c.step for c in kept] == [200, 300, 400]
    latest = checkpoints.latest(records.RunStatus(checkpoints=kept))
    assert latest is not None
    assert checkpoints.wire(latest) == {
        "attempt": 1, "step": 400, "path": "/c/4", "time": "2026-01-01T03:00:00Z",
    }  # fmt: skip
    assert checkpoints.latest(records.RunStatus()) is None


def test_the_configmap_holds_the_path_and_the_record() -> None:
    """`latest` is the bare path (a shell reads it with `cat`); `latest.json` is the record."""
    entry = checkpoints.record(checkpoints.Report(2, 200, "/ckpt/200"), T0)
    data = checkpoints.configmap_data(entry)
    assert data["latest"] == "/ckpt/200"
    assert json.loads(data["latest.json"])["step"] == 200
    assert checkpoints.configmap_data(None) == {"latest": "", "latest.json": ""}
