"""A run's results, computed: reports validated naming the field, merged size-capped."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest

from controller import errors
from controller.runs import records, results

T0 = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.UTC)
SHA = "sha256:" + "a" * 64


def report(attempt: int = 1, **body: Any) -> results.ResultReport:
    return results.parse_report({"attempt": attempt, **body})


def loss(*steps: int, value: float = 0.5) -> results.ResultReport:
    return report(metrics=[{"name": "loss", "value": value, "step": s} for s in steps])


def points(*steps: int) -> tuple[records.MetricPoint, ...]:
    return tuple(records.MetricPoint(step=s, value=float(s), time=T0) for s in steps)


# ---------------------------------------------------------------------- validation
def test_a_full_report_reads_as_sent() -> None:
    """attempt, metrics, artifacts with size and digest, and a summary: what `tau result` sends."""
    got = report(
        2, metrics=[{"name": "val/acc", "value": 0.91, "step": 900}],
        artifacts=[{"uri": "s3://b/model.pt", "size": 10, "digest": SHA}], summary="done",
    )  # fmt: skip
    assert (got.attempt, got.metrics[0].name, got.artifacts[0].digest, got.summary) == (
        2, "val/acc", SHA, "done",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param([1], "body", id="a body that is not an object"),
        pytest.param({"metrics": []}, "attempt", id="no attempt"),
        pytest.param({"attempt": 1}, "body", id="nothing reported"),
        pytest.param({"attempt": True, "summary": "s"}, "attempt", id="a boolean attempt"),
        pytest.param({"attempt": 1, "metrics": [{"name": "loss", "value": float("nan"),
                      "step": 1}]}, "metrics[0].value", id="a NaN value"),
        pytest.param({"attempt": 1, "metrics": [{"name": "loss", "value": float("inf"),
                      "step": 1}]}, "metrics[0].value", id="an infinite value"),
        pytest.param({"attempt": 1, "metrics": [{"name": "loss", "value": "0.1", "step": 1}]},
                     "metrics[0].value", id="a value given as a string"),
        pytest.param({"attempt": 1, "metrics": [{"name": "loss", "value": 1, "step": -1}]},
                     "metrics[0].step", id="a negative step"),
        pytest.param({"attempt": 1, "metrics": [{"name": "loss\n", "value": 1, "step": 1}]},
                     "metrics[0].name", id="a name with a trailing newline"),
        pytest.param({"attempt": 1, "metrics": [{"name": "a b", "value": 1, "step": 1}]},
                     "metrics[0].name", id="a name with a space"),
        pytest.param({"attempt": 1, "artifacts": [{"uri": "model.pt"}]}, "artifacts[0].uri",
                     id="a URI without a scheme"),
        pytest.param({"attempt": 1, "artifacts": [{"uri": "s3://b/k\n"}]}, "artifacts[0].uri",
                     id="a URI with a trailing newline"),
        pytest.param({"attempt": 1, "artifacts": [{"uri": "s3://b/k", "digest": "md5:1"}]},
                     "artifacts[0].digest", id="a digest that is not sha256"),
        pytest.param({"attempt": 1, "artifacts": [{"uri": "s3://b/k", "size": -1}]},
                     "artifacts[0].size", id="a negative size"),
        pytest.param({"attempt": 1, "summary": "x" * 4097}, "summary", id="a summary over 4 KiB"),
        pytest.param({"attempt": 1, "summary": "s", "loss": 1}, "loss", id="an unknown field"),
    ],
)  # fmt: skip
def test_a_bad_report_names_its_field(body: Any, field: str) -> None:
    """Each problem is a 422 (Invalid) naming the field it concerns."""
    with pytest.raises(errors.Invalid) as err:
        results.parse_report(body)
    assert field == err.value.field


def test_one_metric_name_too_many_is_refused_naming_it() -> None:
    """Names kept and names waiting to be written count; a known name is always fine."""
    limits = results.Limits(metrics=2)
    kept = results.merge(None, [loss(1)], T0, limits)
    pending = [report(metrics=[{"name": "acc", "value": 1, "step": 1}])]
    results.check_names(kept, pending, loss(2), limits)
    with pytest.raises(errors.Invalid) as err:
        results.check_names(
            kept, pending, report(metrics=[{"name": "loss", "value": 1, "step": 3},
                                           {"name": "lr", "value": 1, "step": 3}]), limits,
        )  # fmt: skip
    assert (err.value.field, err.value.code) == ("metrics[1].name", "TooManyMetrics")


# ---------------------------------------------------------------------- thinning
@pytest.mark.parametrize(
    ("steps", "cap", "kept", "dropped"),
    [
        pytest.param(range(5), 5, [0, 1, 2, 3, 4], 0, id="at the cap nothing goes"),
        pytest.param(range(6), 5, [0, 2, 3, 4, 5], 1,
                     id="one over: the oldest of evenly spaced points goes, not the first"),
        pytest.param((0, 1, 2, 3, 50, 100), 4, [0, 3, 50, 100], 2,
                     id="the crowded points go first, the lone ones stay"),
        pytest.param(range(3), 2, [0, 2], 1, id="a cap of two keeps the first and the newest"),
        pytest.param(range(100), 10, [0, 16, 26, 42, 52, 63, 73, 83, 89, 99], 90,
                     id="far over: the series stays spread over its steps"),
    ],
)  # fmt: skip
def test_thinning_keeps_the_first_and_the_newest_and_spreads_the_rest(
    steps: range, cap: int, kept: list[int], dropped: int
) -> None:
    """`thin` drops the point whose neighbours are closest (the oldest on a tie)."""
    out, gone = results.thin(points(*steps), cap)
    assert (kept, dropped) == ([p.step for p in out], gone)


# ---------------------------------------------------------------------- merging
def test_a_burst_merges_into_one_series_per_metric_in_step_order() -> None:
    """Reports fold in order; points sort by step wherever they arrive; a step reported
    again (an attempt resumed from a checkpoint) replaces that step's value."""
    merged = results.merge(
        None, [loss(100, 200), loss(50), loss(200, value=0.25), report(summary="half way")],
        T0, results.Limits(),
    )  # fmt: skip
    (series,) = merged.metrics
    assert [(p.step, p.value) for p in series.points] == [(50, 0.5), (100, 0.5), (200, 0.25)]
    assert (merged.reports, merged.summary, merged.updated_time) == (4, "half way", T0)


def test_a_long_run_stays_under_the_point_cap_and_counts_what_thinning_dropped() -> None:
    """A thousand steps, one report each, never hold more than the cap; the first and the
    newest step stay, the rest stay spread over the whole run (no gap wider than a tenth of
    it), and `thinned` says how many went."""
    limits = results.Limits(points=20)
    kept: records.Results | None = None
    for step in range(1000):
        kept = results.merge(kept, [loss(step)], T0, limits)
    assert kept is not None
    (series,) = kept.metrics
    steps = [p.step for p in series.points]
    widest = max(b - a for a, b in itertools.pairwise(steps))
    assert (len(steps), steps[0], steps[-1], widest < 100) == (20, 0, 999, True)
    assert series.thinned == 1000 - len(series.points)


def test_artifacts_keep_the_newest_and_update_by_uri() -> None:
    """The same URI updates its entry (and moves last); past the cap the oldest go, counted."""
    limits = results.Limits(artifacts=2)
    merged = results.merge(
        None,
        [report(artifacts=[{"uri": "s3://b/1"}, {"uri": "s3://b/2"}]),
         report(2, artifacts=[{"uri": "s3://b/1", "size": 7}]),
         report(2, artifacts=[{"uri": "s3://b/3", "digest": SHA}])],
        T0, limits,
    )  # fmt: skip
    assert [(a.uri, a.size, a.attempt) for a in merged.artifacts] == [
        ("s3://b/1", 7, 2), ("s3://b/3", None, 2),
    ]  # fmt: skip
    assert merged.artifacts_dropped == 1


def test_a_metric_past_the_name_cap_is_skipped_when_merging() -> None:
    """The API refuses it first; merging never grows past the cap either."""
    merged = results.merge(
        None, [loss(1), report(metrics=[{"name": "acc", "value": 1, "step": 1}])], T0,
        results.Limits(metrics=1),
    )  # fmt: skip
    assert [s.name for s in merged.metrics] == ["loss"]


def test_the_api_view_gives_each_metric_its_last_point_and_filters_by_name() -> None:
    """`wire` adds `last`; with a metric name, only that series; `finals` by name."""
    merged = results.merge(
        None, [loss(1, 2), report(metrics=[{"name": "acc", "value": 0.9, "step": 2}])], T0,
        results.Limits(),
    )  # fmt: skip
    body = results.wire(merged, metric="loss")
    assert [m["name"] for m in body["metrics"]] == ["loss"]
    assert body["metrics"][0]["last"] == {"step": 2, "value": 0.5, "time": "2026-01-01T03:00:00Z"}
    assert results.finals(merged)["acc"]["value"] == 0.9
    assert results.wire(None) == {"metrics": [], "artifacts": [], "artifactsDropped": 0,
                                  "summary": "", "reports": 0}  # fmt: skip


def test_merged_results_survive_the_status_round_trip() -> None:
    """What the merge makes is what the status reads back (camelCase on the cluster)."""
    merged = results.merge(None, [loss(1), report(summary="s")], T0, results.Limits())
    status = records.RunStatus(results=merged)
    assert records.read(records.wire(status)) == status


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        pytest.param("\x1b[2Jcleared", "[2Jcleared", id="ESC of a CSI sequence is dropped"),
        pytest.param("t\x1b]0;title\x07x", "t]0;titlex", id="an OSC title sequence is disarmed"),
        pytest.param("a\x9bb\x7fc", "abc", id="C1 CSI and DEL are dropped"),
        pytest.param("line 1\n\tline 2", "line 1\n\tline 2", id="newline and tab stay"),
    ],
)  # fmt: skip
def test_a_summary_is_stored_without_control_characters(summary: str, expected: str) -> None:
    """Review 3, finding 10: what `tau results` and the web page print cannot drive a
    terminal, whatever a run's pod reported."""
    assert expected == results.parse_report({"attempt": 1, "summary": summary}).summary
