"""One module formats and parses every time the controller writes or reads."""

from __future__ import annotations

import datetime as dt

import pytest

from controller import timestamps

WHOLE = dt.datetime(2026, 3, 1, 12, 0, 5, tzinfo=dt.UTC)
FRACTION = WHOLE.replace(microsecond=250)
ELSEWHERE = dt.datetime(2026, 3, 1, 14, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        pytest.param(
            WHOLE,
            ("2026-03-01T12:00:05Z", "2026-03-01T12:00:05Z", "2026-03-01T12:00:05.000000Z"),
            id="a whole second has no fraction except as MicroTime",
        ),
        pytest.param(
            FRACTION,
            ("2026-03-01T12:00:05Z", "2026-03-01T12:00:05.000250Z", "2026-03-01T12:00:05.000250Z"),
            id="metav1.Time drops the fraction; our own records keep it",
        ),
        pytest.param(
            ELSEWHERE,
            ("2026-03-01T12:00:05Z", "2026-03-01T12:00:05Z", "2026-03-01T12:00:05.000000Z"),
            id="a time in another zone is written in UTC",
        ),
        pytest.param(None, (None, None, None), id="an absent time stays absent"),
    ],
)
def test_each_precision_formats_as_its_consumer_expects(
    when: dt.datetime | None, expected: tuple[str | None, str | None, str | None]
) -> None:
    """Seconds for Kubernetes' Time, exact for our records, microseconds for MicroTime."""
    actual = (
        timestamps.rfc3339(when),
        timestamps.rfc3339_exact(when),
        timestamps.rfc3339_micro(when),
    )
    assert expected == actual


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2026-03-01T12:00:05Z", WHOLE, id="a Kubernetes time parses"),
        pytest.param("2026-03-01T12:00:05", WHOLE, id="a time without a zone is UTC"),
        pytest.param("2026-03-01T12:00:05.000250Z", FRACTION, id="a fraction is kept"),
        pytest.param("yesterday", None, id="text that is no time is absent"),
        pytest.param("", None, id="an empty string is absent"),
        pytest.param(1700000000, None, id="a number is absent"),
        pytest.param(None, None, id="None is absent"),
    ],
)
def test_times_other_components_wrote_parse_leniently(
    value: object, expected: dt.datetime | None
) -> None:
    """A time written by Kubernetes or Kueue that cannot be read is simply not there."""
    assert expected == timestamps.parse(value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        pytest.param(17, "expected an RFC 3339 time string, got int", id="a number is refused"),
        pytest.param("soon", "not an RFC 3339 time: 'soon'", id="text is refused"),
        pytest.param(
            "2026-03-01T12:00:05", "time without a zone", id="a time without a zone is refused"
        ),
    ],
)
def test_our_own_records_are_parsed_strictly_naming_the_field(value: object, words: str) -> None:
    """A damaged record of ours is reported with the field it came from, never guessed."""
    with pytest.raises(ValueError, match=r"taugrid\.dev/quarantined-at: ") as err:
        timestamps.parse_strict(value, "taugrid.dev/quarantined-at")
    assert words in str(err.value)


def test_a_record_of_ours_round_trips() -> None:
    """What we write exactly, we read back to the same instant."""
    assert timestamps.parse_strict(timestamps.rfc3339_exact(FRACTION), "at") == FRACTION
