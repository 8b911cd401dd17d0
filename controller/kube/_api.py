"""What every Kubernetes adapter needs: reading a raw response (or None for one that is not
there), and recording an Event.

The adapters read with `_preload_content=False` and get plain dicts back (cheaper than the
generated models, and what the pure core reads); kubernetes_asyncio checks the status only
when it preloads the content, so every raw call must go through `read_json`.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Awaitable
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import timestamps

log = structlog.get_logger()

MAX_REASON_CHARS = 4000
"""How much of an error body an ApiException carries."""
MAX_NOTE_CHARS = 1024
"""The API server refuses an Event note above 1 KiB."""


async def read_json(resp: Any) -> Any:
    """Read a raw response; raise ApiException on an error status."""
    try:
        data = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        reason = data.decode(errors="replace")[:MAX_REASON_CHARS]
        raise client.ApiException(status=resp.status, reason=reason)
    return json.loads(data)


async def json_or_none(call: Awaitable[Any]) -> dict[str, Any] | None:
    """Await a raw call and read it (`read_json`); None on a 404: the object is not there."""
    try:
        return dict(await read_json(await call))
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


class EventRecorder:
    """Record `events.k8s.io/v1` Events as one reporting controller (best effort: an Event
    never blocks the action it records, so a refusal is logged, not raised)."""

    def __init__(self, api: client.ApiClient, *, controller: str, instance: str) -> None:
        self._events = client.EventsV1Api(api)
        self.controller = controller
        self.instance = instance[:128]

    async def emit(
        self, namespace: str, regarding: dict[str, Any], reason: str, note: str, *, warning: bool
    ) -> None:
        """Record an Event on `regarding` in `namespace`."""
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
        try:
            await self._events.create_namespaced_event(namespace, body)
        except client.ApiException as err:
            log.warning(
                "event not recorded", regarding=regarding["name"], reason=reason, status=err.status
            )
