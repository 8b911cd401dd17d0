"""The kernel log as a second Xid source: `NVRM: Xid` lines from `/dev/kmsg`.

Where the state file knows this boot, reading from the start of the ring buffer recovers Xids
raised while the agent was down; the verdict core keeps the last folded record's sequence
number per boot, so a restart does not count them twice. Where it does not (a first install, a
state file moved aside) the agent starts at the tail, and after a reboot it reads this boot's
records only within a lookback window (`replay_from`, NVSentinel's `handleBootIDChange`).
The path is a setting: tests feed a regular file or a FIFO in the same
`priority,sequence,timestamp_us,flags;message` record format.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pathlib
import re
import stat
import threading
import time
from collections.abc import Callable

from agent import readings

_RECORD = re.compile(
    r"(?P<prio>[0-9]{1,20}),(?P<seq>[0-9]{1,20}),(?P<ts>[0-9]{1,20}),[^;]*;(?P<msg>.*)"
)
"""One record, matched in full (`fullmatch`: a `$` would also accept a trailing newline)."""
_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-9A-Fa-f]+)?)\): "
    r"(?P<xid>[0-9]{1,10})\b"
)
# Xid 144-150 (R565+): `<Xid>, <unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<IntrInfo>
# <ErrorStatus> <debug words...>)`, NVIDIA's "WORKFLOW_NVLINK5_ERR" bucket text; some
# drivers print the registers in brackets.
# Drivers that know the process print `, pid=<n>, name=<comm>` before the unit (NVSentinel's
# reXidNVL5Pattern, gpud's RegexNVRMXidExtended).
_NVLINK5 = re.compile(
    r"\A,\s*(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?(?P<unit>[A-Za-z0-9_/]+)\b.*?[(\[]\s*"
    r"(?P<regs>0x[0-9A-Fa-f]{1,8}(?:\s+0x[0-9A-Fa-f]{1,16})*)\s*[)\]]"
)
# Xid 154: `GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`.
_RECOVERY = re.compile(
    r"recovery action changed from 0x[0-9A-Fa-f]+ \([^)]*\) to 0x(?P<to>[0-9A-Fa-f]+)"
)


# NVSwitch: `nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up`
# (gpud sxid/README.md, NVSentinel pkg/sxid). The same SXid's `Severity …` and `Data {…}`
# follow-up lines carry no severity word and are not counted again.
_SXID = re.compile(
    r"nvidia-nvswitch(?P<switch>[0-9]{1,4}): SXid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): "
    r"(?P<sxid>[0-9]{1,10}), (?P<sev>Fatal|Non-fatal)(?:, Link (?P<link>[0-9]{1,4}))?"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One kernel-log record."""

    seq: int
    timestamp_us: int
    message: str


def parse_record(line: str) -> Record | None:
    """Parse one `/dev/kmsg` record; continuation lines and junk give None."""
    match = _RECORD.fullmatch(line.rstrip("\n"))
    if match is None:
        return None
    return Record(int(match["seq"]), int(match["ts"]), match["msg"])


def parse_xid(message: str) -> tuple[str, int] | None:
    """Return (PCI address, Xid) from an `NVRM: Xid (PCI:0000:07:00): 79, ...` message."""
    match = _XID.search(message)
    if match is None:
        return None
    return match["pci"], int(match["xid"])


@dataclasses.dataclass(frozen=True, slots=True)
class XidDetail:
    """What an Xid line says beyond its number, for the Xids that need it."""

    unit: str = ""
    intr_info: int | None = None
    error_status: int | None = None
    recovery_action: int | None = None


def parse_detail(message: str) -> XidDetail:
    """Read the Xid 144-150 registers or the Xid 154 new recovery action from a line."""
    match = _XID.search(message)
    if match is None:
        return XidDetail()
    code = int(match["xid"])
    rest = message[match.end() :]
    if 144 <= code <= 150:
        nvlink = _NVLINK5.search(rest)
        if nvlink is None:
            return XidDetail()
        regs = [int(word, 16) for word in nvlink["regs"].split()]
        return XidDetail(
            unit=nvlink["unit"],
            intr_info=regs[0],
            error_status=regs[1] if len(regs) > 1 else None,
        )
    if code == 154:
        recovery = _RECOVERY.search(rest)
        if recovery is not None:
            return XidDetail(recovery_action=int(recovery["to"], 16))
    return XidDetail()


def pci_key(address: str) -> tuple[int, int, int] | None:
    """Normalise `0000:07:00`, `00000000:07:00.0` and friends to (domain, bus, device)."""
    parts = address.lower().split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def to_event(
    record: Record,
    *,
    gpus_by_pci: dict[tuple[int, int, int], int],
    boot_time: dt.datetime,
) -> readings.XidEvent | None:
    """Turn an Xid record into an event attributed to a GPU index (None if not an Xid)."""
    parsed = parse_xid(record.message)
    if parsed is None:
        return None
    pci, code = parsed
    key = pci_key(pci)
    detail = parse_detail(record.message)
    return readings.XidEvent(
        xid=code,
        at=boot_time + dt.timedelta(microseconds=record.timestamp_us),
        source=readings.XidSource.KMSG,
        gpu_index=gpus_by_pci.get(key) if key else None,
        pci_bus_id=pci,
        message=record.message[:1024],
        kmsg_seq=record.seq,
        unit=detail.unit,
        intr_info=detail.intr_info,
        error_status=detail.error_status,
        recovery_action=detail.recovery_action,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Replay:
    """Where reading starts: at the tail, or at the head skipping records before `not_before`."""

    tail: bool
    not_before: dt.datetime | None = None


def replay_from(
    *, state_boot_id: str, boot_id: str, started_at: dt.datetime, lookback_s: float
) -> Replay:
    """Decide how much of the ring buffer to replay at start (NVSentinel's syslog monitor).

    - The state knows this boot: replay it all; the folded sequence number skips what was seen.
    - The state knows another boot (a reboot seen through its boot id): replay this boot's
      records, but only those within `lookback_s` of the start (0: no limit), so a node that
      stayed down for a long service does not re-report what an operator already fixed.
    - No state (a first install, or a state file moved aside): start at the tail. An Xid
      already in the buffer may have been cleared by a reset we can never observe, and a fleet
      rollout must not quarantine every node whose buffer still holds one.
    """
    if not state_boot_id:
        return Replay(tail=True)
    if state_boot_id == boot_id or lookback_s <= 0:
        return Replay(tail=False)
    return Replay(tail=False, not_before=started_at - dt.timedelta(seconds=lookback_s))


def to_sxid(record: Record, *, boot_time: dt.datetime) -> readings.SxidEvent | None:
    """Turn an NVSwitch SXid record into an event (None for anything else)."""
    match = _SXID.search(record.message)
    if match is None:
        return None
    return readings.SxidEvent(
        sxid=int(match["sxid"]),
        fatal=match["sev"] == "Fatal",
        at=boot_time + dt.timedelta(microseconds=record.timestamp_us),
        switch=int(match["switch"]),
        pci_bus_id=match["pci"],
        link=int(match["link"]) if match["link"] else None,
        message=record.message[:1024],
        kmsg_seq=record.seq,
    )


def boot_time_now() -> dt.datetime:
    """Estimate the wall-clock time of boot on the clock kmsg timestamps use (monotonic)."""
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=time.monotonic())


class Reader:
    """Read kernel-log records in a thread and hand each one to `deliver` (thread-safe).

    `/dev/kmsg` returns one record per read and blocks at the end; a regular file is followed
    like `tail -f`; a FIFO blocks on read. EPIPE (the ring buffer overwrote unread records) skips
    ahead, which is what the kernel asks readers to do.
    """

    def __init__(
        self,
        path: pathlib.Path,
        deliver: Callable[[Record], None],
        *,
        poll_s: float = 0.2,
        tail: bool = False,
    ) -> None:
        self._path = path
        self._tail = tail
        self._deliver = deliver
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
        self.error = ""

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Ask the thread to stop; a blocked device read is left to die with the process."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            mode = self._path.stat().st_mode
            if stat.S_ISCHR(mode):
                self._read_device()
            else:
                self._read_lines()
        except OSError as err:
            self.error = f"cannot read {self._path}: {err}"

    def _read_device(self) -> None:
        fd = os.open(self._path, os.O_RDONLY)
        try:
            if self._tail:
                # /dev/kmsg: SEEK_END moves past the last record (Documentation/ABI, dev-kmsg).
                os.lseek(fd, 0, os.SEEK_END)
            while not self._stop.is_set():
                try:
                    chunk = os.read(fd, 8192)
                except BrokenPipeError:
                    continue
                if not chunk:
                    return
                self._emit(chunk.decode(errors="replace"))
        finally:
            os.close(fd)

    def _read_lines(self) -> None:
        with self._path.open(encoding="utf-8", errors="replace") as fh:
            if self._tail and self._path.is_file():
                fh.seek(0, os.SEEK_END)
            buffer = ""
            while not self._stop.is_set():
                line = fh.readline()
                if not line:
                    self._stop.wait(self._poll_s)
                    continue
                buffer += line
                if buffer.endswith("\n"):
                    self._emit(buffer)
                    buffer = ""

    def _emit(self, text: str) -> None:
        for line in text.splitlines():
            record = parse_record(line)
            if record is not None:
                self._deliver(record)
