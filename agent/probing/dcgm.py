"""DCGM through `dcgmi`: health watches, health checks and diagnostics.

`dcgmi` talks to an `nv-hostengine` whose address is a setting. Parsing is pure and accepts both
the DCGM 3.x (`"DCGM GPU Diagnostic"`, `gpu_id`) and 4.x (`"DCGM Diagnostic"`, entity fields)
JSON layouts (reference nvml-dcgm.md section 4). NVIDIA publishes no stable schema, so unknown
shapes produce a clear error naming the missing key instead of a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from agent import readings


class DcgmError(Exception):
    """A dcgmi call failed or printed something we cannot read."""


class DiagBusyError(DcgmError):
    """A diagnostic is already running; DCGM runs one at a time."""


_STATUS = {
    "pass": readings.DiagStatus.PASS,
    "passed": readings.DiagStatus.PASS,
    "warn": readings.DiagStatus.WARN,
    "warning": readings.DiagStatus.WARN,
    "fail": readings.DiagStatus.FAIL,
    "failed": readings.DiagStatus.FAIL,
    "skip": readings.DiagStatus.SKIP,
    "skipped": readings.DiagStatus.SKIP,
}
_RANK = {
    readings.DiagStatus.SKIP: 0,
    readings.DiagStatus.PASS: 1,
    readings.DiagStatus.WARN: 2,
    readings.DiagStatus.FAIL: 3,
}


def _status(raw: object) -> readings.DiagStatus | None:
    return _STATUS.get(str(raw).strip().lower())


def parse_diag(
    text: str,
    *,
    level: int,
    started_at: dt.datetime,
    finished_at: dt.datetime,
    gpu_indices: tuple[int, ...] = (),
) -> readings.DiagResult:
    """Parse `dcgmi diag -r N -j` output of DCGM 3.x or 4.x.

    Results without a GPU (the software checks) apply to every GPU in `gpu_indices` and every GPU
    any other result names.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        msg = f"dcgmi diag printed invalid JSON at line {err.lineno} column {err.colno}"
        raise DcgmError(msg) from err
    if not isinstance(doc, dict):
        msg = "dcgmi diag JSON: expected an object at the top level"
        raise DcgmError(msg)
    if "iterations" in doc and isinstance(doc["iterations"], list) and doc["iterations"]:
        doc = doc["iterations"][-1]
    body = doc.get("DCGM Diagnostic")
    version = str(doc.get("metadata", {}).get("version", "")) if body is not None else ""
    if body is None:
        body = doc.get("DCGM GPU Diagnostic")
        version = str(doc.get("version", "3.x"))
    if not isinstance(body, dict):
        msg = "dcgmi diag JSON: neither 'DCGM Diagnostic' (4.x) nor 'DCGM GPU Diagnostic' (3.x)"
        raise DcgmError(msg)
    runtime_error = str(body.get("runtime_error", "") or "")
    categories = body.get("test_categories")
    if not isinstance(categories, list):
        if runtime_error:
            return readings.DiagResult(
                level=level,
                started_at=started_at,
                finished_at=finished_at,
                overall=readings.DiagStatus.FAIL,
                error=runtime_error,
                dcgm_version=version,
            )
        msg = "dcgmi diag JSON: missing 'test_categories'"
        raise DcgmError(msg)

    per_gpu: dict[int, list[readings.DiagFinding]] = {}
    status_by_gpu: dict[int, readings.DiagStatus] = {}
    everyone: list[tuple[readings.DiagStatus, readings.DiagFinding | None]] = []
    for category in categories:
        for test in category.get("tests", []):
            name = str(test.get("name", "?"))
            for result in test.get("results", []):
                status = _status(result.get("status"))
                if status is None:
                    continue
                finding = _finding(name, status, result)
                gpus = _result_gpus(result)
                if gpus is None:
                    everyone.append((status, finding))
                    continue
                for gpu in gpus:
                    _merge(status_by_gpu, per_gpu, gpu, status, finding)
    for gpu in {*gpu_indices, *status_by_gpu}:
        for status, finding in everyone:
            _merge(status_by_gpu, per_gpu, gpu, status, finding)
    overall = _status(doc.get("Overall Result", "")) or max(
        status_by_gpu.values(), key=_RANK.__getitem__, default=readings.DiagStatus.PASS
    )
    return readings.DiagResult(
        level=level,
        started_at=started_at,
        finished_at=finished_at,
        overall=overall,
        gpus=tuple(
            readings.GpuDiag(
                gpu_index=gpu, status=status_by_gpu[gpu], findings=tuple(per_gpu.get(gpu, ()))
            )
            for gpu in sorted(status_by_gpu)
        ),
        error=runtime_error,
        dcgm_version=version,
    )


def _merge(
    status_by_gpu: dict[int, readings.DiagStatus],
    per_gpu: dict[int, list[readings.DiagFinding]],
    gpu: int,
    status: readings.DiagStatus,
    finding: readings.DiagFinding | None,
) -> None:
    current = status_by_gpu.get(gpu, readings.DiagStatus.SKIP)
    if _RANK[status] > _RANK[current]:
        status_by_gpu[gpu] = status
    else:
        status_by_gpu.setdefault(gpu, current)
    if finding is not None:
        per_gpu.setdefault(gpu, []).append(finding)


def _result_gpus(result: Mapping[str, Any]) -> list[int] | None:
    if "entity_id" in result:
        if str(result.get("entity_group", "GPU")).upper() != "GPU":
            return []
        return [int(result["entity_id"])]
    for key in ("gpu_id", "gpu_ids"):
        if key in result:
            raw = str(result[key])
            return [int(part) for part in raw.replace(" ", "").split(",") if part.isdigit()]
    return None


def _finding(
    test: str, status: readings.DiagStatus, result: Mapping[str, Any]
) -> readings.DiagFinding | None:
    if status not in (readings.DiagStatus.FAIL, readings.DiagStatus.WARN):
        return None
    warnings = result.get("warnings") or []
    messages: list[str] = []
    error_id: int | None = None
    severity: int | None = None
    for warning in warnings:
        if isinstance(warning, dict):
            messages.append(str(warning.get("warning", "")))
            if warning.get("error_id") is not None:
                error_id = int(warning["error_id"])
            if warning.get("error_severity") is not None:
                value = int(warning["error_severity"])
                severity = value if severity is None else max(severity, value)
        else:
            messages.append(str(warning))
    return readings.DiagFinding(
        test=test,
        status=status,
        message="; ".join(m for m in messages if m)[:1024],
        error_id=error_id,
        severity=severity,
    )


def parse_health(text: str, *, at: dt.datetime) -> readings.HealthCheck:
    """Parse `dcgmi health -c -j` output."""
    try:
        doc = json.loads(text)
        body = doc["body"]
        overall = _health_value(body["Overall Health"]["value"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        msg = f"dcgmi health JSON: cannot read 'body.Overall Health.value' ({err})"
        raise DcgmError(msg) from err
    gpus: list[readings.GpuHealth] = []
    for index, node in (body.get("GPU", {}).get("children") or {}).items():
        incidents: list[str] = []
        errors = (node.get("children") or {}).get("Errors", {}).get("children") or {}
        for system, detail in errors.items():
            messages = detail.get("overflow") or [detail.get("value", "")]
            incidents.extend(f"{system}: {message}" for message in messages)
        gpus.append(
            readings.GpuHealth(
                gpu_index=int(index),
                value=_health_value(node.get("value", "Healthy")),
                incidents=tuple(incidents),
            )
        )
    return readings.HealthCheck(at=at, overall=overall, gpus=tuple(gpus))


def _health_value(raw: object) -> readings.HealthValue:
    text = str(raw).lower()
    if text.startswith("fail"):
        return "Failure"
    if text.startswith("warn"):
        return "Warning"
    return "Healthy"


class Dcgm:
    """Run `dcgmi` as a subprocess: watches at start, health reads, one diagnostic at a time."""

    def __init__(
        self,
        dcgmi: str,
        hostengine: str,
        *,
        command_timeout_s: float,
        diag_timeout_s: Callable[[int], float],
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._dcgmi = shutil.which(dcgmi)
        self._hostengine = hostengine
        self._command_timeout_s = command_timeout_s
        self._diag_timeout_s = diag_timeout_s
        self._clock = clock
        self._diag_lock = asyncio.Lock()
        self.status = readings.DcgmStatus(
            available=False,
            detail=f"dcgmi not found ({dcgmi})" if self._dcgmi is None else "not started",
            hostengine=hostengine,
        )
        self.running_level: int | None = None

    @property
    def installed(self) -> bool:
        """Say whether a `dcgmi` executable was found."""
        return self._dcgmi is not None

    @property
    def diag_running(self) -> bool:
        """Say whether a diagnostic is in progress."""
        return self._diag_lock.locked()

    async def _run(self, args: list[str], timeout_s: float) -> tuple[int, str, str]:
        if self._dcgmi is None:
            msg = "dcgmi is not installed"
            raise DcgmError(msg)
        proc = await asyncio.create_subprocess_exec(
            self._dcgmi,
            *args,
            "--host",
            self._hostengine,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            msg = f"dcgmi {' '.join(args)} timed out after {timeout_s:g} s"
            raise DcgmError(msg) from exc
        except asyncio.CancelledError:
            # Shutdown: never leave a level-3 diagnostic running for 45 minutes behind us.
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(proc.wait())
            raise
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def start(self) -> readings.DcgmStatus:
        """Set health watches on every system (`dcgmi health -s a`)."""
        if self._dcgmi is None:
            return self.status
        try:
            rc, out, err = await self._run(["health", "-s", "a"], self._command_timeout_s)
        except DcgmError as exc:
            self.status = readings.DcgmStatus(False, str(exc), self._hostengine)
            return self.status
        if rc != 0:
            detail = (err or out).strip().splitlines()[-1:] or [f"exit code {rc}"]
            self.status = readings.DcgmStatus(
                False, f"dcgmi health -s a failed: {detail[0]}", self._hostengine
            )
        else:
            self.status = readings.DcgmStatus(True, "health watches set", self._hostengine)
        return self.status

    async def health(self) -> readings.HealthCheck:
        """Read the health watches (`dcgmi health -c -j`)."""
        _rc, out, err = await self._run(["health", "-c", "-j"], self._command_timeout_s)
        if not out.strip():
            msg = f"dcgmi health -c -j printed nothing: {err.strip()[:200]}"
            raise DcgmError(msg)
        return parse_health(out, at=self._clock())

    async def diag(self, level: int, gpu_indices: tuple[int, ...] = ()) -> readings.DiagResult:
        """Run `dcgmi diag -r level -j`; raise `DiagBusyError` when one is already running."""
        if level not in (1, 2, 3):
            msg = f"level: must be 1, 2 or 3, got {level}"
            raise ValueError(msg)
        if self._diag_lock.locked():
            msg = f"a level-{self.running_level} diagnostic is already running"
            raise DiagBusyError(msg)
        async with self._diag_lock:
            self.running_level = level
            started = self._clock()
            try:
                _rc, out, _err = await self._run(
                    ["diag", "-r", str(level), "-j"], self._diag_timeout_s(level)
                )
                return parse_diag(
                    out,
                    level=level,
                    started_at=started,
                    finished_at=self._clock(),
                    gpu_indices=gpu_indices,
                )
            except DcgmError as exc:
                return readings.DiagResult(
                    level=level,
                    started_at=started,
                    finished_at=self._clock(),
                    overall=readings.DiagStatus.FAIL,
                    error=str(exc),
                )
            finally:
                self.running_level = None
