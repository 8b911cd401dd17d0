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

    A file that cannot be read or parsed is moved aside to `<name>.corrupt` (never deleted: it
    holds the evidence of latched faults) and the agent starts empty, because a crash-looping
    agent protects no one. `problem` says what was wrong, for the log and `/v1/gpus`.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Loaded(latching.NodeState())
    except OSError as err:
        return _set_aside(path, f"state file {path} cannot be read: {err.strerror or err}")
    try:
        return Loaded(latching.NodeState.model_validate_json(raw))
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "<document>"
        return _set_aside(path, f"state file {path} is invalid at {field}: {first['msg']}")


def _set_aside(path: pathlib.Path, problem: str) -> Loaded:
    aside = path.with_name(f"{path.name}.corrupt")
    try:
        path.replace(aside)
    except OSError as err:
        return Loaded(
            latching.NodeState(),
            problem=f"{problem}; it could not be moved aside: {err.strerror or err}",
        )
    return Loaded(latching.NodeState(), problem=f"{problem}; moved to {aside}", moved_to=aside)


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
