"""A run's results, computed: report validation, and the merge that keeps them size-capped.

Purely computational (DESIGN.md section 4): the run's pods report named metrics (a value at
a step), artifact URIs (with size and digest when known) and a short summary
(`POST /v1/runs/{ns}/{name}/results`, the same caller check and attempt fencing as
checkpoints). The controller keeps them on the TauRun's status, which must stay small: it
is listed on every reconcile pass. So:

- a metric keeps at most `Limits.points` points; past that its points are thinned
  (`thin`): the first and the newest stay, and the point whose neighbours are closest goes,
  the oldest on a tie, so a long curve keeps its shape from its first step on, evenly
  spread, instead of being refused or losing its beginning;
- a report of the same step again (an attempt resumed from a checkpoint re-runs steps)
  replaces that step's value;
- at most `Limits.metrics` metric names: a report naming one more is refused (422 naming
  the field), because dropping a metric silently would be worse;
- at most `Limits.artifacts` artifacts: the oldest go first (the newest, usually the final
  model, is the one a researcher wants); the same URI again updates its entry;
- a summary of at most `MAX_SUMMARY_BYTES`, replaced by each report that carries one.

`merge(results, reports, now, limits)` is the one function the controller applies to a
burst of reports before it writes the status once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import pydantic

from controller import errors
from controller import wire as wirebase  # `wire` here is the answer builder below
from controller.runs import records

MAX_STEP = 2**63 - 1
MAX_SUMMARY_BYTES = 4096
"""A summary is a few sentences or a small table, not a log."""
MAX_METRICS_PER_REPORT = 256
MAX_ARTIFACTS_PER_REPORT = 64
METRIC_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,62}")
"""`loss`, `val/acc`, `eval.bleu`: up to 63 characters, no spaces (matched in full)."""
URI_RE = re.compile(r"[a-z][a-z0-9+.-]{0,31}://[^\s\x00-\x1f\x7f]{1,2040}")
"""`s3://bucket/key`, `gs://…`, `file:///ckpt/model.pt`, `https://…`: a scheme, no space."""
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def _full_match(pattern: re.Pattern[str], what: str) -> Any:
    """A validator: the whole value matches (`re.fullmatch`: a trailing newline fails)."""

    def check(value: str) -> str:
        if pattern.fullmatch(value) is None:
            msg = f"must be {what}"
            raise ValueError(msg)
        return value

    return pydantic.AfterValidator(check)


MetricName = Annotated[
    str, _full_match(METRIC_NAME_RE, "a letter or '_' then up to 62 of [A-Za-z0-9_.:/-]")
]
Uri = Annotated[str, _full_match(URI_RE, "a URI with a scheme (s3://bucket/key), no spaces")]
Digest = Annotated[str, _full_match(DIGEST_RE, "sha256: and 64 lower-case hex digits")]


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much of a run's results the status keeps (settings, with these defaults)."""

    points: int = 100
    """Points per metric; past it the older points are thinned."""
    metrics: int = 16
    """Metric names per run; a report naming one more is refused."""
    artifacts: int = 32
    """Artifacts per run; past it the oldest go."""


ReportModel = wirebase.Wire
"""camelCase, frozen, unknown fields refused: a report is a trust boundary."""


class MetricReport(ReportModel):
    """One metric value at a step."""

    name: MetricName
    """Metric name (`loss`, `val/acc`)."""
    value: Annotated[float, pydantic.Field(strict=True, allow_inf_nan=False)]
    """A finite number."""
    step: Annotated[int, pydantic.Field(strict=True, ge=0, le=MAX_STEP)]
    """The training step it was measured at."""


class ArtifactReport(ReportModel):
    """An artifact the run produced."""

    uri: Uri
    """Where it is (`s3://bucket/model.pt`)."""
    size: Annotated[int, pydantic.Field(strict=True, ge=0, le=MAX_STEP)] | None = None
    """Bytes, when known."""
    digest: Digest | None = None
    """`sha256:<64 hex digits>`, when known."""


_CONTROLS = dict.fromkeys(
    [c for c in range(0x20) if c not in {0x09, 0x0A}] + [0x7F, *range(0x80, 0xA0)]
)
"""Control characters a summary loses when it is stored (all but tab and newline): `tau
results` and the web page print it, and an escape sequence (ESC, CSI) would drive the
reader's terminal (security review 3, finding 10)."""


class ResultReport(ReportModel):
    """One report from a run's pod: any of metrics, artifacts and a summary."""

    attempt: Annotated[int, pydantic.Field(strict=True, ge=1, le=MAX_STEP)]
    """The attempt that measured them (`TAU_ATTEMPT`); only the current one may report."""
    metrics: Annotated[list[MetricReport], pydantic.Field(max_length=MAX_METRICS_PER_REPORT)] = []
    artifacts: Annotated[
        list[ArtifactReport], pydantic.Field(max_length=MAX_ARTIFACTS_PER_REPORT)
    ] = []
    summary: str | None = None
    """A few lines for people (at most 4 KiB); replaces the previous summary."""

    @pydantic.field_validator("summary")
    @classmethod
    def _summary_size(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) > MAX_SUMMARY_BYTES:
            msg = f"at most {MAX_SUMMARY_BYTES} bytes"
            raise ValueError(msg)
        if value is not None and "\x00" in value:
            msg = "must not contain NUL"
            raise ValueError(msg)
        return None if value is None else value.translate(_CONTROLS)

    @pydantic.model_validator(mode="after")
    def _not_empty(self) -> ResultReport:
        if not self.metrics and not self.artifacts and self.summary is None:
            msg = "a report needs at least one of metrics, artifacts or summary"
            raise ValueError(msg)
        return self

    @property
    def size(self) -> int:
        """How much it weighs in a pending buffer (points, artifacts and the summary)."""
        return len(self.metrics) + len(self.artifacts) + (1 if self.summary is not None else 0)


def _field(loc: Sequence[int | str]) -> str:
    """`metrics[0].value` from pydantic's ('metrics', 0, 'value')."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_report(body: object) -> ResultReport:
    """Validate a report body; errors.Invalid naming the first bad field (all in `problems`)."""
    if not isinstance(body, dict):
        msg = "the body must be a JSON object with attempt and metrics, artifacts or summary"
        raise errors.Invalid(msg, field="body")
    try:
        return ResultReport.model_validate(body)
    except pydantic.ValidationError as err:
        problems = [
            {"field": _field(e["loc"]) or "body", "message": e["msg"].removeprefix("Value error, ")}
            for e in err.errors(include_url=False)
        ]
        first = problems[0]
        raise errors.Invalid(
            f"{first['field']}: {first['message']}", field=first["field"], problems=problems
        ) from err


def check_names(
    kept: records.Results | None,
    pending: Iterable[ResultReport],
    report: ResultReport,
    limits: Limits,
) -> None:
    """Refuse a report that would take the run past `limits.metrics` names (counting what is
    kept and what waits to be written); errors.Invalid names the first new name too many."""
    names = {m.name for m in kept.metrics} if kept is not None else set()
    names.update(m.name for earlier in pending for m in earlier.metrics)
    for i, metric in enumerate(report.metrics):
        if metric.name in names:
            continue
        if len(names) >= limits.metrics:
            msg = (
                f"metric {metric.name!r} would be this run's metric number {len(names) + 1}; a"
                f" run keeps at most {limits.metrics} metric names"
            )
            raise errors.Invalid(msg, field=f"metrics[{i}].name", code="TooManyMetrics")
        names.add(metric.name)


def thin(
    points: Sequence[records.MetricPoint], cap: int
) -> tuple[tuple[records.MetricPoint, ...], int]:
    """Keep at most `cap` points (at least 2): while there are too many, the point whose
    neighbours are closest together goes, the oldest such point on a tie; the first and the
    newest never go. Return the points and how many went.

    So a long series stays spread evenly over its steps, from the first one on, and the
    points that go are the older ones first (a fresh point has no near neighbour yet); one
    new point costs one old one, so what is drawn does not jump from one write to the next.
    Halving a series each time it fills would erase old history exponentially fast. A burst
    of more than twice `cap` is first taken at even intervals down to that (the greedy
    step is quadratic)."""
    cap = max(cap, 2)
    kept = list(points)
    dropped = 0
    if len(kept) > 2 * cap:
        last = len(kept) - 1
        chosen = sorted({round(i * last / (2 * cap - 1)) for i in range(2 * cap)})
        dropped += len(kept) - len(chosen)
        kept = [kept[i] for i in chosen]
    if len(kept) <= cap:
        return tuple(kept), dropped
    steps = [p.step for p in kept]
    # gaps[j]: how far apart the neighbours of point j + 1 are; the smallest goes first, and
    # list.index finds the oldest of equal ones. Removing a point changes two gaps only.
    gaps = [steps[i + 1] - steps[i - 1] for i in range(1, len(steps) - 1)]
    while len(kept) > cap:
        j = gaps.index(min(gaps))
        del kept[j + 1], steps[j + 1], gaps[j]
        if j > 0:
            gaps[j - 1] = steps[j + 1] - steps[j - 1]
        if j < len(gaps):
            gaps[j] = steps[j + 2] - steps[j]
        dropped += 1
    return tuple(kept), dropped


def merge(
    results: records.Results | None,
    reports: Iterable[ResultReport],
    now: dt.datetime,
    limits: Limits,
) -> records.Results:
    """Fold reports, in the order they came, into the kept results (see the module
    docstring); `now` stamps what they add. A metric name past the cap is skipped here (the
    API refuses it first, with `check_names`). Each series is thinned once, after the whole
    burst is in."""
    out = results or records.Results()
    order = [s.name for s in out.metrics]
    kept = {s.name: s for s in out.metrics}
    added: dict[str, dict[int, records.MetricPoint]] = {}
    artifacts = list(out.artifacts)
    dropped = out.artifacts_dropped
    summary, summary_time = out.summary, out.summary_time
    count = out.reports
    for report in reports:
        count += 1
        for metric in report.metrics:
            if metric.name not in kept and metric.name not in added:
                if len(order) >= limits.metrics:
                    continue
                order.append(metric.name)
            # Validated already: built without validating again (a burst has thousands).
            point = records.MetricPoint.model_construct(
                step=metric.step, value=metric.value, time=now
            )
            added.setdefault(metric.name, {})[metric.step] = point
        for art in report.artifacts:
            entry = records.Artifact(
                uri=art.uri, size=art.size, digest=art.digest, attempt=report.attempt, time=now
            )
            artifacts = [a for a in artifacts if a.uri != art.uri]
            artifacts.append(entry)
        if len(artifacts) > limits.artifacts:
            dropped += len(artifacts) - limits.artifacts
            artifacts = artifacts[-limits.artifacts :]
        if report.summary is not None:
            summary, summary_time = report.summary, now
    metrics = []
    for name in order:
        old = kept.get(name) or records.MetricSeries(name=name)
        if name not in added:
            metrics.append(old)
            continue
        by_step = {p.step: p for p in old.points}
        by_step.update(added[name])
        points, gone = thin([by_step[k] for k in sorted(by_step)], limits.points)
        metrics.append(records.MetricSeries(name=name, points=points, thinned=old.thinned + gone))
    return records.Results(
        metrics=tuple(metrics), artifacts=tuple(artifacts), artifacts_dropped=dropped,
        summary=summary, summary_time=summary_time, reports=count,
        updated_time=now if count != out.reports else out.updated_time,
    )  # fmt: skip


def wire(results: records.Results | None, *, metric: str | None = None) -> dict[str, Any]:
    """The results as the API shows them: each metric with its last point (and, with
    `metric`, only that one); camelCase, RFC 3339 times."""
    res = results or records.Results()
    body = res.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["metrics"] = [
        {**raw, "last": raw["points"][-1] if raw["points"] else None}
        for series, raw in zip(res.metrics, body.get("metrics", []), strict=True)
        if metric is None or series.name == metric
    ]
    return body


def finals(results: records.Results | None) -> dict[str, dict[str, Any]]:
    """The newest point of each metric, by name (an experiment's runs side by side)."""
    res = results or records.Results()
    return {
        s.name: s.points[-1].model_dump(mode="json", by_alias=True) for s in res.metrics if s.points
    }
