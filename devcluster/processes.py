"""Start, record, check and stop the dev cluster's processes by PID.

Each process is started in its own session with its output in a log file, and recorded in a
JSON file: PID, the resolved executable and the kernel's start time of that PID. A process
is stopped only after checking that the PID still belongs to that program started at that
time, so a recycled PID is never killed. A record whose process is gone is stale and is
removed (CI may start right after every earlier process was ended).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes this interpreter started, kept so they can be reaped (no zombies, no warnings)."""


@dataclasses.dataclass(frozen=True)
class Record:
    """What we know about one process we started."""

    name: str
    pid: int
    exe: str
    start_ticks: int
    argv: tuple[str, ...]
    log: str


def _start_ticks(pid: int) -> int | None:
    """Return the process start time in clock ticks since boot, None when it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def _exe(pid: int) -> str | None:
    try:
        return str(pathlib.Path(f"/proc/{pid}/exe").readlink())
    except OSError:
        return None


def is_alive(rec: Record) -> bool:
    """True when the PID is still the very process we started (not a zombie, not recycled)."""
    child = _CHILDREN.get(rec.pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[rec.pid]
        return False
    ticks = _start_ticks(rec.pid)
    if ticks is None or ticks != rec.start_ticks:
        return False
    try:
        state = pathlib.Path(f"/proc/{rec.pid}/stat").read_text()
    except OSError:
        return False
    if state[state.rfind(")") + 2 :].split()[0] == "Z":
        return False
    exe = _exe(rec.pid)
    if exe is None:
        return True
    exe = exe.removesuffix(" (deleted)")
    # A launcher (`nsenter … kubelet`) runs as itself for the moment before it execs.
    launcher = os.path.realpath(shutil.which(rec.argv[0]) or rec.argv[0]) if rec.argv else ""
    return exe in {rec.exe, launcher}


class ProcessTable:
    """The PID records of one dev cluster, kept as one JSON file per process."""

    def __init__(self, state_dir: pathlib.Path) -> None:
        self.dir = state_dir / "pids"
        self.logs = state_dir / "logs"

    def records(self) -> list[Record]:
        """Return every record, in start order."""
        if not self.dir.exists():
            return []
        out = []
        for p in self.dir.glob("*.json"):
            try:
                data = json.loads(p.read_text())
                data["argv"] = tuple(data["argv"])
                out.append(Record(**data))
            except (OSError, ValueError, TypeError):
                p.unlink(missing_ok=True)
        return sorted(out, key=lambda r: r.start_ticks)

    def get(self, name: str) -> Record | None:
        """Return the record of one component, if any."""
        return next((r for r in self.records() if r.name == name), None)

    def clean_stale(self) -> list[str]:
        """Remove records whose process is gone; return their names."""
        stale = [r.name for r in self.records() if not is_alive(r)]
        for name in stale:
            (self.dir / f"{name}.json").unlink(missing_ok=True)
        return stale

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: pathlib.Path | None = None,
        exe: str | None = None,
    ) -> Record:
        """Start a process in its own session, log to `logs/<name>.log`, and record it.

        `exe` is the program the PID runs once started, when argv[0] execs another (such as
        `nsenter --net=… kubelet`): the record names that program, so the PID check holds."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        ticks = _start_ticks(proc.pid) or 0
        if exe is None:
            exe = os.path.realpath(argv[0]) if os.sep in argv[0] else (_exe(proc.pid) or argv[0])
        else:
            exe = os.path.realpath(exe)
        rec = Record(name, proc.pid, exe, ticks, tuple(argv), str(log))
        tmp = self.dir / f".{name}.json.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(rec)))
        tmp.replace(self.dir / f"{name}.json")
        return rec

    def stop(self, name: str, grace_s: float = 10.0) -> bool:
        """Stop one recorded process (TERM, then KILL after `grace_s`); True if it was ours."""
        rec = self.get(name)
        if rec is None:
            return False
        ours = is_alive(rec)
        if ours:
            _signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while is_alive(rec) and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_alive(rec):
                _signal_group(rec.pid, signal.SIGKILL)
                while is_alive(rec) and time.monotonic() < deadline + 5:
                    time.sleep(0.05)
        (self.dir / f"{name}.json").unlink(missing_ok=True)
        return ours

    def stop_all(self) -> list[str]:
        """Stop every recorded process in reverse start order; return the names stopped."""
        return [rec.name for rec in reversed(self.records()) if self.stop(rec.name)]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process and its session (children such as shells included)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
