"""Heartbeats to the controller: every interval, and at once when a verdict changes.

Authentication is the projected ServiceAccount token, read from a file and re-read when the
kubelet rotates it (or when the controller answers 401). Failures back off with full jitter.
Heartbeats go to the configured controller URL (the controller Service) and nowhere else: the
agent follows no URL a response names (a 503's `leaderUrl`, an `X-Leader-URL` header, a
redirect), so whoever answers cannot send the agent's token somewhere of its choosing (review
finding H1); a follower passes the report to the leader itself. While the controller is away
the agent keeps probing and serving locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import pathlib
import random
import ssl
from collections.abc import Awaitable, Callable

import aiohttp
import structlog

from agent import monitoring, settings, snapshots
from shared import heartbeat

log = structlog.get_logger("agent.reporting")


_MAX_DOUBLINGS = 60
"""More doublings than any cap needs; bounds `2**attempt` so a long outage cannot overflow."""


def backoff_bound_s(attempt: int, *, initial_s: float, max_s: float) -> float:
    """Return the upper bound of the `attempt`-th retry delay: min(max, initial * 2**attempt)."""
    return min(max_s, initial_s * 2.0 ** min(max(attempt, 0), _MAX_DOUBLINGS))


def backoff_s(attempt: int, *, initial_s: float, max_s: float, rnd: random.Random) -> float:
    """Full-jitter exponential backoff: uniform(0, min(max, initial * 2**attempt)).

    The exponent is clamped: after about a thousand failures (some 45 minutes of controller
    outage at the defaults) `initial * 2**attempt` would overflow a float and kill the loop.
    """
    return rnd.uniform(0, backoff_bound_s(attempt, initial_s=initial_s, max_s=max_s))


class TokenFile:
    """A bearer token that is re-read when its file changes (kubelet rotation)."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def get(self, *, force: bool = False) -> str:
        """Return the token, re-reading the file if it changed; '' when there is none."""
        try:
            st = self._path.stat()
        except OSError:
            self._stamp, self._token = None, ""
            return ""
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if force or stamp != self._stamp:
            try:
                self._token = self._path.read_text().strip()
            except (OSError, UnicodeDecodeError):
                # The kubelet swaps the projected volume's symlink between our stat and read;
                # try again next time rather than let the heartbeat loop die.
                self._stamp, self._token = None, ""
                return ""
            self._stamp = stamp
        return self._token


@dataclasses.dataclass
class Stats:
    """What `/v1/gpus` and the bench show about heartbeats."""

    sent: int = 0
    failed: int = 0
    last_sent_at: dt.datetime | None = None
    last_error: str = ""
    target: str = ""


class Reporter:
    """Send heartbeats for one `Monitor`."""

    def __init__(
        self,
        config: settings.Settings,
        monitor: monitoring.Monitor,
        *,
        clock: Callable[[], dt.datetime] = monitoring.utcnow,
        rnd: random.Random | None = None,
        pause: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Report for `monitor`; `rnd` and `pause` are seams for tests.

        `pause(delay_s)` waits between heartbeats; the default returns early when a verdict
        changes, so the change is sent at once.
        """
        self._settings = config
        self._monitor = monitor
        self._clock = clock
        self._rnd = rnd or random.Random()  # noqa: S311 - jitter, not cryptography
        self._pause = pause or self._wait_or_poke
        self._token = TokenFile(config.token_path)
        self._poke = asyncio.Event()
        self._sequence = 0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.stats = Stats(target=config.controller_url)
        monitor.subscribe(lambda _view: self._poke.set())

    async def start(self) -> None:
        """Open the HTTP session and start the loop."""
        await self.open()
        self._task = asyncio.create_task(self._run(), name="heartbeats")

    async def open(self) -> None:
        """Open the HTTP session only (tests step `send_once` themselves)."""
        if self._session is not None:
            return
        ssl_ctx: ssl.SSLContext | bool = True
        if self._settings.ca_path is not None:
            ssl_ctx = ssl.create_default_context(cafile=str(self._settings.ca_path))
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._settings.heartbeat_timeout_s),
            connector=aiohttp.TCPConnector(ssl=ssl_ctx),
        )

    async def stop(self) -> None:
        """Stop the loop and close the session."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        attempt = 0
        while True:
            self._poke.clear()
            try:
                ok = await self.send_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                # Whatever went wrong, the loop must outlive it: a dead loop is a node the
                # controller declares stale while the agent looks healthy locally.
                log.exception("heartbeat_loop_error")
                self._fail(self._settings.controller_url, f"{type(err).__name__}: {err}")
                ok = False
            if ok:
                attempt = 0
                delay = self._settings.heartbeat_interval_s
            else:
                delay = backoff_s(
                    attempt,
                    initial_s=self._settings.backoff_initial_s,
                    max_s=min(self._settings.backoff_max_s, self._settings.heartbeat_interval_s),
                    rnd=self._rnd,
                )
                attempt += 1
            await self._pause(delay)

    async def _wait_or_poke(self, delay_s: float) -> None:
        """Wait `delay_s`, or less when a verdict changes."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._poke.wait()

    async def send_once(self) -> bool:
        """Send one heartbeat to the controller URL; return whether it landed."""
        if self._session is None or not self._settings.controller_url:
            return True
        if self._monitor.view.taken_at is None:
            return True
        self._sequence += 1
        body = heartbeat.encode(snapshots.build_heartbeat(
            self._monitor.view,
            interval_s=self._settings.heartbeat_interval_s,
            agent_url=self._settings.effective_agent_url(),
            sequence=self._sequence,
            now=self._clock(),
        ))  # fmt: skip
        base = self._settings.controller_url.rstrip("/")
        url = base if base.endswith("/v1/heartbeats") else f"{base}/v1/heartbeats"
        return await self._post(url, body)

    async def _post(self, url: str, body: bytes) -> bool:
        """POST once (no redirect followed); True when the controller took the report."""
        assert self._session is not None
        for retry_auth in (False, True):
            token = self._token.get(force=retry_auth)
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                async with self._session.post(
                    url, data=body, headers=headers, allow_redirects=False
                ) as resp:
                    payload = await resp.read()
                    if resp.status < 300:
                        self.stats.sent += 1
                        self.stats.last_sent_at = self._clock()
                        self.stats.last_error = ""
                        self.stats.target = url
                        return True
                    if resp.status == 401 and not retry_auth:
                        continue
                    self._fail(url, f"HTTP {resp.status}: {payload[:200]!r}")
                    return False
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                self._fail(url, f"{type(err).__name__}: {err}")
                return False
        return False

    def _fail(self, url: str, error: str) -> None:
        self.stats.failed += 1
        self.stats.last_error = error
        self.stats.target = url
        log.warning("heartbeat_failed", url=url, error=error)
