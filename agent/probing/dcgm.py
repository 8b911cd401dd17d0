"""DCGM through `dcgmi`: health watches, health checks and diagnostics.

`dcgmi` talks to an `nv-hostengine` whose address is a setting. Parsing is pure and reads
every JSON layout `dcgmi` has printed from DCGM 3.0 to 4.x (emitters: `dcgmi/Diag.cpp` and
`dcgmi/Health.cpp` at each tag of NVIDIA/DCGM; docs/agent.md lists them with the fixtures):

- 3.0-3.2 (`"DCGM GPU Diagnostic"`): per-GPU results carry `gpu_ids` ("0") and `warnings` as
  one string (3.2 adds `error_id` beside it); the deployment checks carry no GPU at all.
- 3.3.1: per-GPU results carry `gpu_id` and `warnings` as a list of {warning, error_id,
  error_category, error_severity}; a deployment check writes one result per error, each
  with `warnings` as a string and the error fields beside it, the status on the first only.
- 3.3.3-3.3.9: as 3.3.1, but a deployment error is {warnings, error_id, ...} (DCGM's own
  key) in a result whose integer `gpu_id` is never filled in (always 0).
- 4.x (`"DCGM Diagnostic"`): results carry `entity_group`/`entity_id`, each with only its own
  errors; errors of no entity (system errors, "all GPUs") appear only in each test's
  `test_summary`; the version is under `metadata` (or in the body of a runtime error).

Whatever is not tied to a GPU is a node finding, never GPU 0's. NVIDIA publishes no stable
schema, so unknown shapes produce a clear error naming the missing key instead of a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent import dcgmerrors, errors, readings


class DcgmError(errors.AgentError):
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


_NOT_PASSED = (readings.DiagStatus.FAIL, readings.DiagStatus.WARN)


def _status(raw: object) -> readings.DiagStatus | None:
    return _STATUS.get(str(raw).strip().lower())


def _int(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw.strip())
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Warning:
    message: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None


def _warnings(result: Mapping[str, Any]) -> list[_Warning]:
    """Every error of one result, whichever of the layouts printed it."""
    raw = result.get("warnings")
    if isinstance(raw, str):
        # 3.0-3.2 (and 3.3.1's deployment checks): one string, the error fields beside it.
        return [
            _Warning(
                raw,
                _int(result.get("error_id")),
                _int(result.get("error_category")),
                _int(result.get("error_severity")),
            )
        ]
    out: list[_Warning] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping):
                # 4.x and 3.3 per-GPU say "warning"; 3.3.3-3.3.9 deployment errors "warnings".
                text = item.get("warning", item.get("warnings", ""))
                out.append(
                    _Warning(
                        str(text or ""),
                        _int(item.get("error_id")),
                        _int(item.get("error_category")),
                        _int(item.get("error_severity")),
                    )
                )
            elif item is not None:
                out.append(_Warning(str(item)))
    return out


def _finding(
    test: str, status: readings.DiagStatus, warnings: Iterable[_Warning]
) -> readings.DiagFinding | None:
    if status not in (readings.DiagStatus.FAIL, readings.DiagStatus.WARN):
        return None
    listed = list(warnings)
    severities = [
        s for w in listed if (s := dcgmerrors.severity_of(w.error_id, w.severity)) is not None
    ]
    ids = [w.error_id for w in listed if w.error_id is not None]
    categories = [w.category for w in listed if w.category is not None]
    decides = dcgmerrors.precedence(severities)
    # DCGM writes one error per GPU for a node-wide condition (Fabric Manager): say it once.
    messages = dict.fromkeys(w.message for w in listed if w.message)
    return readings.DiagFinding(
        test=test,
        status=status,
        message="; ".join(messages)[:1024],
        error_id=ids[0] if ids else None,
        severity=None if decides is None else int(decides),
        category=categories[0] if categories else None,
        severities=tuple(int(s) for s in severities),
        error_ids=tuple(ids),
    )


@dataclasses.dataclass
class _Fold:
    """The per-GPU and node outcomes, as results are read."""

    status_by_gpu: dict[int, readings.DiagStatus] = dataclasses.field(default_factory=dict)
    per_gpu: dict[int, list[readings.DiagFinding]] = dataclasses.field(default_factory=dict)
    node: list[readings.DiagFinding] = dataclasses.field(default_factory=list)
    node_status: readings.DiagStatus = readings.DiagStatus.SKIP

    def gpu(self, gpu: int, status: readings.DiagStatus, f: readings.DiagFinding | None) -> None:
        current = self.status_by_gpu.get(gpu, readings.DiagStatus.SKIP)
        if _RANK[status] >= _RANK[current]:
            self.status_by_gpu[gpu] = status
        if f is not None:
            self.per_gpu.setdefault(gpu, []).append(f)

    def on_node(self, status: readings.DiagStatus, f: readings.DiagFinding | None) -> None:
        if _RANK[status] > _RANK[self.node_status]:
            self.node_status = status
        if f is not None:
            self.node.append(f)


def parse_diag(
    text: str,
    *,
    level: int,
    started_at: dt.datetime,
    finished_at: dt.datetime,
    gpu_indices: tuple[int, ...] = (),
) -> readings.DiagResult:
    """Parse `dcgmi diag -r N -j` output of DCGM 3.0 to 4.x.

    Every GPU in `gpu_indices` and every GPU a result names gets a per-GPU outcome; results
    tied to no GPU become `node_findings`, which the verdict core applies to every GPU.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        msg = f"dcgmi diag printed invalid JSON at line {err.lineno} column {err.colno}"
        raise DcgmError(msg) from err
    if not isinstance(doc, dict):
        msg = "dcgmi diag JSON: expected an object at the top level"
        raise DcgmError(msg)
    overall_raw = doc.get("Overall Result", "")
    if isinstance(doc.get("iterations"), list) and doc["iterations"]:
        doc = doc["iterations"][-1]
        if not isinstance(doc, dict):
            msg = "dcgmi diag JSON: 'iterations' holds no objects"
            raise DcgmError(msg)
    body = doc.get("DCGM Diagnostic")
    layout = "4.x"
    if body is None:
        body = doc.get("DCGM GPU Diagnostic")
        layout = "3.x"
    if not isinstance(body, dict):
        msg = "dcgmi diag JSON: neither 'DCGM Diagnostic' (4.x) nor 'DCGM GPU Diagnostic' (3.x)"
        raise DcgmError(msg)
    raw_metadata = doc.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    version = str(metadata.get("version") or body.get("version") or doc.get("version") or "")
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
                layout=layout,
            )
        msg = "dcgmi diag JSON: missing 'test_categories'"
        raise DcgmError(msg)

    fold = _Fold()
    for category in categories:
        if not isinstance(category, Mapping):
            continue
        deployment = str(category.get("category", "")).strip().lower() == "deployment"
        for test in category.get("tests") or []:
            if isinstance(test, Mapping):
                layout = _fold_test(fold, test, layout=layout, deployment=deployment)
    for gpu in gpu_indices:
        # A GPU no result names ran only the node-wide checks: their outcome is its outcome.
        fold.status_by_gpu.setdefault(gpu, fold.node_status)
    statuses = [*fold.status_by_gpu.values(), fold.node_status]
    overall = _status(overall_raw) or max(statuses, key=_RANK.__getitem__)
    if overall is readings.DiagStatus.SKIP and fold.status_by_gpu:
        overall = max(fold.status_by_gpu.values(), key=_RANK.__getitem__)
    return readings.DiagResult(
        level=level,
        started_at=started_at,
        finished_at=finished_at,
        overall=overall,
        gpus=tuple(
            readings.GpuDiag(
                gpu_index=gpu,
                status=fold.status_by_gpu[gpu],
                findings=tuple(fold.per_gpu.get(gpu, ())),
            )
            for gpu in sorted(fold.status_by_gpu)
        ),
        error=runtime_error,
        dcgm_version=version,
        node_findings=tuple(fold.node),
        layout=layout,
    )


def _fold_test(fold: _Fold, test: Mapping[str, Any], *, layout: str, deployment: bool) -> str:
    """Fold one test's results (and 4.x test summary) into `fold`; return the layout seen."""
    name = str(test.get("name", "?"))
    results = [r for r in test.get("results") or [] if isinstance(r, Mapping)]
    status: readings.DiagStatus | None = None
    seen: set[tuple[str, int | None]] = set()
    tied_fail = False
    node: dict[str, tuple[readings.DiagStatus, list[_Warning]]] = {}
    summary = test.get("test_summary")
    # DCGM sets a test's result on every entity when one check fails (`PluginTest::SetResult`),
    # and prints on each entity only its own errors (`Diag.cpp` HelperJsonAddResult). So where
    # the test has errors at all, a GPU's Fail or Warn without an error of its own is someone
    # else's failure (another GPU's, or nobody's: it is in `test_summary` only).
    has_errors = any(_warnings(r) for r in results) or (
        isinstance(summary, Mapping) and bool(_warnings(summary))
    )
    for result in results:
        # 3.3.1 writes one result per deployment error; only the first carries the status.
        status = _status(result.get("status")) or (status if "warnings" in result else None)
        if status is None:
            continue
        warnings = _warnings(result)
        seen.update((w.message, w.error_id) for w in warnings)
        if layout == "3.x":
            layout = "3.0-3.2" if "gpu_ids" in result else layout
            if "gpu_id" in result and isinstance(result["gpu_id"], str):
                layout = "3.3"
        gpus = _result_gpus(result, deployment=deployment)
        if not gpus:
            label = _entity(name, result) if "entity_group" in result else name
            worst, listed = node.get(label, (readings.DiagStatus.SKIP, []))
            node[label] = (max(worst, status, key=_RANK.__getitem__), [*listed, *warnings])
            continue
        if has_errors and not warnings and status in _NOT_PASSED:
            for gpu in gpus:
                fold.gpu(gpu, readings.DiagStatus.PASS, None)
            continue
        tied_fail = tied_fail or status is readings.DiagStatus.FAIL
        finding = _finding(name, status, warnings)
        for gpu in gpus:
            fold.gpu(gpu, status, finding)
    for label, (worst, listed) in node.items():
        fold.on_node(worst, _finding(label, worst, listed))
    if isinstance(summary, Mapping):
        # 4.x: errors of no entity appear only here; each entity's own errors appear twice.
        summary_status = _status(summary.get("status")) or readings.DiagStatus.FAIL
        rest = [w for w in _warnings(summary) if (w.message, w.error_id) not in seen]
        if rest:
            fold.on_node(summary_status, _finding(name, summary_status, rest))
        elif summary_status is readings.DiagStatus.FAIL and not tied_fail:
            only = _Warning("the test summary says Fail, naming no GPU")
            fold.on_node(summary_status, _finding(name, summary_status, [only]))
    return layout


def _entity(name: str, result: Mapping[str, Any]) -> str:
    return f"{name} ({result.get('entity_group', '?')} {result.get('entity_id', '?')})"


def _result_gpus(result: Mapping[str, Any], *, deployment: bool) -> list[int] | None:
    """The GPUs a result names; [] or None when it names none (a node finding)."""
    if "entity_id" in result or "entity_group" in result:
        if str(result.get("entity_group", "")).upper() != "GPU":
            return []
        gpu = _int(result.get("entity_id"))
        return [] if gpu is None else [gpu]
    if "gpu_ids" in result:
        raw = str(result["gpu_ids"])
        return [int(part) for part in raw.replace(" ", "").split(",") if part.isdigit()]
    if "gpu_id" in result:
        # 3.3.3-3.3.9 put an integer gpu_id on deployment errors that DCGM never fills in
        # (always 0); only the per-GPU results' string ids name a GPU.
        raw_id = result["gpu_id"]
        if deployment or not isinstance(raw_id, str) or not raw_id.strip().isdigit():
            return []
        return [int(raw_id)]
    return None


def parse_health(text: str, *, at: dt.datetime) -> readings.HealthCheck:
    """Parse `dcgmi health -c -j` output (DCGM 3.x and 4.x print the same tree).

    An entity lists only its incidents; each incident's message is split by dcgmi into pieces
    of at most 54 characters in `overflow` (`Health.cpp` AddErrorMessage), joined back here.
    Entity groups other than GPU (an NVSwitch) are node-level.
    """
    try:
        doc = json.loads(text)
        body = doc["body"]
        overall = _health_value(body["Overall Health"]["value"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        msg = f"dcgmi health JSON: cannot read 'body.Overall Health.value' ({err})"
        raise DcgmError(msg) from err
    gpus: list[readings.GpuHealth] = []
    others: list[readings.EntityHealth] = []
    for group, tree in body.items():
        if group == "Overall Health" or not isinstance(tree, Mapping):
            continue
        for entity, node in (tree.get("children") or {}).items():
            if not isinstance(node, Mapping):
                continue
            value = _health_value(node.get("value", "Healthy"))
            incidents = tuple(_incidents(node))
            if group == "GPU" and str(entity).isdigit():
                gpus.append(
                    readings.GpuHealth(gpu_index=int(entity), value=value, incidents=incidents)
                )
            else:
                others.append(
                    readings.EntityHealth(
                        entity=f"{group} {entity}", value=value, incidents=incidents
                    )
                )
    return readings.HealthCheck(at=at, overall=overall, gpus=tuple(gpus), others=tuple(others))


def _incidents(node: Mapping[str, Any]) -> list[str]:
    errors = (node.get("children") or {}).get("Errors", {}).get("children") or {}
    out: list[str] = []
    for system, detail in errors.items():
        if not isinstance(detail, Mapping):
            continue
        pieces = [str(p) for p in detail.get("overflow") or [] if str(p).strip()]
        message = " ".join(p.strip() for p in pieces) or str(detail.get("value", ""))
        out.append(f"{system}: {message}"[:1024])
    return out


def _health_value(raw: object) -> readings.HealthValue:
    text = str(raw).lower()
    if text.startswith("fail"):
        return "Failure"
    if text.startswith("warn"):
        return "Warning"
    if text.startswith(("healthy", "pass")):
        return "Healthy"
    return "Unknown"


class Dcgm:
    """Run `dcgmi` as a subprocess: set and read health watches, one diagnostic at a time.

    When to call what is `agent.dcgmwatch`'s decision; this class only runs the commands.
    """

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
        self.missing = f"dcgmi not found ({dcgmi})" if self._dcgmi is None else ""
        """Why there is no dcgmi to run ('' when there is one)."""
        self.running_level: int | None = None

    @property
    def hostengine(self) -> str:
        """The nv-hostengine address dcgmi is pointed at."""
        return self._hostengine

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
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate()
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

    async def arm(self) -> tuple[bool, str]:
        """Set health watches on every system (`dcgmi health -s a`); return (ok, detail)."""
        try:
            rc, out, err = await self._run(["health", "-s", "a"], self._command_timeout_s)
        except DcgmError as exc:
            return False, str(exc)
        if rc != 0:
            detail = (err or out).strip().splitlines()[-1:] or [f"exit code {rc}"]
            return False, f"dcgmi health -s a failed: {detail[0]}"
        return True, "health watches set"

    async def health(self) -> readings.HealthCheck:
        """Read the health watches (`dcgmi health -c -j`); anything but JSON is an error.

        A host engine without watches (it restarted) prints "Error: Health watches not
        enabled" and exits nonzero; one that is down, "Error: unable to establish a
        connection"; both raise `DcgmError` with that text, and the caller sets the watches
        again.
        """
        rc, out, err = await self._run(["health", "-c", "-j"], self._command_timeout_s)
        said = (out.strip() or err.strip()).splitlines()
        if rc != 0:
            msg = f"dcgmi health -c -j exited {rc}: {said[0][:200] if said else 'no output'}"
            raise DcgmError(msg)
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
