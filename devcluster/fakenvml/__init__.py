"""Build and drive the fake ``libnvidia-ml.so.1`` that stands in for NVML in tests and dev.

The library (``fakenvml.c`` beside this file) is compiled on demand by :func:`build` and
loaded either in-process (:class:`InProcessControl`, which also points ``pynvml`` at it)
or by a child process through ``LD_LIBRARY_PATH`` (:func:`agent_env`), which is then
driven through a Unix socket (:class:`SocketControl`). Both controls speak the same
one-command-per-line language; ``README.md`` beside this file documents it.
"""

from __future__ import annotations

import abc
import ctypes
import hashlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Final, Literal, Protocol

SONAME: Final = "libnvidia-ml.so.1"
SOURCE: Final = pathlib.Path(__file__).with_name("fakenvml.c")
CFLAGS: Final = (
    "-O2",
    "-Wall",
    "-Wextra",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wl,-soname,libnvidia-ml.so.1",
    "-pthread",
)

ENV_SCENARIO: Final = "FAKE_NVML_SCENARIO"
ENV_SOCKET: Final = "FAKE_NVML_SOCKET"
ENV_SEED: Final = "FAKE_NVML_SEED"

# nvmlEventType* bits the fake queues on its own (see README.md).
EVENT_SINGLE_BIT_ECC: Final = 0x1
EVENT_DOUBLE_BIT_ECC: Final = 0x2
EVENT_XID_CRITICAL_ERROR: Final = 0x8
EVENT_GPU_RECOVERY_ACTION: Final = 0x8000

_REPLY_SIZE: Final = 1024

Gpu = int | Literal["*"]
"""A GPU index, or ``"*"`` for every GPU (not accepted by ``get``)."""

RemapState = Literal["pending", "failure", "clear"]


class FakeNvmlError(Exception):
    """The fake library could not be built, loaded or refused a command."""


def default_cache_dir() -> pathlib.Path:
    """Return ``$XDG_CACHE_HOME/taugrid/fakenvml`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME")
    root = pathlib.Path(base) if base else pathlib.Path.home() / ".cache"
    return root / "taugrid" / "fakenvml"


def source_digest() -> str:
    """Return the build key: 16 hex digits of sha256 over the C source and the flags."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join(CFLAGS).encode())
    return digest.hexdigest()[:16]


def build(cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Compile the fake once per source version and return the directory holding it.

    The directory is what ``LD_LIBRARY_PATH`` needs. The library is written to a
    temporary name and renamed into place, so concurrent builds never expose a
    half-written file; an existing build is reused without running gcc.
    """
    out_dir = (cache_dir if cache_dir is not None else default_cache_dir()) / source_digest()
    target = out_dir / SONAME
    if target.is_file():
        return out_dir
    gcc = shutil.which("gcc")
    if gcc is None:
        msg = "gcc not found: install gcc (Debian: apt-get install gcc)"
        raise FakeNvmlError(msg)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        proc = subprocess.run(
            [gcc, *CFLAGS, "-o", str(tmp), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            msg = f"gcc failed to build {SOURCE} (exit {proc.returncode}):\n{proc.stderr}"
            raise FakeNvmlError(msg)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir


def agent_env(
    lib_dir: pathlib.Path,
    socket_path: pathlib.Path | None,
    scenario_path: pathlib.Path | None = None,
    *,
    seed: str | None = None,
) -> dict[str, str]:
    """Return the environment additions that put a child process on the fake.

    Merge them over ``os.environ`` when starting the child. ``LD_LIBRARY_PATH`` keeps
    whatever the current process has, after the fake's directory. ``seed`` makes the
    UUIDs and serials differ between fake nodes (one seed per node name).
    """
    existing = os.environ.get("LD_LIBRARY_PATH", "")
    env = {"LD_LIBRARY_PATH": str(lib_dir) + (os.pathsep + existing if existing else "")}
    if socket_path is not None:
        env[ENV_SOCKET] = str(socket_path)
    if scenario_path is not None:
        env[ENV_SCENARIO] = str(scenario_path)
    if seed is not None:
        env[ENV_SEED] = seed
    return env


DEFAULT_GPU_NAME: Final = "NVIDIA H100 80GB HBM3"
"""What `nvmlDeviceGetName` answers for every GPU of the default scenario."""
DEFAULT_MEMORY_TOTAL: Final = 85520809984
"""Bytes of framebuffer a default GPU reports (`memory_total`)."""
_H100_BUSES: Final = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_FNV_OFFSET: Final = 14695981039346656037
_FNV_PRIME: Final = 1099511628211
_U64: Final = (1 << 64) - 1


def _fnv1a(text: str, h: int) -> int:
    for byte in text.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def default_uuid(seed: str, index: int) -> str:
    """Return the UUID the library gives GPU `index` under `seed` (`default_values` in
    fakenvml.c: FNV-1a of the seed, then of the index), so tools that stand in for a node's
    drivers (the dev cluster's DRA publisher) name the same GPUs its agent reports."""
    h = _fnv1a(str(index), _fnv1a(seed, _FNV_OFFSET))
    h2 = _fnv1a("taugrid", h)
    return (
        f"GPU-{h >> 32:08x}-{(h >> 16) & 0xFFFF:04x}-4{h & 0xFFF:03x}-"
        f"8{(h2 >> 52) & 0xFFF:03x}-{h2 & 0xFFFFFFFFFFFF:012x}"
    )


def default_bus_id(index: int) -> str:
    """Return the PCI bus ID the library gives GPU `index` (an HGX H100 board's buses)."""
    return f"{index // 8:08X}:{_H100_BUSES[index % 8]:02X}:00.0"


def render_scenario(
    *,
    gpus: int = 8,
    seed: str | None = None,
    values: Mapping[Gpu, Mapping[str, int | str]] | None = None,
    return_codes: Sequence[tuple[str, Gpu, int]] = (),
    commands: Sequence[str] = (),
) -> str:
    """Render a scenario file: GPU count, per-GPU values, return-code overrides, commands."""
    lines = [f"gpus {gpus}"]
    if seed is not None:
        lines.append(f"seed {seed}")
    for gpu, pairs in (values or {}).items():
        lines.extend(f"set {gpu} {key} {value}" for key, value in pairs.items())
    lines.extend(f"rc {function} {gpu} {rc}" for function, gpu, rc in return_codes)
    lines.extend(commands)
    return "\n".join(lines) + "\n"


class Control(Protocol):
    """A way to change the fake's state; every method maps to one command line."""

    def send(self, command: str) -> None:
        """Run one command; raise :class:`FakeNvmlError` when the fake refuses it."""

    def query(self, command: str) -> str:
        """Run one command and return the value it answers (empty for plain commands)."""

    def get(self, gpu: int, key: str) -> str:
        """Read one state value of one GPU."""

    def reset_count(self, gpu: int) -> int:
        """Return how many times ``reset`` ran on this GPU since load or ``clear``."""

    def xid(self, gpu: Gpu, code: int) -> None:
        """Queue an XidCriticalError event with this Xid."""

    def event(self, gpu: Gpu, event_type: int, data: int) -> None:
        """Queue any event type with any data."""

    def lost(self, gpu: Gpu) -> None:
        """Make the GPU fall off the bus (GPU_IS_LOST) and queue Xid 79."""

    def reset(self, gpu: Gpu) -> None:
        """Reset the GPU as ``nvidia-smi -r`` would."""

    def reset_required(self, gpu: Gpu) -> None:
        """Mark the GPU as needing a reset (field 230 reads GPU_RESET) until a reset."""

    def ecc_uncorrected(self, gpu: Gpu, count: int) -> None:
        """Add uncorrected ECC errors and queue a DoubleBitEccError event."""

    def ecc_corrected(self, gpu: Gpu, count: int) -> None:
        """Add corrected ECC errors and queue a SingleBitEccError event."""

    def thermal(self, gpu: Gpu, on: bool = True) -> None:
        """Start or stop hardware thermal slowdown."""

    def nvlink_down(self, gpu: Gpu, link: int) -> None:
        """Take one NVLink down."""

    def nvlink_up(self, gpu: Gpu, link: int) -> None:
        """Bring one NVLink up."""

    def remap(self, gpu: Gpu, state: RemapState) -> None:
        """Flag a pending row remap, a remap failure, or clear both."""

    def set_value(self, gpu: Gpu, key: str, value: int | str) -> None:
        """Set one state value."""

    def set_rc(self, function: str, gpu: Gpu, rc: int, after: int = 0) -> None:
        """Force a return code for one NVML function on a GPU (rc 0 removes it)."""

    def recovery_action(self, gpu: Gpu, value: int) -> None:
        """Set the GPU recovery action (field 230) and queue a GpuRecoveryAction event."""

    def clear(self, gpu: Gpu) -> None:
        """Put the GPU back to its scenario state."""

    def reset_all(self) -> None:
        """Reload the scenario: every GPU, override and queue back to its start."""

    def driver_branch(self, branch: int) -> None:
        """Pretend to be a driver of that branch."""


class ControlBase(abc.ABC):
    """The convenience commands, written once over :meth:`query`."""

    @abc.abstractmethod
    def query(self, command: str) -> str:
        """Run one command and return the value it answers (empty for plain commands)."""

    def send(self, command: str) -> None:
        """Run one command; raise :class:`FakeNvmlError` when the fake refuses it."""
        self.query(command)

    def get(self, gpu: int, key: str) -> str:
        """Read one state value of one GPU."""
        return self.query(f"get {gpu} {key}")

    def reset_count(self, gpu: int) -> int:
        """Return how many times ``reset`` ran on this GPU since load or ``clear``."""
        return int(self.get(gpu, "reset_count"))

    def xid(self, gpu: Gpu, code: int) -> None:
        """Queue an XidCriticalError event with this Xid."""
        self.send(f"xid {gpu} {code}")

    def event(self, gpu: Gpu, event_type: int, data: int) -> None:
        """Queue any event type with any data."""
        self.send(f"event {gpu} {event_type} {data}")

    def lost(self, gpu: Gpu) -> None:
        """Make the GPU fall off the bus (GPU_IS_LOST) and queue Xid 79."""
        self.send(f"lost {gpu}")

    def reset(self, gpu: Gpu) -> None:
        """Reset the GPU as ``nvidia-smi -r`` would."""
        self.send(f"reset {gpu}")

    def reset_required(self, gpu: Gpu) -> None:
        """Mark the GPU as needing a reset (field 230 reads GPU_RESET) until a reset."""
        self.send(f"reset_required {gpu}")

    def ecc_uncorrected(self, gpu: Gpu, count: int) -> None:
        """Add uncorrected ECC errors and queue a DoubleBitEccError event."""
        self.send(f"ecc_uncorrected {gpu} {count}")

    def ecc_corrected(self, gpu: Gpu, count: int) -> None:
        """Add corrected ECC errors and queue a SingleBitEccError event."""
        self.send(f"ecc_corrected {gpu} {count}")

    def thermal(self, gpu: Gpu, on: bool = True) -> None:
        """Start or stop hardware thermal slowdown."""
        self.send(f"thermal {gpu} {'on' if on else 'off'}")

    def nvlink_down(self, gpu: Gpu, link: int) -> None:
        """Take one NVLink down."""
        self.send(f"nvlink_down {gpu} {link}")

    def nvlink_up(self, gpu: Gpu, link: int) -> None:
        """Bring one NVLink up."""
        self.send(f"nvlink_up {gpu} {link}")

    def remap(self, gpu: Gpu, state: RemapState) -> None:
        """Flag a pending row remap, a remap failure, or clear both."""
        self.send(f"remap {gpu} {state}")

    def set_value(self, gpu: Gpu, key: str, value: int | str) -> None:
        """Set one state value."""
        self.send(f"set {gpu} {key} {value}")

    def set_rc(self, function: str, gpu: Gpu, rc: int, after: int = 0) -> None:
        """Force a return code for one NVML function on a GPU (rc 0 removes it)."""
        self.send(f"rc {function} {gpu} {rc}" + (f" after {after}" if after else ""))

    def recovery_action(self, gpu: Gpu, value: int) -> None:
        """Set the GPU recovery action (field 230) and queue a GpuRecoveryAction event."""
        self.send(f"recovery_action {gpu} {value}")

    def clear(self, gpu: Gpu) -> None:
        """Put the GPU back to its scenario state."""
        self.send(f"clear {gpu}")

    def reset_all(self) -> None:
        """Reload the scenario: every GPU, override and queue back to its start."""
        self.send("reset_all")

    def driver_branch(self, branch: int) -> None:
        """Pretend to be a driver of that branch (`550`: no R565 event types, no field 230)."""
        self.send(f"driver_branch {branch}")


def _one_line(command: str) -> bytes:
    if "\n" in command or "\r" in command:
        msg = f"one command per call, got a line break in {command!r}"
        raise FakeNvmlError(msg)
    return command.encode()


class InProcessControl(ControlBase):
    """Load the fake into this process, point ``pynvml`` at it and drive it by ctypes.

    ``pynvml`` keeps one global library handle, so use one instance per test module.
    The process shares one fake: loading the same directory twice gives the same state.
    """

    def __init__(self, lib_dir: pathlib.Path, scenario_path: pathlib.Path | None = None) -> None:
        """Load ``lib_dir/libnvidia-ml.so.1``; with ``scenario_path``, start from that file."""
        import pynvml  # noqa: PLC0415  (only the in-process control needs it)

        path = lib_dir / SONAME
        self.path = path
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as err:
            msg = f"cannot load the fake NVML library {path}: {err}"
            raise FakeNvmlError(msg) from err
        self._lib.fake_nvml_command.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        self._lib.fake_nvml_command.restype = ctypes.c_int
        self._lib.fake_nvml_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        self._lib.fake_nvml_load.restype = ctypes.c_int
        self._lib.fake_nvml_waiters.argtypes = []
        self._lib.fake_nvml_waiters.restype = ctypes.c_uint
        self._lib.fake_nvml_layout.argtypes = [ctypes.c_char_p]
        self._lib.fake_nvml_layout.restype = ctypes.c_long
        pynvml.nvmlLib = self._lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        if scenario_path is not None:
            self.load(scenario_path)

    def load(self, scenario_path: pathlib.Path | None) -> None:
        """Replace all state from a scenario file (``None``: the built-in defaults)."""
        error = ctypes.create_string_buffer(_REPLY_SIZE)
        arg = str(scenario_path).encode() if scenario_path is not None else b""
        if self._lib.fake_nvml_load(arg, error, _REPLY_SIZE) != 0:
            raise FakeNvmlError(error.value.decode(errors="replace"))

    def query(self, command: str) -> str:
        """Run one command and return the value it answers (empty for plain commands)."""
        reply = ctypes.create_string_buffer(_REPLY_SIZE)
        rc = self._lib.fake_nvml_command(_one_line(command), reply, _REPLY_SIZE)
        text = reply.value.decode(errors="replace")
        if rc < 0:
            msg = f"{command!r}: {text}"
            raise FakeNvmlError(msg)
        return text

    def waiters(self) -> int:
        """Return how many threads are blocked in ``nvmlEventSetWait*`` right now."""
        return int(self._lib.fake_nvml_waiters())

    def layout(self, name: str) -> int:
        """Return the C ``sizeof(name)`` or ``offsetof`` for ``"struct.member"``; -1 if unknown."""
        return int(self._lib.fake_nvml_layout(name.encode()))


class SocketControl(ControlBase):
    """Drive a fake loaded by another process through its ``FAKE_NVML_SOCKET``.

    The socket appears when that process first calls ``nvmlInit``; each command waits up
    to ``timeout_s`` for it, so a control made right after starting the child works.
    """

    def __init__(self, socket_path: pathlib.Path, timeout_s: float = 10.0) -> None:
        """Remember the socket; nothing connects until the first command."""
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError) as err:
                sock.close()
                if time.monotonic() >= deadline:
                    msg = (
                        f"fake NVML socket {self.socket_path} did not answer within "
                        f"{self.timeout_s} s: {err}"
                    )
                    raise FakeNvmlError(msg) from err
                time.sleep(0.05)  # retry cadence while the child starts, not a wait for an outcome
            else:
                return sock

    def query(self, command: str) -> str:
        """Run one command and return the value it answers (empty for plain commands)."""
        line = _one_line(command) + b"\n"
        with self._connect() as sock:
            try:
                sock.sendall(line)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError as err:
                msg = f"fake NVML socket {self.socket_path}: {command!r}: {err}"
                raise FakeNvmlError(msg) from err
        reply = data.decode(errors="replace").rstrip("\n")
        if reply == "ok":
            return ""
        if reply.startswith("ok "):
            return reply[3:]
        if reply.startswith("error "):
            msg = f"{command!r}: {reply[6:]}"
            raise FakeNvmlError(msg)
        msg = f"fake NVML socket {self.socket_path}: unexpected reply {reply!r} to {command!r}"
        raise FakeNvmlError(msg)
