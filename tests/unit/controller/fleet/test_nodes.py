"""Parsing a raw Node into the view the policy reads, and the bounded history annotation."""

from __future__ import annotations

import datetime as dt

import pytest

from controller import marks
from controller.fleet import history, nodes
from tests.unit.controller.fleet import fakes
from tests.unit.controller.fleet.fakes import at


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            fakes.raw_node("n1"),
            ("n1", 8, True, False, False, False),
            id="a plain GPU node is managed and unmarked",
        ),
        pytest.param(
            fakes.raw_node("n1", labels={marks.MANAGED_LABEL: "false"}),
            ("n1", 8, False, False, False, False),
            id="the opt-out label unmanages a node",
        ),
        pytest.param(
            fakes.raw_node("n1", gpus=0),
            ("n1", 0, True, False, False, False),
            id="a node without GPUs has no GPU capacity",
        ),
        pytest.param(
            fakes.raw_node(
                "n1",
                unschedulable=True,
                annotations={marks.CORDONED_ANNOTATION: "true"},
                taints=[{"key": marks.TAINT_KEY, "effect": "NoSchedule"}],
            ),
            ("n1", 8, True, True, True, True),
            id="our taint and our cordon are recognised",
        ),
        pytest.param(
            fakes.raw_node("n1", taints=[{"key": marks.TAINT_KEY, "effect": "NoExecute"}]),
            ("n1", 8, True, False, False, False),
            id="a taint with our key but another effect is not ours",
        ),
    ],
)
def test_parse_reads_what_the_policy_needs(
    raw: dict[str, object], expected: tuple[object, ...]
) -> None:
    """Name, GPU capacity, opt-out, cordon, our cordon and our taint come from the raw Node."""
    view = nodes.parse(raw)

    actual = (
        view.name,
        view.gpu_capacity,
        view.managed,
        view.unschedulable,
        view.cordoned_by_us,
        view.tainted,
    )
    assert expected == actual


def test_a_node_without_a_name_is_refused_naming_the_field() -> None:
    """The only fatal parse error is a Node without metadata.name."""
    with pytest.raises(nodes.NodeParseError, match=r"metadata\.name"):
        nodes.parse({"metadata": {}})


@pytest.mark.parametrize(
    ("annotations", "expected_problem"),
    [
        pytest.param(
            {marks.HISTORY_ANNOTATION: "{not json"},
            "taugrid.dev/history: not JSON",
            id="a mangled history is reported, not raised",
        ),
        pytest.param(
            {
                marks.QUARANTINED_BY_ANNOTATION: "taugrid-controller",
                marks.QUARANTINED_AT_ANNOTATION: "yesterday",
            },
            "taugrid.dev/quarantined-at: not an RFC 3339 time",
            id="a bad quarantine time names its annotation",
        ),
        pytest.param(
            {marks.RELEASED_FAULTS_ANNOTATION: '[["GPU-a", "Xid"]]'},
            "taugrid.dev/released-faults[0]: expected [gpuUuid, code, since]",
            id="a malformed released-fault entry names its index",
        ),
    ],
)
def test_malformed_annotations_become_problems(
    annotations: dict[str, str], expected_problem: str
) -> None:
    """One hand-edited node never stops the controller: its problems are listed by field."""
    view = nodes.parse(fakes.raw_node("n1", annotations=annotations))

    assert len(view.problems) == 1
    assert view.problems[0].startswith(expected_problem)


def test_a_quarantined_by_without_our_record_is_a_manual_quarantine() -> None:
    """A person's hand-written quarantine annotation is only released by a person."""
    view = nodes.parse(
        fakes.raw_node(
            "n1",
            annotations={
                marks.QUARANTINED_BY_ANNOTATION: "bob",
                marks.QUARANTINED_AT_ANNOTATION: "2025-03-01T12:00:00Z",
            },
        )
    )

    assert view.quarantine is not None
    expected = (nodes.QuarantineMode.MANUAL, nodes.Clearing.MANUAL_RELEASE, "bob")
    assert expected == (view.quarantine.mode, view.quarantine.clears_with, view.quarantine.by)


def _entry(index: int) -> history.Entry:
    return history.Entry(at(index), "Quarantine", "XidFallenOffBus", "taugrid-controller", "m")


def test_history_round_trips_and_keeps_the_newest_twenty() -> None:
    """render/parse are inverse, and appending past the bound drops the oldest entries."""
    entries: tuple[history.Entry, ...] = ()
    for index in range(25):
        entries = history.append(entries, _entry(index))

    parsed = history.parse(history.render(entries))

    expected = tuple(_entry(index) for index in range(5, 25))
    assert expected == parsed


def test_history_bounds_long_text() -> None:
    """A runaway message is cut so the annotation stays small."""
    entry = history.Entry(at(0), "Quarantine", "R", "me", "x" * 5000)

    parsed = history.parse(history.render([entry]))

    assert len(parsed[0].message) == history.MAX_TEXT_CHARS


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("{}", "expected a JSON list", id="an object instead of a list"),
        pytest.param("[1]", r"history\[0\]: expected an object", id="an entry that is no object"),
        pytest.param(
            '[{"at": "2025-03-01T12:00:00Z", "action": "Q", "reason": "R"}]',
            r"history\[0\]\.by: required",
            id="an entry without its author",
        ),
        pytest.param(
            '[{"at": "2025-03-01T12:00:00", "action": "Q", "reason": "R", "by": "me"}]',
            r"history\[0\]\.at: time without a zone",
            id="a time without a zone",
        ),
    ],
)
def test_history_errors_name_the_field(raw: str, expected: str) -> None:
    """A history TauGrid did not write is refused with the entry and field named."""
    with pytest.raises(history.HistoryError, match=expected):
        history.parse(raw)


def test_empty_history_is_empty() -> None:
    """An absent or empty annotation is an empty history."""
    assert (history.parse(None), history.parse("")) == ((), ())


def test_times_are_written_in_utc() -> None:
    """History times are RFC 3339 UTC whatever zone `now` came in."""
    cet = dt.timezone(dt.timedelta(hours=1))
    entry = history.Entry(dt.datetime(2025, 3, 1, 13, 0, tzinfo=cet), "Q", "R", "me")

    assert '"at":"2025-03-01T12:00:00Z"' in history.render([entry])
