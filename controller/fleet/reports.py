"""A heartbeat report judged at the door (pure): the bounds this controller accepts beyond
the wire schema's (`heartbeat_problem`: `intervalS` within the chart's range, `sentAt`
within a skew of the receive time), and the digest of what the leader's decisions depend on
(`change_key`), by which a follower relays a report that changed nothing as a liveness
entry."""

from __future__ import annotations

import datetime as dt
import enum
import hashlib

import msgspec

from shared import fastheartbeat


def interval_problem(
    hb: fastheartbeat.Report, *, min_interval_s: float, max_interval_s: float
) -> str | None:
    """Why a heartbeat's `intervalS` lies outside the range this controller accepts (the
    published schema's range too); None when it does not."""
    if min_interval_s <= hb.interval_s <= max_interval_s:
        return None
    return (
        f"intervalS {hb.interval_s:g} is outside {min_interval_s:g}..{max_interval_s:g} s,"
        " the range this controller accepts (agent.heartbeatIntervalS in the chart)"
    )


def heartbeat_problem(
    hb: fastheartbeat.Report,
    now: dt.datetime,
    *,
    min_interval_s: float,
    max_interval_s: float,
    max_skew_s: float,
) -> tuple[str, str] | None:
    """The field of a heartbeat outside what this controller accepts, and why; None if none.

    Every field an agent sends is bounded (DESIGN.md section 10): `intervalS` within the
    chart's range, since staleness is measured in intervals, and `sentAt` within a skew of
    the receive time `now`, since replays are told apart by it. The sequence's bound (int64)
    is the wire schema's.
    """
    problem = interval_problem(hb, min_interval_s=min_interval_s, max_interval_s=max_interval_s)
    if problem is not None:
        return "intervalS", problem
    if hb.sent_at.tzinfo is None:
        return "sentAt", "sentAt must carry a time zone (RFC 3339, e.g. 2026-01-01T00:00:00Z)"
    skew = (hb.sent_at - now).total_seconds()
    if abs(skew) > max_skew_s:
        msg = (
            f"sentAt is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the"
            f" controller's clock; at most {max_skew_s:g} s is accepted (is the node's clock"
            " synchronised?)"
        )
        return "sentAt", msg
    return None


def change_key(hb: fastheartbeat.Report, pod_uid: str) -> str:
    """A short digest of everything in a report the leader's decisions depend on, but the
    sequence, `sentAt` and the GPU readings: boot, interval, driver, DCGM, each GPU's
    identity, verdict, action and findings, and the agent pod the report came from (so a new
    agent pod's `agentUrl` reaches the leader). Two reports with one key make the leader
    decide the same; a follower relays a report whose key it already delivered as a compact
    liveness entry (`controller.fleet.relays`), and the leader checks the key against its
    record of the node before it applies one. Same value for either form of a report."""
    gpus = [
        (g.index, g.uuid, g.name, g.pci_bus_id, g.verdict.value, g.action.value, [
            (r.code, r.verdict.value, r.action.value, r.message, r.xid, r.latched,
             r.clears_when, None if r.since is None else r.since.isoformat())
            for r in g.reasons
        ])
        for g in hb.gpus
    ]  # fmt: skip
    parts = (hb.boot_id, float(hb.interval_s), hb.driver_version, hb.dcgm_available, pod_uid)
    digest = hashlib.blake2b(msgspec.msgpack.encode((parts, gpus)), digest_size=8)
    return digest.hexdigest()


class Relayed(enum.StrEnum):
    """What the leader made of one entry of a follower's batch (`POST /v1/peer/heartbeats`)."""

    ACCEPTED = "Accepted"
    REPLAY = "Replay"
    """Not newer than what the leader holds (same boot, sequence and `sentAt` no later)."""
    NEED = "Need"
    """A liveness entry the leader cannot apply (no record, or its record has another key):
    the follower sends the full report at once."""
    OUTDATED = "Outdated"
    """A liveness entry older than the leader's record, which has another key (a newer
    report came through another replica): nothing to apply."""
    REFUSED = "Refused"
    """A full report refused as a direct heartbeat would be (the error says why)."""
