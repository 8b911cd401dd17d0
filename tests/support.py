"""Helpers shared by the test tiers: polling for outcomes, unique names and a lease that is
always held."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubernetes_asyncio import client

T = TypeVar("T")

DEADLINE_S = 90.0
"""Generous: tests poll for an outcome, they never assert on how fast it came."""


class AlwaysLeading:
    """An elector that always holds the lease: for tests of what a leader does, where the
    election is not what is tested (`controller.leading.Elector`'s reads, nothing else)."""

    def __init__(self, identity: str = "test") -> None:
        self.identity = identity

    def is_leader(self) -> bool:
        return True

    def ensure_leader(self) -> None:
        return None


class NotYetError(AssertionError):
    """Raised by a probe to say "not there yet, ask again"."""


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = DEADLINE_S,
    interval_s: float = 0.2,
    what: str = "condition",
) -> T:
    """Call `probe` until it returns without raising AssertionError; return its value.

    The last assertion's message is reported when the deadline passes, so a failing test
    says what it was waiting for and what it saw instead.
    """
    deadline = time.monotonic() + timeout_s
    last: AssertionError | None = None
    while time.monotonic() < deadline:
        try:
            return await probe()
        except AssertionError as err:
            last = err
        await asyncio.sleep(interval_s)
    msg = f"timed out after {timeout_s:.0f}s waiting for {what}: {last}"
    raise AssertionError(msg) from last


def unique_name(prefix: str, max_len: int = 40) -> str:
    """Return a DNS-1123 label: the prefix (cleaned, shortened) plus a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    suffix = secrets.token_hex(3)
    return f"{base[: max_len - len(suffix) - 1].rstrip('-')}-{suffix}"


def not_found_is_not_yet(fn: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """Wrap an API read so that a 404 means "not there yet" for `eventually`."""

    async def probe() -> T:
        try:
            return await fn()
        except client.ApiException as err:
            if err.status == 404:
                msg = f"404 from {getattr(fn, '__name__', 'read')}"
                raise NotYetError(msg) from err
            raise

    return probe


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """Return the status condition of the given type from a raw object, if present."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def parse_time(value: str) -> dt.datetime:
    """Parse an RFC 3339 timestamp as the API server writes it (`…Z`, aware UTC)."""
    return dt.datetime.fromisoformat(value)


async def hung_up(reader: asyncio.StreamReader, deadline_s: float) -> bool:
    """True once the server closes the connection (EOF or reset) within `deadline_s`."""
    try:
        async with asyncio.timeout(deadline_s):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True
    return True


async def silent_and_trickling_closed(
    port: int, path: str, pause_s: float, deadline_s: float
) -> tuple[bool, bool]:
    """Open two connections to 127.0.0.1:`port`, one sending nothing and one trickling a
    request head for `path` a byte every `pause_s`; whether the server hung up on each within
    `deadline_s` (security review 3, finding 14)."""
    silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
    trickle_r, trickle_w = await asyncio.open_connection("127.0.0.1", port)

    async def trickle() -> None:
        for byte in f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode() + b"a" * 10_000:
            trickle_w.write(bytes([byte]))
            await asyncio.sleep(pause_s)

    feeding = asyncio.create_task(trickle())
    try:
        return await hung_up(silent_r, deadline_s), await hung_up(trickle_r, deadline_s)
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await feeding
        silent_w.close()
        trickle_w.close()
