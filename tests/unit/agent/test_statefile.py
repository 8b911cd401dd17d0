"""The latched-fault state file: round trip, and the corrupt path (moved aside, start clean)."""

from __future__ import annotations

import datetime as dt
import pathlib
from collections.abc import Callable

import pytest

from agent import latching, statefile
from shared import health

T0 = dt.datetime(2026, 5, 1, 3, 0, tzinfo=dt.UTC)


def latched_state() -> latching.NodeState:
    """A node state with one latched fault, as after an Xid 79."""
    fault = latching.LatchedFault(
        code="XidFallenOffBus",
        verdict=health.Verdict.FAILED,
        action=health.Action.REBOOT_NODE,
        xid=79,
        since=T0,
        last_seen=T0,
        boot_id="boot-1",
        clears_when=latching.ClearingCondition.NEW_BOOT_ID,
    )
    gpu = latching.GpuState(uuid="GPU-1", index=3, latched=(fault,), xid_counts={79: 1})
    return latching.NodeState(boot_id="boot-1", gpus={"GPU-1": gpu}, kmsg_seq=7)


def test_a_saved_state_loads_back_unchanged(tmp_path: pathlib.Path) -> None:
    """What `save` writes, `load` reads back with no problem reported."""
    path = tmp_path / "sub" / "state.json"
    statefile.save(path, latched_state())
    loaded = statefile.load(path)
    assert loaded == statefile.Loaded(latched_state())


def test_a_missing_file_is_a_clean_start_without_a_problem(tmp_path: pathlib.Path) -> None:
    """The first start on a node has no file and nothing to report."""
    assert statefile.load(tmp_path / "state.json") == statefile.Loaded(latching.NodeState())


def write_bytes(content: bytes) -> Callable[[pathlib.Path], None]:
    """Make a writer of these bytes."""

    def write(path: pathlib.Path) -> None:
        path.write_bytes(content)

    return write


def make_directory(path: pathlib.Path) -> None:
    """Put a directory where the file should be (a bad hostPath mount)."""
    path.mkdir()
    (path / "leftover").write_text("x")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        pytest.param(write_bytes(b'{"version": 1, "gpus": {'), "invalid at <document>",
                     id="a file cut short mid-write is set aside"),
        pytest.param(write_bytes(b""), "invalid at <document>",
                     id="an empty file left by a power loss is set aside"),
        pytest.param(write_bytes(b"\xff\xfe\x00garbage"), "invalid at <document>",
                     id="bytes that are not UTF-8 are set aside"),
        pytest.param(write_bytes(b"[]"), "invalid at <document>",
                     id="a JSON list instead of an object is set aside"),
        pytest.param(write_bytes(b'{"version": 2}'), "invalid at version",
                     id="a state file from a newer agent names the version field"),
        pytest.param(write_bytes(b'{"version": 1, "gpus": {"GPU-1": {"uuid": "GPU-1"}}}'),
                     "invalid at gpus.GPU-1.index",
                     id="a GPU entry without its index names the field path"),
        pytest.param(write_bytes(b'{"version": 1, "kmsgSeq": "seven"}'), "invalid at kmsgSeq",
                     id="a wrongly typed field names it by its wire name"),
        pytest.param(make_directory, "cannot be read",
                     id="a directory in the file's place is set aside as unreadable"),
    ],
)  # fmt: skip
def test_an_unusable_state_file_is_moved_aside_and_the_agent_starts_clean(
    tmp_path: pathlib.Path, make: Callable[[pathlib.Path], None], problem: str
) -> None:
    """The file goes to `<name>.corrupt` with its content intact; the state is empty; the
    problem names the path, what is wrong and where the evidence went."""
    path = tmp_path / "state.json"
    make(path)
    before = path.read_bytes() if path.is_file() else None
    loaded = statefile.load(path)
    assert loaded.state == latching.NodeState()
    assert loaded.moved_to == tmp_path / "state.json.corrupt"
    assert not path.exists()
    assert loaded.moved_to.exists()
    if before is not None:
        assert loaded.moved_to.read_bytes() == before
    assert str(path) in loaded.problem
    assert problem in loaded.problem
    assert f"moved to {loaded.moved_to}" in loaded.problem
    # The clean start can be saved over the old name at once.
    statefile.save(path, latched_state())
    assert statefile.load(path).state == latched_state()


def test_a_file_that_cannot_be_moved_aside_still_starts_clean(tmp_path: pathlib.Path) -> None:
    """When even the rename fails, the agent starts empty and says both things went wrong."""
    path = tmp_path / "state.json"
    path.write_bytes(b"{not json")
    (tmp_path / "state.json.corrupt").mkdir()
    (tmp_path / "state.json.corrupt" / "blocker").write_text("x")
    loaded = statefile.load(path)
    assert loaded.state == latching.NodeState()
    assert loaded.moved_to is None
    assert "could not be moved aside" in loaded.problem
    assert path.read_bytes() == b"{not json"
