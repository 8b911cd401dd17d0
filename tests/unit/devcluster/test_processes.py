"""PID records: only the very process we started is ever signalled."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import pytest

from devcluster import processes

SLEEP = shutil.which("sleep") or "/bin/sleep"


@pytest.fixture
def table(tmp_path: pathlib.Path) -> processes.ProcessTable:
    return processes.ProcessTable(tmp_path)


def test_a_started_process_is_recorded_alive_and_stopped_by_its_pid(
    table: processes.ProcessTable,
) -> None:
    """`start` records PID, executable and start time; `stop` ends it and drops the record."""
    rec = table.start("sleeper", [SLEEP, "60"])
    assert processes.is_alive(rec)
    assert table.get("sleeper") == rec
    assert table.stop("sleeper") is True
    assert not processes.is_alive(rec)
    assert table.records() == []


def test_a_record_whose_process_is_gone_is_stale_and_cleaned(
    table: processes.ProcessTable,
) -> None:
    """A record left behind by an ended process is removed, and nothing is signalled."""
    rec = table.start("brief", [SLEEP, "0"])
    table.stop("brief")
    (table.dir / "brief.json").write_text(json.dumps(dataclasses.asdict(rec)))
    assert table.clean_stale() == ["brief"]
    assert table.records() == []


def test_a_recycled_pid_is_not_ours_and_is_not_signalled(table: processes.ProcessTable) -> None:
    """A record naming a live PID with another start time is treated as not ours."""
    rec = table.start("real", [SLEEP, "60"])
    forged = dataclasses.replace(rec, name="forged", start_ticks=rec.start_ticks + 1)
    (table.dir / "forged.json").write_text(json.dumps(dataclasses.asdict(forged)))
    assert processes.is_alive(forged) is False
    assert table.stop("forged") is False
    assert processes.is_alive(rec), "the real process must survive a forged record"
    assert table.stop("real") is True


def test_stop_all_stops_in_reverse_start_order(table: processes.ProcessTable) -> None:
    """Teardown goes in reverse start order: dependants before what they depend on."""
    table.start("first", [SLEEP, "60"])
    table.start("second", [SLEEP, "60"])
    assert table.stop_all() == ["second", "first"]
    assert table.records() == []
