"""Checkpoint reports, computed: validation, attempt fencing, the kept list, the file.

Purely computational (DESIGN.md section 7): the run's pods report each checkpoint they save
(`POST /v1/runs/{ns}/{name}/checkpoints` with the run-scoped token); these functions decide
whether a report is accepted and what the TauRun's `status.checkpoints` and the per-run
ConfigMap become. `now` is always an argument.

Fencing: a report names the attempt that wrote it (`TAU_ATTEMPT`). Once attempt N+1
exists, attempt N is over, even while its pods still run out their SIGTERM grace: a report
from it is refused, so a late writer can never replace the checkpoint the next attempt
resumes from. A report from an attempt that does not exist yet is refused too.

Confinement (DESIGN.md section 10): a reported path, and a checkpoint a resume names, must
lie under the run's `checkpoint.dir` once normalised (`..` cannot climb out), so what the
next attempt is told to load (`TAU_RESUME_FROM`) is always inside the run's own checkpoint
storage. A run that declares no `checkpoint` has no checkpoint directory and takes none.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import posixpath
from collections.abc import Sequence
from typing import Annotated, Any, Protocol

import pydantic

from controller import errors
from controller import wire as wirebase  # `wire` here is the answer builder below
from controller.runs import records
from shared import patterns

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


def _one_line(value: str) -> str:
    if not value.strip() or any(c in value for c in "\x00\r\n"):
        msg = f"must be one non-blank line of at most {MAX_PATH} characters"
        raise ValueError(msg)
    return value


CheckpointPath = Annotated[
    str,
    pydantic.StringConstraints(min_length=1, max_length=MAX_PATH),
    pydantic.AfterValidator(_one_line),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(r"[^\x00\r\n]*\S[^\x00\r\n]*")}),
]
"""A checkpoint's path: one line, no NUL (it is written into a ConfigMap and a pod's env)."""


class ReportBody(wirebase.Wire):
    """The body of `POST /v1/runs/{ns}/{name}/checkpoints` (`tau checkpoint --step N --path P`)."""

    attempt: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1, le=MAX_STEP)]
    """The attempt that saved it (`TAU_ATTEMPT`); only the run's current attempt may report."""
    step: Annotated[int, pydantic.Strict(), pydantic.Field(ge=0, le=MAX_STEP)]
    """The training step it holds."""
    path: CheckpointPath
    """Where it is, inside the run's pods: under the run's `checkpoint.dir` (else a 422)."""


def parse_report(body: object) -> Report:
    """Validate a report body (`{"attempt": 2, "step": 200, "path": "/ckpt/step-200"}`)."""
    try:
        parsed = ReportBody.model_validate(body)
    except pydantic.ValidationError as err:
        first = err.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        msg = f"{field}: {first['msg']}" if first["loc"] else (
            "the body must be a JSON object with attempt, step and path")  # fmt: skip
        raise ReportError(field, msg) from err
    return Report(attempt=parsed.attempt, step=parsed.step, path=parsed.path)


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


def confine(path: str, directory: str | None, *, field: str = "path") -> str:
    """`path` normalised, when it lies under `directory` (the run's `checkpoint.dir`);
    ReportError naming `field` otherwise (see the module docstring)."""
    if not directory:
        msg = (
            "this run declares no checkpoint directory, so it takes no checkpoint: add"
            " `checkpoint: {dir: /ckpt}` to its tau.yaml"
        )
        raise ReportError(field, msg)
    root = posixpath.normpath(directory)
    normal = posixpath.normpath(path)
    if not posixpath.isabs(normal) or (
        normal != root and not normal.startswith(root.rstrip("/") + "/")
    ):
        msg = f"{field} {path[:200]!r} is not under the run's checkpoint directory {root}"
        raise ReportError(field, msg)
    return normal


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


def trusted(path: str, directory: str | None) -> str:
    """`path` normalised when it lies under `directory`, else '' (start fresh).

    A path read back from a TauRun's status is checked again where it is used (security
    review 3, finding 6): status is the controller's record, but whoever may write
    `tauruns/status` could have put any path there, and the next attempt would load it."""
    if not path:
        return ""
    try:
        return confine(path, directory)
    except ReportError:
        return ""


def latest_under(status: records.RunStatus, directory: str | None) -> str:
    """The newest checkpoint path of a TauRun status that lies under `directory`, or ''."""
    for checkpoint in reversed(status.checkpoints):
        if path := trusted(checkpoint.path, directory):
            return path
    return ""


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
