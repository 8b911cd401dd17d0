"""What every Kubernetes adapter needs: reading a raw response (or None for one that is not
there), and recording an Event.

The adapters read with `_preload_content=False` and get plain dicts back (cheaper than the
generated models, and what the pure core reads); kubernetes_asyncio checks the status only
when it preloads the content, so every raw call must go through `read_json`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
from collections.abc import Awaitable, Container
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client

from controller import timestamps

log = structlog.get_logger()

MAX_REASON_CHARS = 4000
"""How much of an error body an ApiException carries."""
MAX_NOTE_CHARS = 1024
"""The API server refuses an Event note above 1 KiB."""
MAX_PENDING_EVENTS = 5000
"""Events queued at once per recorder; beyond it they are dropped (and logged)."""


async def read_bytes(resp: Any) -> bytes:
    """Read a raw response's body; raise ApiException on an error status."""
    try:
        data = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        reason = data.decode(errors="replace")[:MAX_REASON_CHARS]
        raise client.ApiException(status=resp.status, reason=reason)
    return bytes(data)


async def read_json(resp: Any) -> Any:
    """Read a raw response as JSON; raise ApiException on an error status."""
    return json.loads(await read_bytes(resp))


async def json_or_none(
    call: Awaitable[Any], absent: Container[int] = (404,)
) -> dict[str, Any] | None:
    """Await a raw call and read it (`read_json`); None on a status in `absent` (by default
    404: the object is not there)."""
    try:
        return dict(await read_json(await call))
    except client.ApiException as err:
        if err.status in absent:
            return None
        raise


class EventRecorder:
    """Record `events.k8s.io/v1` Events as one reporting controller, in the background: an
    Event never blocks the action it records (under the API write budget Events wait behind
    node writes, and a node's next action must not wait behind its own Event), and a refusal
    or a timeout is logged, not raised. At most `MAX_PENDING_EVENTS` wait; more are dropped
    and counted, as client-go's event broadcaster drops when its queue is full."""

    def __init__(self, api: client.ApiClient, *, controller: str, instance: str) -> None:
        self._events = client.EventsV1Api(api)
        self.controller = controller
        self.instance = instance[:128]
        self._pending: set[asyncio.Task[None]] = set()
        self.dropped = 0

    async def emit(
        self, namespace: str, regarding: dict[str, Any], reason: str, note: str, *, warning: bool
    ) -> None:
        """Queue an Event on `regarding` in `namespace`; return at once."""
        if len(self._pending) >= MAX_PENDING_EVENTS:
            self.dropped += 1
            log.warning("event dropped: too many pending", regarding=regarding.get("name"),
                        reason=reason, dropped=self.dropped)  # fmt: skip
            return
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{str(regarding['name'])[:200]}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "eventTime": timestamps.rfc3339_micro(dt.datetime.now(dt.UTC)),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": reason,
            "reason": reason,
            "note": note[:MAX_NOTE_CHARS],
            "type": "Warning" if warning else "Normal",
            "regarding": regarding,
        }
        task = asyncio.create_task(self._send(namespace, body), name=f"event-{reason}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            await self._events.create_namespaced_event(namespace, body)
        except (client.ApiException, aiohttp.ClientError, TimeoutError) as err:
            log.warning(
                "event not recorded",
                regarding=body["regarding"].get("name"),
                reason=body["reason"],
                error=getattr(err, "status", None) or type(err).__name__,
            )

    async def flush(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the queued Events (shutdown), then give up on the rest."""
        pending = set(self._pending)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
