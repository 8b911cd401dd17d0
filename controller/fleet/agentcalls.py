"""The on-call calls the controller makes to a node's agent for its caller: which URL, and
what the agent's answer becomes (pure; `agentproxy` makes the calls).

The agent is reached only at the IP of the pod its heartbeat token is bound to (DESIGN.md
section 10: never an address a heartbeat carries) and only at the three paths below, with
query values the controller built from validated parameters: nothing a caller sends becomes
part of the host or the path. What the agent answers is relayed when it is the agent's own
verdict on the call (its 2xx, its 400/404/409 refusals, its 503 DCGM-unavailable); a refusal
of the controller's credential, a rate limit, a 5xx or anything unreadable becomes a 502 or
503 that says what happened, so a caller never reads the agent's refusal of the controller
as a refusal of its own token.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import urllib.parse

from controller import errors
from shared import jsonsafe

PATHS = frozenset({"/v1/gpus", "/v1/diag", "/v1/release"})
"""The agent's paths the controller ever calls."""


class Call(enum.StrEnum):
    """What the caller asked the agent, through the controller."""

    GPUS = "GetGpus"
    DIAG = "RunDiagnostic"
    RELEASE = "ReleaseLatch"


@dataclasses.dataclass(frozen=True, slots=True)
class AgentCall:
    """One call to an agent: method, one of `PATHS`, and query parameters."""

    call: Call
    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()


def gpus() -> AgentCall:
    """`GET /v1/gpus`: the agent's own view of its GPUs."""
    return AgentCall(Call.GPUS, "GET", "/v1/gpus")


def diag(level: int) -> AgentCall:
    """`POST /v1/diag?level=N`: start a diagnostic (never waited for: the caller reads its
    result in `/v1/gpus`' `lastDiagnostic`)."""
    if level not in (1, 2, 3):
        msg = f"level: must be 1, 2 or 3, got {level}"
        raise errors.InvalidParameter(msg, field="level")
    return AgentCall(Call.DIAG, "POST", "/v1/diag", (("level", str(level)),))


def release(*, gpu: str | None, code: str | None, force: bool) -> AgentCall:
    """`POST /v1/release?gpu=&code=&force=`: release latched faults (values already
    validated by the path's query model; the agent checks them again)."""
    given = (("gpu", gpu or ""), ("code", code or ""), ("force", "true" if force else ""))
    return AgentCall(Call.RELEASE, "POST", "/v1/release", tuple((k, v) for k, v in given if v))


def agent_url(scheme: str, ip: str, port: int, call: AgentCall) -> str:
    """The URL of `call` on the agent at `ip`; ValueError for an address that is not an IP
    or a path the controller never calls (neither can come from a caller)."""
    if scheme not in ("http", "https"):
        msg = f"scheme {scheme!r} is not http or https"
        raise ValueError(msg)
    address = ipaddress.ip_address(ip)  # ValueError for anything but an IP
    if address.is_unspecified or address.is_multicast:
        msg = f"{ip} is not an address an agent listens at"
        raise ValueError(msg)
    if not 0 < port < 65536:
        msg = f"port {port} is out of range"
        raise ValueError(msg)
    if call.path not in PATHS:
        msg = f"{call.path!r} is not an agent path the controller calls"
        raise ValueError(msg)
    host = f"[{address.compressed}]" if address.version == 6 else address.compressed
    query = f"?{urllib.parse.urlencode(call.query)}" if call.query else ""
    return f"{scheme}://{host}:{port}{call.path}{query}"


@dataclasses.dataclass(frozen=True, slots=True)
class Relayed:
    """An answer of the agent to hand to the caller as it is."""

    status: int
    payload: bytes


def _agent_error(payload: bytes) -> tuple[str, str, str]:
    """The agent's `error.code`, `error.message` and `error.field` ('' where absent)."""
    try:
        doc = jsonsafe.load(payload)  # bounded: an agent's answer is not trusted (review 3, 12)
    except jsonsafe.JsonError:
        return "", "", ""
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return "", "", ""
    found = (err.get("code"), err.get("message"), err.get("field"))
    code, message, field = (v if isinstance(v, str) else "" for v in found)
    return code[:64], message[:1024], field[:64]


RELAYED_REFUSALS: dict[int, type[errors.ControllerError]] = {
    400: errors.InvalidParameter,
    404: errors.NotFound,
    409: errors.Conflict,
    503: errors.Unavailable,
}
"""The agent's refusals of the call itself, raised again as the kind with that status."""


def answer(node: str, status: int, content_type: str, payload: bytes) -> Relayed:
    """What the agent's answer to a call for `node` becomes: relayed (a 2xx, JSON), or
    raised as an error of the controller's kinds that names the agent."""
    where = f"the agent of node {node}"
    if 200 <= status < 300:
        if content_type != "application/json":
            what = content_type[:64] or "no content type"
            msg = f"{where} answered {status} with {what}, not JSON"
            raise errors.BadGateway(msg, code="AgentBadAnswer")
        return Relayed(status, payload)
    code, message, field = _agent_error(payload)
    said = f": {message}" if message else ""
    if status in (401, 403):
        msg = (
            f"{where} refused the controller's own credential ({status}{said}); the caller's"
            " token was fine. Check the controller's agent_token_file and that its"
            " ServiceAccount may patch nodes"
        )
        raise errors.BadGateway(msg, code="AgentRefusedController")
    if status == 429:  # the agent's per-source limit on reviews
        raise errors.Unavailable(f"{where} is rate-limiting reviews; retry", code="AgentBusy")
    kind = RELAYED_REFUSALS.get(status)
    if kind is not None:
        default = kind.default_code
        raise kind(f"{where}: {message or default}", code=code or default, field=field)
    msg = f"{where} answered {status}{said}"
    raise errors.BadGateway(msg, code="AgentError")
