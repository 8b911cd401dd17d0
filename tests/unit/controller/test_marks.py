"""One vocabulary: every name the controller puts on the cluster is spelt once, in marks."""

from __future__ import annotations

import pathlib
import re

import pytest

from controller import marks

CONTROLLER = pathlib.Path(__file__).resolve().parents[3] / "controller"
OUR_NAME = re.compile(r"""["']taugrid\.dev/[a-z0-9.-]+["']""")


def test_no_module_but_marks_spells_one_of_our_names() -> None:
    """A `taugrid.dev/…` literal outside marks.py is a second definition waiting to drift."""
    found = {
        f"{path.relative_to(CONTROLLER)}:{n}: {line.strip()}"
        for path in CONTROLLER.rglob("*.py")
        if path.name != "marks.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUR_NAME.search(line)
    }
    assert set() == found


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({}, (False, False), id="a node without our annotations is not quarantined"),
        pytest.param(
            {marks.QUARANTINED_BY_ANNOTATION: "taugrid-controller"},
            (True, False),
            id="quarantined without a record is not a failed GPU",
        ),
        pytest.param(
            {
                marks.QUARANTINED_BY_ANNOTATION: "taugrid-controller",
                marks.QUARANTINE_ANNOTATION: '{"failed": true}',
            },
            (True, True),
            id="a record saying failed is a failed GPU",
        ),
        pytest.param(
            {
                marks.QUARANTINED_BY_ANNOTATION: "ada",
                marks.QUARANTINE_ANNOTATION: '{"failed": "yes"}',
            },
            (True, False),
            id="only the JSON true counts as failed",
        ),
        pytest.param(
            {marks.QUARANTINED_BY_ANNOTATION: "x", marks.QUARANTINE_ANNOTATION: "{not json"},
            (True, False),
            id="an unreadable record says no",
        ),
    ],
)
def test_the_runs_domain_reads_the_fleets_quarantine_record_through_marks(
    annotations: dict[str, object], expected: tuple[bool, bool]
) -> None:
    """Whether a node is quarantined, and because a GPU failed, as the run reconciler asks."""
    assert expected == (marks.quarantined(annotations), marks.quarantine_failed(annotations))
