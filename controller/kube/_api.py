"""What every Kubernetes adapter needs: reading a raw response, and recording an Event.

The adapters read with `_preload_content=False` and get plain dicts back (cheaper than the
generated models, and what the pure core reads); kubernetes_asyncio checks the status only
when it preloads the content, so every raw call must go through `read_json`.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import timestamps

log = structlog.get_logger()

MAX_REASON_CHARS = 1000
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


async def emit_event(
    events: client.EventsV1Api,
    namespace: str,
    regarding: dict[str, Any],
    *,
    controller: str,
    instance: str,
    reason: str,
    note: str,
    warning: bool,
) -> None:
    """Record an `events.k8s.io/v1` Event on `regarding` (best effort: an Event never
    blocks the action it records, so a refusal is logged, not raised)."""
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{str(regarding['name'])[:200]}.{secrets.token_hex(8)}",
            "namespace": namespace,
        },
        "eventTime": timestamps.rfc3339_micro(dt.datetime.now(dt.UTC)),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": reason,
        "reason": reason,
        "note": note[:MAX_NOTE_CHARS],
        "type": "Warning" if warning else "Normal",
        "regarding": regarding,
    }
    try:
        await events.create_namespaced_event(namespace, body)
    except client.ApiException as err:
        log.warning(
            "event not recorded", regarding=regarding["name"], reason=reason, status=err.status
        )
