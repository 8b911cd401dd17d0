"""The kernel log as an Xid source: `/dev/kmsg` records, `NVRM: Xid` lines from several driver
generations, lines that only look similar, and PCI bus ids mapped to NVML GPU indexes."""

from __future__ import annotations

import datetime as dt
import pathlib
import threading
import time

import pytest

from agent import readings
from agent.probing import kmsg

BOOT = dt.datetime(2026, 5, 1, 2, 0, tzinfo=dt.UTC)
DEADLINE_S = 30.0

# NVML's `busId` for the HGX H100 layout the fake uses, as `nvmlDeviceGetPciInfo` returns it.
NVML_BUS_IDS = {
    0: "00000000:18:00.0",
    1: "00000000:2A:00.0",
    2: "00000000:3A:00.0",
    3: "00000000:5D:00.0",
    4: "00000000:9A:00.0",
    5: "00000000:AB:00.0",
    6: "00000000:BA:00.0",
    7: "00000000:DB:00.0",
    8: "00000001:18:00.0",
}
BY_PCI = {key: index for index, bus in NVML_BUS_IDS.items() if (key := kmsg.pci_key(bus))}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            "NVRM: Xid (PCI:0000:07:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            ("0000:07:00", 79), id="an R535-style line with pid and name gives its Xid"),
        pytest.param(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
            ("0000:3b:00", 79), id="an R470-style line with pid and no name gives its Xid"),
        pytest.param(
            "NVRM: Xid (PCI:0000:02:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0):"
            " Out Of Range Address",
            ("0000:02:00", 13), id="an R3xx-style line without pid gives its Xid"),
        pytest.param(
            "NVRM: Xid (PCI:0000:ab:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable"
            " double bit error (DBE) has been detected on GPU in the framebuffer at partition 6,"
            " subpartition 0.",
            ("0000:ab:00", 48), id="an R550-style line with an unknown pid gives its Xid"),
        pytest.param(
            "NVRM: Xid (PCI:0000:18:00): 119, pid=2146, name=python, Timeout after 6s of waiting"
            " for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
            ("0000:18:00", 119), id="a GSP timeout line gives Xid 119, not the 6 or 76 in it"),
        pytest.param(
            "NVRM: Xid (PCI:0000:DB:00.0): 94, pid=77, name=torchrun, Contained: SM (0x1)."
            " RST: No, D-RST: No",
            ("0000:DB:00.0", 94), id="an upper-case bus id with a function number is accepted"),
        pytest.param(
            "NVRM: Xid (PCI:0001:18:00): 154, GPU recovery action changed from 0x0 (None) to"
            " 0x2 (Node Reboot Required)",
            ("0001:18:00", 154), id="a non-zero PCI domain is kept"),
    ],
)  # fmt: skip
def test_parse_xid_reads_every_driver_generation(message: str, expected: tuple[str, int]) -> None:
    """The PCI address and the Xid code come out of each known line shape."""
    assert kmsg.parse_xid(message) == expected


@pytest.mark.parametrize(
    "message",
    [
        pytest.param("NVRM: GPU at PCI:0000:07:00: GPU-6ac1e2a4-0b33-6a1b-5c7e-5bd8a5c6f1a0",
                     id="the GPU announcement at driver load is not an Xid"),
        pytest.param("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
                     id="the driver banner is not an Xid"),
        pytest.param("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32"
                     " egress non-posted PRIV error", id="an NVSwitch SXid is not a GPU Xid"),
        pytest.param("NVRM: Xid (PCI:0000:07:00): GPU has fallen off the bus.",
                     id="an Xid line without a code is ignored"),
        pytest.param("pcieport 0000:00:01.0: AER: Corrected error received: 0000:07:00.0",
                     id="a PCIe AER line is not an Xid"),
        pytest.param("", id="an empty message is not an Xid"),
    ],
)  # fmt: skip
def test_parse_xid_ignores_lines_that_are_not_xids(message: str) -> None:
    """Lines that merely resemble an Xid give None."""
    assert kmsg.parse_xid(message) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("6,1234,5678901,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1, GPU has fallen",
                     kmsg.Record(1234, 5678901, "NVRM: Xid (PCI:0000:07:00): 79, pid=1, GPU has"
                                 " fallen"),
                     id="a record gives sequence, microseconds and message"),
        pytest.param("4,88,1000,c,caller=T512;NVRM: Xid (PCI:0000:07:00): 13, Graphics\n",
                     kmsg.Record(88, 1000, "NVRM: Xid (PCI:0000:07:00): 13, Graphics"),
                     id="a record with a caller field and a trailing newline parses"),
        pytest.param("3,9,5,-;a; message; with semicolons", kmsg.Record(9, 5,
                     "a; message; with semicolons"),
                     id="semicolons in the message stay in the message"),
        pytest.param(" SUBSYSTEM=pci", None, id="a continuation line is not a record"),
        pytest.param(" DEVICE=+pci:0000:07:00.0", None, id="a device continuation is not a record"),
        pytest.param("[ 1234.567] NVRM: Xid (PCI:0000:07:00): 79", None,
                     id="dmesg's human format is not a kmsg record"),
        pytest.param("", None, id="an empty line is not a record"),
    ],
)  # fmt: skip
def test_parse_record_reads_the_kmsg_prefix(line: str, expected: kmsg.Record | None) -> None:
    """`priority,sequence,timestamp_us,flags;message` becomes a Record; anything else None."""
    assert kmsg.parse_record(line) == expected


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("0000:5d:00", 3, id="the kernel's short form finds the GPU NVML calls 3"),
        pytest.param("0000:5D:00", 3, id="upper-case hex finds the same GPU"),
        pytest.param("00000000:5d:00.0", 3, id="NVML's eight-digit domain form matches itself"),
        pytest.param("0000:db:00.0", 7, id="a function number is ignored"),
        pytest.param("0001:18:00", 8, id="the PCI domain tells apart GPUs on the same bus"),
        pytest.param("0000:07:00", None, id="a bus no GPU sits on maps to no index"),
    ],
)  # fmt: skip
def test_pci_bus_ids_map_to_gpu_indexes(address: str, expected: int | None) -> None:
    """Kernel and NVML spellings of one PCI address meet on the same GPU index."""
    key = kmsg.pci_key(address)
    assert key is not None
    assert BY_PCI.get(key) == expected


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("07:00", id="an address without a domain is refused"),
        pytest.param("zz:07:00", id="an address with a non-hex part is refused"),
        pytest.param("", id="an empty address is refused"),
    ],
)
def test_pci_key_refuses_malformed_addresses(address: str) -> None:
    """A malformed address gives None instead of a wrong GPU."""
    assert kmsg.pci_key(address) is None


@pytest.mark.parametrize(
    ("line", "gpu_index", "xid"),
    [
        pytest.param("3,7,2500000,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the"
                     " bus.", 3, 79, id="an Xid 79 record becomes an event on GPU 3"),
        pytest.param("4,8,2500000,-;NVRM: Xid (PCI:0000:07:00): 13, pid=9, name=a.out, Graphics",
                     None, 13, id="an Xid on an unknown bus keeps its PCI id and no index"),
    ],
)  # fmt: skip
def test_to_event_attributes_the_xid(line: str, gpu_index: int | None, xid: int) -> None:
    """The event carries GPU index, code, source, sequence and the boot-relative time."""
    record = kmsg.parse_record(line)
    assert record is not None
    event = kmsg.to_event(record, gpus_by_pci=BY_PCI, boot_time=BOOT)
    assert event is not None
    assert (event.gpu_index, event.xid, event.source) == (
        gpu_index,
        xid,
        readings.XidSource.KMSG,
    )
    assert event.kmsg_seq == record.seq
    assert event.at == BOOT + dt.timedelta(seconds=2.5)
    assert event.message == record.message


def test_to_event_ignores_records_that_are_not_xids() -> None:
    """A non-Xid record produces no event."""
    record = kmsg.Record(5, 1, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15")
    assert kmsg.to_event(record, gpus_by_pci=BY_PCI, boot_time=BOOT) is None


def test_reader_follows_a_file_and_waits_for_whole_lines(tmp_path: pathlib.Path) -> None:
    """Records appended later are delivered; half a line waits for its end; junk is skipped."""
    path = tmp_path / "kmsg"
    path.write_text("6,1,100,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n SUBSYSTEM=pci\n")
    got: list[kmsg.Record] = []
    lock = threading.Lock()

    def deliver(record: kmsg.Record) -> None:
        with lock:
            got.append(record)

    def seqs() -> list[int]:
        with lock:
            return [r.seq for r in got]

    def wait_for(expected: list[int]) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while seqs() != expected:
            assert time.monotonic() < deadline, f"records {seqs()} != {expected}"
            time.sleep(0.01)

    reader = kmsg.Reader(path, deliver, poll_s=0.01)
    reader.start()
    try:
        wait_for([1])
        with path.open("a") as fh:
            fh.write("3,2,200,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has")
            fh.flush()
            assert seqs() == [1]
            fh.write(" fallen off the bus.\n")
        wait_for([1, 2])
    finally:
        reader.stop()
    assert kmsg.parse_xid(got[1].message) == ("0000:5d:00", 79)
    assert reader.error == ""


def test_reader_reports_an_unreadable_path(tmp_path: pathlib.Path) -> None:
    """A kernel log that cannot be opened is reported in `error`, not raised in the thread."""
    reader = kmsg.Reader(tmp_path / "missing", lambda _r: None)
    reader.start()
    reader.stop(DEADLINE_S)
    assert "cannot read" in reader.error


START = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("state_boot", "lookback_s", "expected"),
    [
        pytest.param("", 7200.0, kmsg.Replay(tail=True),
                     id="a first install or a moved-aside state file starts at the tail"),
        pytest.param("boot-1", 7200.0, kmsg.Replay(tail=False),
                     id="a restart on the boot the state knows replays it all"),
        pytest.param("boot-0", 7200.0,
                     kmsg.Replay(tail=False, not_before=START - dt.timedelta(hours=2)),
                     id="after a reboot this boot is replayed within the lookback window"),
        pytest.param("boot-0", 0.0, kmsg.Replay(tail=False),
                     id="a zero lookback replays the whole boot after a reboot"),
    ],
)  # fmt: skip
def test_replay_from_follows_nvsentinels_boot_handling(
    state_boot: str, lookback_s: float, expected: kmsg.Replay
) -> None:
    """No replay without state; all of a known boot; a bounded window after a reboot."""
    got = kmsg.replay_from(
        state_boot_id=state_boot, boot_id="boot-1", started_at=START, lookback_s=lookback_s
    )
    assert got == expected


def test_reader_at_the_tail_skips_what_was_there(tmp_path: pathlib.Path) -> None:
    """A tail reader delivers only records appended after it started (a nine-day-old Xid 119
    already in the buffer is not replayed)."""
    path = tmp_path / "kmsg"
    path.write_text("3,7,777600000000,-;NVRM: Xid (PCI:0000:9b:00): 119, Timeout after 6s\n")
    got: list[kmsg.Record] = []
    lock = threading.Lock()

    def deliver(record: kmsg.Record) -> None:
        with lock:
            got.append(record)

    reader = kmsg.Reader(path, deliver, poll_s=0.01, tail=True)
    reader.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        seq = 8
        # The thread opens the file when it gets to run: append until one record comes.
        while True:
            with lock:
                if got:
                    break
            with path.open("a") as fh:
                fh.write(f"6,{seq},777700000000,-;NVRM: loading NVIDIA UNIX x86_64 Module\n")
            seq += 1
            assert time.monotonic() < deadline, "no appended record came"
            time.sleep(0.02)
    finally:
        reader.stop()
    with lock:
        seqs = [r.seq for r in got]
    assert seqs
    assert 7 not in seqs
