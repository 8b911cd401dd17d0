"""Leader election on a Lease, and the label that makes the leader-only Service find it.

`kubernetes_asyncio.leaderelection` falls short for us in three ways, so this module keeps the
same algorithm as client-go's leaderelection in a small form of our own:
- it cannot keep annotations of ours on the Lease: the fleet state that must survive a
  failover (the breaker, dry run) and, for people, `taugrid.dev/leader-url` (informational:
  nothing is ever sent to it; followers reach the leader through the leader-only Service);
- it offers no "is the lease still held right now" check, and every write of ours must make
  that check (a leader that cannot renew must stop acting before another can take over);
- it judges expiry from timestamps written by another host's clock; we judge it, like
  client-go, from when *we* last saw the record change, so clock skew cannot cause two leaders.

The decision (acquire, renew, or wait) is a pure function; `Elector` is the loop around it.
`LeaderMark` keeps the `taugrid.dev/leader` label on this replica's pod equal to whether it
leads, which is what the leader-only Service selects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import structlog

from controller import errors

log = structlog.get_logger()


class NotLeaderError(errors.Unavailable):
    """A write was attempted by a replica that does not hold the lease right now."""

    default_code = "NotLeader"


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What the Lease says; `version` is its resourceVersion for optimistic writes."""

    holder: str
    duration_s: float
    renew_time: dt.datetime | None
    acquire_time: dt.datetime | None
    transitions: int
    leader_url: str
    version: str
    state: tuple[tuple[str, str], ...] = ()
    """Other `taugrid.dev/` annotations the leader keeps on the Lease (fleet state that must
    survive a failover: the breaker, dry run); carried over unchanged by every renewal."""


class LeaseStore(Protocol):
    """Read and write the Lease (the Kubernetes adapter implements this)."""

    async def read(self) -> LeaseRecord | None:
        """Return the Lease, None when it does not exist."""
        ...

    async def write(self, record: LeaseRecord, *, create: bool) -> LeaseRecord | None:
        """Create or replace (conditionally on `record.version`); None when another won."""
        ...


@dataclasses.dataclass(frozen=True)
class Observation:
    """The last record seen and when (on our monotonic clock) it last changed."""

    record: LeaseRecord | None
    changed_at: float


def expired(obs: Observation, now: float) -> bool:
    """True when the observed holder has not renewed for a whole lease duration."""
    rec = obs.record
    if rec is None or not rec.holder:
        return True
    return now - obs.changed_at > rec.duration_s


def next_record(
    obs: Observation,
    *,
    identity: str,
    url: str,
    duration_s: float,
    wall: dt.datetime,
    now: float,
) -> LeaseRecord | None:
    """Return the record to write (acquire or renew), or None to keep waiting."""
    rec = obs.record
    if rec is not None and rec.holder == identity:
        return dataclasses.replace(rec, renew_time=wall, duration_s=duration_s, leader_url=url)
    if rec is not None and not expired(obs, now):
        return None
    return LeaseRecord(
        holder=identity,
        duration_s=duration_s,
        renew_time=wall,
        acquire_time=wall,
        transitions=(rec.transitions + 1) if rec is not None else 0,
        leader_url=url,
        version=rec.version if rec is not None else "",
        state=rec.state if rec is not None else (),
    )


class Elector:
    """Try to acquire and keep the Lease; tell the rest of the controller who leads."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        url: str,
        *,
        lease_duration_s: float,
        renew_deadline_s: float,
        retry_period_s: float,
        on_started: Callable[[], Awaitable[None]] | None = None,
        on_stopped: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.identity = identity
        self.url = url
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._clock = clock
        self._obs = Observation(None, clock())
        self._renewed_at: float | None = None
        self.leader_since: float | None = None
        self.transitions = 0

    # ------------------------------------------------------------------ queries
    def is_leader(self) -> bool:
        """True while we hold the lease and renewed it within the renew deadline."""
        if self._renewed_at is None:
            return False
        return self._clock() - self._renewed_at < self.renew_deadline_s

    def ensure_leader(self) -> None:
        """Raise NotLeaderError unless `is_leader()`: call before every write."""
        if not self.is_leader():
            msg = f"{self.identity} does not hold the lease"
            raise NotLeaderError(msg)

    @property
    def lease_state(self) -> dict[str, str]:
        """The fleet state kept on the Lease, as last observed."""
        return dict(self._obs.record.state) if self._obs.record else {}

    @property
    def leader_identity(self) -> str:
        """The identity the Lease names (may be stale by up to one retry period)."""
        return self._obs.record.holder if self._obs.record else ""

    # ------------------------------------------------------------------ loop
    async def step(self) -> None:
        """One round: observe the Lease, then acquire or renew when allowed."""
        now = self._clock()
        current = await self.store.read()
        if current != self._obs.record:
            self._obs = Observation(current, now)
        candidate = next_record(
            self._obs,
            identity=self.identity,
            url=self.url,
            duration_s=self.lease_duration_s,
            wall=dt.datetime.now(dt.UTC),
            now=now,
        )
        if candidate is None:
            await self._lost()
            return
        written = await self.store.write(candidate, create=current is None)
        if written is None:
            await self._lost()
            return
        self._obs = Observation(written, self._clock())
        self._renewed_at = now
        if self.leader_since is None:
            self.leader_since = now
            self.transitions += 1
            if self._on_started is not None:
                await self._on_started()

    async def _lost(self) -> None:
        if self.leader_since is not None and not self.is_leader():
            self.leader_since = None
            self._renewed_at = None
            if self._on_stopped is not None:
                await self._on_stopped()

    async def run(self) -> None:
        """Loop until cancelled; API errors count as a failed renewal, never crash the loop."""
        try:
            while True:
                try:
                    await self.step()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001  (any API failure = no renewal this round)
                    await self._lost()
                await asyncio.sleep(self.retry_period_s)
        finally:
            await self.release()

    async def release(self) -> None:
        """Give the lease up on shutdown so a follower takes over at once."""
        rec = self._obs.record
        if rec is None or rec.holder != self.identity or not self.is_leader():
            return
        self._renewed_at = None
        self.leader_since = None
        expired_rec = dataclasses.replace(rec, holder="", leader_url="", duration_s=1.0)
        # Best effort: if this fails the lease simply expires.
        with contextlib.suppress(Exception):
            await self.store.write(expired_rec, create=False)


class PodLabel(Protocol):
    """This replica's pod's leader label (the Kubernetes adapter implements this)."""

    async def set_leader(self, leading: bool) -> None:
        """Set the label (leading) or remove it."""
        ...


class LeaderMark:
    """Keep the leader label on this replica's pod equal to whether it leads.

    Level-triggered: each round compares what the elector says with what was last written
    and writes only a difference, so a failed write is retried, a container restarted in a
    pod that still carries the label removes it (the first round always writes), and a
    leader that lost the lease stops being an endpoint of the leader-only Service.
    """

    def __init__(self, label: PodLabel, elector: Elector, *, interval_s: float) -> None:
        self._label = label
        self._elector = elector
        self._interval_s = interval_s
        self.written: bool | None = None
        """The label last written (True: set), None before the first write succeeded."""
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Sync at once (the elector started or stopped leading)."""
        self._wake.set()

    async def sync(self) -> None:
        """Write the label when it differs from whether this replica leads now."""
        leading = self._elector.is_leader()
        if leading != self.written:
            await self._label.set_leader(leading)
            self.written = leading
            log.info("leader label", leading=leading)

    async def run(self) -> None:
        """Sync until cancelled; a failed write is logged and retried next round."""
        while True:
            self._wake.clear()
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader_label_failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()

    async def clear(self) -> None:
        """Remove the label (shutdown), before the lease is given up; best effort."""
        try:
            await self._label.set_leader(False)
            self.written = False
        except Exception:  # noqa: BLE001  (shutting down: the next leader's label wins anyway)
            log.warning("leader label not removed on shutdown")


async def run_passes(
    loop: str,
    pass_once: Callable[[], Awaitable[float | None]],
    *,
    wake: asyncio.Event,
    interval_s: float,
    elector: Elector,
    failures: Callable[[str], None],
    ready: Callable[[], bool] = lambda: True,
    on_follower: Callable[[], None] | None = None,
    min_gap_s: float = 0.0,
) -> None:
    """Run a control loop's passes while leading, until cancelled: the one shape the
    quarantine, admission and run loops share.

    The wake event is cleared before each pass, so a poke that arrives during a pass asks
    for another. A pass returns the seconds until it is due again (None: the interval). A
    pass that fails is logged with its traceback and counted (`failures(loop)`), and the
    next one retries; losing the lease mid-pass is expected and only logged. `min_gap_s`
    spaces passes that pokes would otherwise run back to back.
    """
    while True:
        wake.clear()
        delay = interval_s
        if elector.is_leader() and ready():
            try:
                due = await pass_once()
                if due is not None:
                    delay = min(delay, max(due, 0.01))
            except asyncio.CancelledError:
                raise
            except NotLeaderError:
                log.warning("pass_lost_lease", loop=loop)
            except Exception:
                log.exception("pass_failed", loop=loop)
                failures(loop)
        elif on_follower is not None:
            on_follower()
        if min_gap_s:
            await asyncio.sleep(min(min_gap_s, delay))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()


class WhileLeading:
    """A background task that runs only while this replica leads, such as the run
    reconciler's caches: the elector's `on_started` calls `start`, its `on_stopped` (and the
    shutdown) `stop`."""

    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]] | None = None):
        self.name = name
        self.run = run
        """What to run (set by the composition root once it is built)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Whether the task runs now."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task unless it runs already."""
        if self.run is not None and not self.running:
            self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        """Cancel the task and wait for it to end (nothing when it does not run)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
