"""The on-call calls to an agent: the URL built, and what each answer of the agent becomes."""

from __future__ import annotations

import json

import pytest

from controller import errors, forwarding, serving
from controller.fleet import agentcalls


@pytest.mark.parametrize(
    ("ip", "call", "expected"),
    [
        pytest.param("10.1.2.3", agentcalls.gpus(), "http://10.1.2.3:9400/v1/gpus",
                     id="the GPU view is the agent's /v1/gpus at the pod's IP"),
        pytest.param("fd00::7", agentcalls.diag(2), "http://[fd00::7]:9400/v1/diag?level=2",
                     id="an IPv6 pod address is bracketed"),
        pytest.param("10.1.2.3", agentcalls.release(gpu="GPU-ab-1", code="Row:Remap", force=True),
                     "http://10.1.2.3:9400/v1/release?gpu=GPU-ab-1&code=Row%3ARemap&force=true",
                     id="release parameters are URL-encoded into the query"),
        pytest.param("10.1.2.3", agentcalls.release(gpu=None, code=None, force=False),
                     "http://10.1.2.3:9400/v1/release",
                     id="a release of everything Inspect has no query"),
    ],
)  # fmt: skip
def test_the_agent_url_is_the_pod_ip_and_a_fixed_path(
    ip: str, call: agentcalls.AgentCall, expected: str
) -> None:
    """The URL is built from the pod's IP, the agents' port and one of the fixed paths."""
    assert expected == agentcalls.agent_url("http", ip, 9400, call)


@pytest.mark.parametrize(
    ("scheme", "ip", "path"),
    [
        pytest.param("http", "evil.example/x?", "/v1/gpus", id="a host name is not an IP"),
        pytest.param("http", "10.0.0.1/../admin", "/v1/gpus", id="a path in the address"),
        pytest.param("http", "10.0.0.1:1", "/v1/gpus", id="a port in the address"),
        pytest.param("http", "", "/v1/gpus", id="no address"),
        pytest.param("http", "0.0.0.0", "/v1/gpus", id="the unspecified address"),  # noqa: S104
        pytest.param("http", "10.0.0.1", "/metrics", id="a path the controller never calls"),
        pytest.param("file", "10.0.0.1", "/v1/gpus", id="a scheme other than http(s)"),
    ],
)
def test_no_url_is_built_from_anything_but_an_ip_and_a_known_path(
    scheme: str, ip: str, path: str
) -> None:
    """Nothing but an IP address becomes the host, and only the agent's three paths the path."""
    call = agentcalls.AgentCall(agentcalls.Call.GPUS, "GET", path)
    with pytest.raises(ValueError):  # noqa: PT011  (the message varies with the fault)
        agentcalls.agent_url(scheme, ip, 9400, call)


def test_a_level_outside_1_to_3_is_refused_naming_it() -> None:
    """A diagnostic level the agent does not run is a 400 naming `level`, before any call."""
    with pytest.raises(errors.InvalidParameter) as caught:
        agentcalls.diag(4)
    expected = (400, "level")
    assert expected == (serving.status_of(caught.value), caught.value.field)


def _error(code: str, message: str, field: str = "") -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "field": field}}).encode()


@pytest.mark.parametrize(
    ("status", "content_type", "payload", "expected"),
    [
        pytest.param(401, "application/json", _error("Unauthorized", "token rejected"),
                     (502, "AgentRefusedController"),
                     id="the agent refusing the controller's token is a 502, not the caller's 401"),
        pytest.param(403, "application/json", _error("Forbidden", "may not patch"),
                     (502, "AgentRefusedController"),
                     id="the agent's 403 of the controller is a 502, not the caller's 403"),
        pytest.param(429, "application/json", _error("TooManyRequests", "slow down"),
                     (503, "AgentBusy"), id="the agent's rate limit is a retryable 503"),
        pytest.param(409, "application/json", _error("DiagRunning", "one at a time"),
                     (409, "DiagRunning"), id="the agent's conflict is relayed with its code"),
        pytest.param(404, "application/json", _error("NothingReleased", "no fault", "code"),
                     (404, "NothingReleased"), id="nothing released is the agent's 404"),
        pytest.param(400, "application/json", _error("InvalidParameter", "gpu bad", "gpu"),
                     (400, "InvalidParameter"), id="the agent's 400 is relayed"),
        pytest.param(503, "application/json", _error("DcgmUnavailable", "no DCGM"),
                     (503, "DcgmUnavailable"), id="no DCGM on the agent is its 503"),
        pytest.param(500, "application/json", _error("Internal", "boom"), (502, "AgentError"),
                     id="the agent's 500 is a 502 naming the agent"),
        pytest.param(502, "text/html", b"<html>proxy</html>", (502, "AgentError"),
                     id="an answer that is not the agent's error envelope is a 502"),
        pytest.param(200, "text/html", b"<html>hi</html>", (502, "AgentBadAnswer"),
                     id="a 200 that is not JSON is a 502"),
    ],
)  # fmt: skip
def test_what_the_agent_answers_becomes_an_error_of_the_controller(
    status: int, content_type: str, payload: bytes, expected: tuple[int, str]
) -> None:
    """Only the agent's verdicts on the call itself are relayed as they are; its refusal of
    the controller's credential, its limits and its failures say what happened."""
    with pytest.raises(errors.ControllerError) as caught:
        agentcalls.answer("gpu-1", status, content_type, payload)
    assert expected == (serving.status_of(caught.value), caught.value.code)
    assert "gpu-1" in caught.value.message


def test_a_json_answer_is_relayed_byte_for_byte() -> None:
    """The agent's 2xx JSON answer is handed on as it is, with its status."""
    payload = b'{"started": true, "level": 1}'
    expected = agentcalls.Relayed(202, payload)
    assert expected == agentcalls.answer("gpu-1", 202, "application/json", payload)


def test_a_deep_answer_from_an_agent_or_the_leader_is_no_error_code_not_a_crash() -> None:
    """Answers the controller reads from an agent and from the leader are bounded like every
    body (security review 3, finding 12): 100,000 brackets read as "no code", where a plain
    `json.loads` raised RecursionError (a 500 for the on-call call that relayed it)."""
    deep = b"[" * 100_000
    assert (agentcalls._agent_error(deep), forwarding.error_code(deep)) == (("", "", ""), "")
    assert forwarding.error_code(b'{"error": {"code": "NotLeader"}}') == "NotLeader"
