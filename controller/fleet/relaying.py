"""The follower's relay loop: heartbeats to the leader in batches (DESIGN.md section 6).

`Relayer.submit` is what `POST /v1/heartbeats` calls on a follower once a report passed
authentication, decoding and the checks: it queues the report in the pure core
(`controller.fleet.relays`) and, for a change, waits for the leader's answer to it. `run`
sends `POST /v1/peer/heartbeats` every `peer_batch_interval_s`, and at once when a change
is queued or the leader needs a full report, to the leader-only address as every forward
does (`forwarding.to_leader`: the chart's CA, no redirects, this replica's peer token). A
batch larger than `peer_max_body_bytes` goes as several requests, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

import msgspec
import structlog

from controller import auth, errors, forwarding, serving
from controller.fleet import relays, reports
from controller.settings import ControllerSettings
from shared import fastheartbeat

log = structlog.get_logger()

PATH = "/v1/peer/heartbeats"
_OVERHEAD = len(b'{"entries":[]}')


def limits_from(settings: ControllerSettings) -> relays.Limits:
    """The relay's bounds from the controller's settings."""
    return relays.Limits(
        max_entries=settings.peer_batch_max_entries,
        refresh_s=settings.peer_full_refresh_s,
        max_age_s=settings.heartbeat_max_skew_s,
        down_after_s=settings.peer_unreachable_after_s,
        stale_multiplier=settings.stale_multiplier,
    )


class Relayer:
    """One follower's relay: the pure core, the agents waiting on changes, the flush loop."""

    def __init__(
        self, st: serving.ServingState, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._st = st
        self._clock = clock
        self.core = relays.Relay(limits_from(st.settings))
        self._waiting: dict[int, asyncio.Future[relays.Answer]] = {}
        self._wake = asyncio.Event()
        self.batches = 0
        """Requests sent to the leader (tests and benches count them)."""

    async def submit(self, hb: fastheartbeat.Report, who: auth.Identity) -> relays.Kind:
        """Relay one checked report from the agent `who`: LIVENESS once queued, CHANGE once
        the leader took it; the leader's refusal, or Unavailable (503), otherwise."""
        now = self._clock()
        key = reports.change_key(hb, who.pod_uid or "")
        kind, ticket = self.core.offer(hb, who, key, now)
        if ticket is None:
            if self.core.down(now):
                msg = f"could not reach the leader: {self.core.problem}"
                raise errors.Unavailable(msg, code="LeaderUnreachable")
            return kind
        future = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = future
        self._wake.set()
        try:
            answer = await future
        finally:
            self._waiting.pop(ticket, None)
        if answer.outcome is reports.Relayed.REFUSED:
            raise forwarding.error_of(answer.status, answer.code, answer.message, answer.field)
        return kind

    async def run(self) -> None:
        """Flush every interval, or at once when woken: then only the changes (and what the
        leader needs), so a change never waits for the fleet's liveness; forever (cancelled
        with the app)."""
        interval = self._st.settings.peer_batch_interval_s
        flushed_at = self._clock()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, flushed_at + interval - self._clock())):
                    await self._wake.wait()
            self._wake.clear()
            if self._st.elector.is_leader():
                leads = errors.Unavailable("this replica leads now; retry", code="NotLeader")
                self._answer(self.core.reset(), leads)
                flushed_at = self._clock()
                continue
            everything = self._clock() >= flushed_at + interval
            if everything:
                flushed_at = self._clock()
            try:
                await self.flush(urgent=not everything)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the loop; the entries stay queued
                log.exception("heartbeat relay flush failed")

    async def flush(self, *, urgent: bool = False) -> None:
        """Send everything queued (`urgent`: only changes and what the leader needs), in
        batches, until nothing is (or the leader is not reached: what is left stays queued
        for the next interval). What the leader needs goes at once, in the same flush."""
        while batch := self.core.take(self._clock(), urgent=urgent):
            now = self._clock()
            bodies = [_encode(e, now) for e in batch]
            start = 0
            for end in _cuts(bodies, self._st.settings.peer_max_body_bytes - _OVERHEAD):
                chunk = batch[start:end]
                try:
                    answers = await self._send(chunk, bodies[start:end])
                except errors.ControllerError as err:
                    rest = batch[start:]
                    tickets = self.core.failed(rest, self._clock(), err.message)
                    log.warning("heartbeat relay: leader not reached", error=err.message,
                                code=err.code, entries=len(rest))  # fmt: skip
                    self._answer(tickets, err)
                    return
                done, _ = self.core.settle(chunk, answers, self._clock())
                for ticket, answer in done.items():
                    future = self._waiting.get(ticket)
                    if future is not None and not future.done():
                        future.set_result(answer)
                start = end

    async def _send(self, chunk: list[relays.Entry], bodies: list[bytes]) -> list[relays.Answer]:
        """One request to the leader; its answer per entry, or errors.Unavailable."""
        m = self._st.metrics
        full = sum(1 for e in chunk if e.full)
        body = b'{"entries":[' + b",".join(bodies) + b"]}"
        status, _, payload = await forwarding.to_leader(
            self._st, "POST", PATH, body, {"Content-Type": serving.JSON}
        )
        self.batches += 1
        if status != 200:
            code = forwarding.error_code(payload)
            msg = f"the leader answered {status} {code}: {payload[:200]!r}"
            raise errors.Unavailable(msg, code="LeaderUnreachable")
        try:
            answers = relays.answers_of(relays.ANSWER_DECODER.decode(payload))
        except msgspec.MsgspecError as err:
            msg = f"the leader's answer is not one this replica reads: {err}"
            raise errors.Unavailable(msg, code="LeaderUnreachable") from err
        if len(answers) != len(chunk):
            msg = f"the leader answered {len(answers)} entries of {len(chunk)}"
            raise errors.Unavailable(msg, code="LeaderUnreachable")
        m.relayed.labels("full").inc(full)
        m.relayed.labels("liveness").inc(len(chunk) - full)
        m.relay_batch.observe(len(chunk))
        return answers

    def _answer(self, tickets: list[int], err: errors.ControllerError) -> None:
        for ticket in tickets:
            future = self._waiting.get(ticket)
            if future is not None and not future.done():
                future.set_exception(errors.Unavailable(err.message, code=err.code))


def _cuts(bodies: list[bytes], limit: int) -> Iterator[int]:
    """Where to end each request so that its entries' bodies (and their commas) fit
    `limit` bytes; an entry larger than the limit alone goes alone."""
    size = 0
    for index, body in enumerate(bodies):
        cost = len(body) + 1
        if index and size + cost > limit:
            yield index
            size = 0
        size += cost
    yield len(bodies)


def _encode(entry: relays.Entry, now: float) -> bytes:
    r = entry.report
    doc: dict[str, object] = {
        "node": entry.node,
        "key": entry.key,
        "bootId": r.boot_id,
        "sequence": r.sequence,
        "sentAt": fastheartbeat.wire_time(r.sent_at),
        "receivedAgoMs": relays.ago_ms(now, entry.last_at),
        "firstAgoMs": relays.ago_ms(now, entry.first_at),
    }
    if entry.full:
        caller = entry.caller
        if not isinstance(caller, auth.Identity):  # pragma: no cover - submit gives one
            msg = f"the relay holds a caller that is no identity: {type(caller).__name__}"
            raise TypeError(msg)
        doc["report"] = msgspec.Raw(fastheartbeat.wire(r))
        doc["caller"] = auth.encode_caller(caller)
    return relays.ENCODER.encode(doc)
