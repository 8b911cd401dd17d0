"""The latched-fault state file: read at start, written atomically after every change.

It lives on a hostPath so latched faults survive agent restarts and upgrades.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile

import pydantic

from agent import latching


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """The state read from disk, and what was wrong with the file if it could not be used."""

    state: latching.NodeState
    problem: str = ""
    moved_to: pathlib.Path | None = None


def load(path: pathlib.Path) -> Loaded:
    """Read the state file; a missing file is an empty state.

    A file that cannot be parsed is moved aside (never deleted: it holds the evidence of latched
    faults) and the agent starts empty, because a crash-looping agent protects no one.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Loaded(latching.NodeState())
    try:
        return Loaded(latching.NodeState.model_validate_json(raw))
    except pydantic.ValidationError as err:
        aside = path.with_name(f"{path.name}.corrupt")
        path.replace(aside)
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "<document>"
        return Loaded(
            latching.NodeState(),
            problem=f"state file {path} is invalid at {field}: {first['msg']}",
            moved_to=aside,
        )


def save(path: pathlib.Path, state: latching.NodeState) -> None:
    """Write the state atomically: a temp file in the same directory, fsync, rename, fsync dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = state.model_dump_json(by_alias=True, indent=1).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        pathlib.Path(tmp).replace(path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
