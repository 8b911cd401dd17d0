"""A follower's calls forwarded to the leader (DESIGN.md section 6): what only the leader may
do (`unless_leader`, `forward`, `to_leader`), sent with the follower's own peer token and the
caller it reviewed, never the caller's credential; the leader's answer passed back as it is,
its errors read back into the controller's kinds (`error_of`)."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
import structlog
from aiohttp import web

from controller import auth, errors, serving
from shared import jsonsafe

log = structlog.get_logger()


def forwarded(request: web.Request) -> bool:
    """True when a follower sent this request on behalf of a caller it reviewed."""
    return serving.FORWARDED_BY in request


async def unless_leader(
    request: web.Request, caller: auth.Identity, body: bytes | None = None
) -> web.StreamResponse | None:
    """None when this replica leads (the handler goes on); otherwise the leader's answer to
    this request, sent for `caller` (already authenticated and authorised here)."""
    if serving.serving_of(request).elector.is_leader():
        return None
    return await forward(request, caller, body)


async def forward(
    request: web.Request, caller: auth.Identity, body: bytes | None = None
) -> web.Response:
    """Send the leader this request on behalf of `caller`, under this replica's own peer
    token; 503 when that is not possible.

    The caller's credential never leaves this replica: the leader gets the peer token and
    the reviewed identity (`X-TauGrid-Caller`), and authorises the call again itself. The
    leader is reached as `to_leader` reaches it; a request that was itself forwarded is
    never forwarded again.
    """
    st = serving.serving_of(request)
    if forwarded(request):
        raise errors.Unavailable("this replica no longer leads; retry", code="NotLeader")
    if body is None and request.can_read_body:
        body = await serving.read_body(request, st.settings.max_body_bytes)
    headers = {serving.CALLER_HEADER: auth.encode_caller(caller)}
    for name in ("Content-Type", "Idempotency-Key"):
        if name in request.headers:
            headers[name] = request.headers[name]
    status, content_type, payload = await to_leader(
        st, request.method, request.path_qs, body, headers
    )
    return web.Response(body=payload, status=status, content_type=content_type)


async def to_leader(
    st: serving.ServingState,
    method: str,
    path_qs: str,
    body: bytes | None,
    headers: Mapping[str, str],
) -> tuple[int, str, bytes]:
    """Make one call to the leader under this replica's peer token; its status, content
    type and body, or Unavailable (503) when it cannot be made.

    The leader is reached only at `leader_url` (the leader-only Service), verified by the
    chart's CA alone, with redirects refused, within `forward_timeout_s`; an answer that
    its replica does not lead is tried once more (the Service may have picked a replica
    that just lost), and a refusal of the peer token is logged and answered 503.
    """
    settings = st.settings
    if not settings.leader_url:
        msg = "this replica is not the leader and knows no leader address; retry"
        raise errors.Unavailable(msg, code="NotLeader")
    token = st.peer_token()
    if not token:
        msg = "this replica has no peer token to reach the leader with; retry"
        raise errors.Unavailable(msg, code="NoPeerToken")
    sent = {**headers, "Authorization": f"Bearer {token}"}
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    if request_id:  # one id in both replicas' logs
        sent["X-Request-Id"] = str(request_id)
    url = settings.leader_url.rstrip("/") + path_qs
    problem = ""
    for _ in range(2):  # once more: the Service may have picked a replica that just lost
        try:
            async with st.http.request(
                method, url, data=body, headers=sent, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=settings.forward_timeout_s),
            ) as resp:  # fmt: skip
                payload = await resp.read()
                code = error_code(payload) if resp.status >= 400 else ""
                if resp.status == 503 and code == "NotLeader":
                    problem = "the replica behind the leader address does not lead"
                    continue
                if code == "PeerRefused":
                    log.error("leader refused our peer token", body=payload[:300])
                    msg = "the leader refused this replica's peer token; retry later"
                    raise errors.Unavailable(msg, code="PeerRefused")
                return resp.status, resp.content_type, payload
        except (aiohttp.ClientError, TimeoutError) as err:
            problem = f"{type(err).__name__}: {err}"
    msg = f"could not reach the leader: {problem}"
    raise errors.Unavailable(msg, code="LeaderUnreachable")


def error_of(status: int, code: str, message: str, field: str = "") -> errors.ControllerError:
    """The error of the kind `serving.STATUS` maps to `status` (the leader's answer to a relayed
    report, raised again here for its agent); Unavailable for a status no kind has."""
    for kind, mapped in serving.STATUS.items():
        if mapped == status and kind.default_code == code:
            return kind(message, code=code, field=field)
    for kind, mapped in serving.STATUS.items():
        if mapped == status:
            return kind(message, code=code, field=field)
    return errors.Unavailable(message, code=code or "LeaderError", field=field)


def error_code(payload: bytes) -> str:
    """The `error.code` of an error body, '' when it has none."""
    try:
        doc = jsonsafe.load(payload)  # bounded, as every body read (review 3, finding 12)
    except jsonsafe.JsonError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else ""
