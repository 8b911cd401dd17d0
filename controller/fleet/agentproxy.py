"""The on-call calls to a node's agent, made by the controller for its caller (the I/O of
`agentcalls`).

The caller is authorised by the controller, as every on-call call is (a SubjectAccessReview
for the verb on nodes, through the cached review path); the agent then sees the controller's
own credential, its projected `taugrid-agent` token (`agent_token_file`), which it reviews
and authorises as `patch` on that node, the right the controller's ServiceAccount already
holds to quarantine. The caller's token never leaves the controller. One timeout covers the
whole call, redirects are refused, and at most `agent_max_response_bytes` of the answer are
read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import aiohttp
import structlog

from controller import errors
from controller.fleet import agentcalls

log = structlog.get_logger()


@dataclasses.dataclass
class AgentClient:
    """Makes `agentcalls.AgentCall`s to agents over the replica's HTTP session."""

    http: aiohttp.ClientSession
    token: Callable[[], str]
    """The controller's agent token, '' when it has none (then no Authorization is sent)."""
    scheme: str
    port: int
    timeout_s: float
    max_bytes: int

    async def call(
        self, node: str, ip: str, call: agentcalls.AgentCall, *, with_token: bool = True
    ) -> agentcalls.Relayed:
        """Make `call` on the agent of `node` at `ip`; its answer relayed, or raised as an
        error of the controller's kinds (`agentcalls.answer`). `with_token` false sends no
        credential: the agent then answers as to anyone who can reach it (no pod names)."""
        try:
            url = agentcalls.agent_url(self.scheme, ip, self.port, call)
        except ValueError as err:
            msg = f"the agent of node {node} has no usable address: {err}"
            raise errors.BadGateway(msg, code="AgentUnreachable") from err
        headers = {"Accept": "application/json"}
        token = self.token() if with_token else ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self.http.request(
                call.method, url, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:  # fmt: skip
                payload = await _read_capped(resp, self.max_bytes)
                status, content_type = resp.status, resp.content_type
        except TimeoutError as err:
            msg = f"the agent of node {node} ({url}) did not answer within {self.timeout_s:g}s"
            raise errors.GatewayTimeout(msg, code="AgentTimeout") from err
        except aiohttp.ClientError as err:
            msg = f"the agent of node {node} ({url}) could not be reached: {err}"
            raise errors.BadGateway(msg, code="AgentUnreachable") from err
        log.info("agent_call", node=node, action=call.call.value, status=status)
        return agentcalls.answer(node, status, content_type, payload)


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """Read the body, refusing (502) one longer than `limit` before reading it all."""
    if resp.content_length is not None and resp.content_length > limit:
        msg = f"the agent's answer of {resp.content_length} bytes exceeds {limit} bytes"
        raise errors.BadGateway(msg, code="AgentAnswerTooLarge")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            msg = f"the agent's answer exceeds {limit} bytes"
            raise errors.BadGateway(msg, code="AgentAnswerTooLarge")
        chunks.append(chunk)
    return b"".join(chunks)
