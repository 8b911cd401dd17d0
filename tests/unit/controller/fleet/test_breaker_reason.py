"""The breaker reset's reason: validated as a release's is, and kept in the breaker's Event."""

from __future__ import annotations

import pydantic
import pytest

from controller.fleet import actions, schemas


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        pytest.param(actions.CloseBreaker(reason="Reset", by="alice", note="driver rolled back"),
                     "breaker closed (Reset by alice): driver rolled back",
                     id="an operator's reason follows who reset it"),
        pytest.param(actions.CloseBreaker(reason="Reset", by="alice"),
                     "breaker closed (Reset by alice)", id="no reason given: as before"),
        pytest.param(actions.CloseBreaker(reason="FleetHealthy", by=""),
                     "breaker closed (FleetHealthy)", id="an automatic close names no one"),
    ],
)  # fmt: skip
def test_the_breaker_event_says_who_reset_it_and_why(
    action: actions.CloseBreaker, expected: str
) -> None:
    """The Event's note carries the operator's reason."""
    assert expected == actions.close_breaker_text("breaker", action)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({}, id="a body without a reason"),
        pytest.param({"reason": ""}, id="an empty reason"),
        pytest.param({"reason": "x" * 1025}, id="a reason over 1,024 characters"),
        pytest.param({"reason": 7}, id="a reason that is not a string"),
        pytest.param({"reason": "ok", "by": "mallory"}, id="a field the call does not take"),
    ],
)
def test_a_reset_body_is_refused_as_a_release_body_would_be(body: dict[str, object]) -> None:
    """The reset's body follows the quarantine and release bodies' rules."""
    for model in (schemas.BreakerResetRequest, schemas.QuarantineRequest):
        with pytest.raises(pydantic.ValidationError):
            model.model_validate(body)
