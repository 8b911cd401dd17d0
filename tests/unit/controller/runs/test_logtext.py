"""A log that cannot be streamed is a sentence and an exit code, never a raw Status body."""

from __future__ import annotations

import json

import pytest

from controller.runs import logtext

KWOK_BODY = json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "BadRequest", "code": 400,
    "message": 'no logs found for container "main" in pod "default/hello-gpu-a1-x"',
})  # fmt: skip
"""What the API server answered for a container on a KWOK node without a Logs object
(captured from the dev cluster with `kubectl logs -v=6`, 2026-12-01; pod name changed)."""
NO_LOGS = 'no logs found for container "main"'


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param((400, KWOK_BODY, True), (404, "NoLogOnSimulatedNode", "a node KWOK simulates"),
                     id="a pod on a KWOK node keeps no log, in words"),
        pytest.param((400, KWOK_BODY, False), (404, "LogNotFound", NO_LOGS),
                     id="a container with no log quotes the API server's message, not its body"),
        pytest.param((500, "Reason: connection refused", False),
                     (503, "LogUnavailable", "cannot be read now"),
                     id="a kubelet that does not answer is unavailable"),
    ],
)  # fmt: skip
def test_an_unreadable_log_is_said_in_words(
    case: tuple[int, str, bool], expected: tuple[int, str, str]
) -> None:
    """The status maps to tau's exit codes (404: not found, 503: unavailable); the message is
    a sentence naming the pod, its node and the container, and no JSON."""
    status, upstream, simulated = case
    expected_status, expected_code, phrase = expected
    got = logtext.unavailable(
        pod="hello-gpu-a1-x", node="gpu-node-0", container="main",
        upstream_status=status, upstream=upstream, simulated=simulated,
    )  # fmt: skip
    assert (expected_status, expected_code) == (got.status, got.code)
    assert phrase in got.message
    assert "hello-gpu-a1-x" in got.message
    assert "{" not in got.message


def test_the_message_of_a_status_body_is_extracted() -> None:
    """An exception's text may carry the body after a prefix (`Reason: {...}`)."""
    expected = 'no logs found for container "main" in pod "default/hello-gpu-a1-x"'
    assert expected == logtext.upstream_message(f"(400)\nReason: {KWOK_BODY}")
