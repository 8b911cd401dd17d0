"""Checkpoint reports, computed: validation, attempt fencing, the kept list, the file.

Purely computational (DESIGN.md section 7): the run's pods report each checkpoint they save
(`POST /v1/runs/{ns}/{name}/checkpoints` with the run-scoped token); these functions decide
whether a report is accepted and what the TauRun's `status.checkpoints` and the per-run
ConfigMap become. `now` is always an argument.

Fencing: a report names the attempt that wrote it (`TAU_ATTEMPT`). Once attempt N+1
exists, attempt N is over, even while its pods still run out their SIGTERM grace: a report
from it is refused, so a late writer can never replace the checkpoint the next attempt
resumes from. A report from an attempt that does not exist yet is refused too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from controller import errors
from controller.runs import records

MAX_PATH = 4096
MAX_STEP = 2**63 - 1
DEFAULT_KEEP = 10
"""Checkpoints kept in the TauRun's status (the newest; older ones stay in the storage)."""

FILE_KEY = "latest"
"""ConfigMap key (and file name) holding the latest checkpoint's path, nothing else."""
JSON_KEY = "latest.json"
"""ConfigMap key (and file name) holding the latest checkpoint as JSON."""


class ReportError(errors.Invalid):
    """A report that cannot be accepted; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


class FencedError(errors.Conflict):
    """A report from an attempt that is not the current one; `reason` says which way."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, field="attempt", code=reason)

    @property
    def reason(self) -> str:
        """`StaleAttempt` (an attempt that is over) or `UnknownAttempt` (one not begun)."""
        return self.code


@dataclasses.dataclass(frozen=True)
class Report:
    """One checkpoint as a run reports it."""

    attempt: int
    step: int
    path: str


def _int(body: Mapping[str, Any], field: str, low: int) -> int:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{field} must be an integer"
        raise ReportError(field, msg)
    if not low <= value <= MAX_STEP:
        msg = f"{field} must be at least {low}"
        raise ReportError(field, msg)
    return value


def parse_report(body: object) -> Report:
    """Validate a report body (`{"attempt": 2, "step": 200, "path": "/ckpt/step-200"}`)."""
    if not isinstance(body, Mapping):
        msg = "the body must be a JSON object with attempt, step and path"
        raise ReportError("body", msg)
    unknown = sorted(set(body) - {"attempt", "step", "path"})
    if unknown:
        msg = f"unknown field {unknown[0]!r}; allowed: attempt, step, path"
        raise ReportError(unknown[0], msg)
    attempt = _int(body, "attempt", 1)
    step = _int(body, "step", 0)
    path = body.get("path")
    if not isinstance(path, str) or not path.strip():
        msg = "path must be a non-empty string"
        raise ReportError("path", msg)
    if len(path) > MAX_PATH or "\n" in path or "\x00" in path:
        msg = f"path must be one line of at most {MAX_PATH} characters"
        raise ReportError("path", msg)
    return Report(attempt=attempt, step=step, path=path)


class FromAttempt(Protocol):
    """A report naming the attempt that made it (a checkpoint, a results report)."""

    @property
    def attempt(self) -> int:
        """`TAU_ATTEMPT` of the pod that reported."""
        ...


def fence(report: FromAttempt, current_attempt: int) -> None:
    """Refuse a report that is not from the current attempt (see the module docstring)."""
    if report.attempt < current_attempt:
        msg = (
            f"attempt {report.attempt} is over: attempt {current_attempt} is the run's current"
            " one, and only it may report checkpoints"
        )
        raise FencedError("StaleAttempt", msg)
    if report.attempt > current_attempt:
        msg = (
            f"attempt {report.attempt} does not exist: the run's current attempt is"
            f" {current_attempt}"
        )
        raise FencedError("UnknownAttempt", msg)


def record(report: Report, now: dt.datetime) -> records.Checkpoint:
    """An accepted checkpoint, as `status.checkpoints[]` keeps it."""
    return records.Checkpoint(attempt=report.attempt, step=report.step, path=report.path, time=now)


def add(
    kept: Sequence[records.Checkpoint], new: records.Checkpoint, keep: int = DEFAULT_KEEP
) -> tuple[records.Checkpoint, ...]:
    """Append `new` and keep the newest `keep` (the list is in report order: newest last)."""
    return (*kept, new)[-max(keep, 1) :]


def latest(status: records.RunStatus) -> records.Checkpoint | None:
    """The newest checkpoint in a TauRun status, or None."""
    return status.checkpoints[-1] if status.checkpoints else None


def wire(checkpoint: records.Checkpoint) -> dict[str, Any]:
    """A checkpoint as the API and the ConfigMap show it (camelCase, RFC 3339 time)."""
    return checkpoint.model_dump(mode="json", by_alias=True)


def configmap_data(checkpoint: records.Checkpoint | None) -> dict[str, str]:
    """The per-run ConfigMap's data: the path alone (easy to read from a shell) and the
    whole record as JSON. Empty strings mean no checkpoint yet."""
    if checkpoint is None:
        return {FILE_KEY: "", JSON_KEY: ""}
    return {
        FILE_KEY: checkpoint.path,
        JSON_KEY: json.dumps(wire(checkpoint), sort_keys=True, separators=(",", ":")),
    }
