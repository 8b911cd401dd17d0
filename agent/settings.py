"""The agent's settings, read from `TAUGRID_AGENT_*` environment variables."""

from __future__ import annotations

import pathlib
import re
import socket

import pydantic
import pydantic_settings

_LABEL = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
_TAKEN = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION",
     "err_code", "err_msg", "pod", "namespace", "container"}
)  # fmt: skip


class Settings(pydantic_settings.BaseSettings):
    """One settings class for the agent process; durations are seconds (`*_s`)."""

    model_config = pydantic_settings.SettingsConfigDict(
        env_prefix="TAUGRID_AGENT_", frozen=True, extra="forbid"
    )

    node_name: str = pydantic.Field(default_factory=socket.gethostname)
    """Kubernetes node name this agent reports for (the DaemonSet sets it from `spec.nodeName`);
    defaults to the hostname, which matches the node name on most clusters."""
    listen_host: str = "0.0.0.0"  # noqa: S104 - the DaemonSet's port must be reachable
    """Address the HTTP server binds; all interfaces so Prometheus and on-call can reach it."""
    port: int = pydantic.Field(default=9400, ge=0, le=65535)
    """HTTP port; 9400 is dcgm-exporter's, so existing scrape configs find us (0 = any free)."""
    agent_url: str = ""
    """URL the controller and on-call use to reach this agent (sent in heartbeats); empty means
    `http://<node_name>:<port>`."""

    controller_url: str = ""
    """Base URL of the controller (`https://taugrid-controller.taugrid:8080`); empty disables
    heartbeats, e.g. for a standalone node check."""
    heartbeat_interval_s: float = pydantic.Field(default=5.0, gt=0, le=3600)
    """Seconds between heartbeats; 5 s keeps staleness detection (3 x interval) under 20 s."""
    heartbeat_timeout_s: float = pydantic.Field(default=5.0, gt=0)
    """Seconds one heartbeat POST may take before it is retried."""
    backoff_initial_s: float = pydantic.Field(default=0.5, gt=0)
    """First retry delay after a failed heartbeat; short so a leader failover costs little."""
    backoff_max_s: float = pydantic.Field(default=30.0, gt=0)
    """Cap of the jittered exponential backoff; bounds how long a recovered controller waits."""
    token_path: pathlib.Path = pathlib.Path("/var/run/secrets/tokens/taugrid-token")
    """Projected ServiceAccount token (audience `taugrid`), re-read when the kubelet rotates it."""
    ca_path: pathlib.Path | None = None
    """CA bundle for an HTTPS controller; None uses the system trust store."""

    boot_id_path: pathlib.Path = pathlib.Path("/proc/sys/kernel/random/boot_id")
    """Where the kernel's boot id is read; a new value clears reboot-latched faults."""
    state_path: pathlib.Path = pathlib.Path("/var/lib/taugrid/agent-state.json")
    """Latched-fault state file on a hostPath, so latches survive agent restarts."""
    kmsg_path: pathlib.Path | None = pathlib.Path("/dev/kmsg")
    """Kernel log to read `NVRM: Xid` lines from (back to boot); None turns the source off."""
    pci_devices_path: pathlib.Path | None = pathlib.Path("/sys/bus/pci/devices")
    """Where the PCI functions are listed (sysfs). NVIDIA GPUs there (vendor 0x10de, class
    0x0302/0x0300) that NVML does not enumerate are reported as missing; None turns the check
    off."""
    expected_gpu_count: int = pydantic.Field(default=0, ge=0, le=64)
    """How many GPUs the node should have (the device plugin's count; 0 = not known). Fewer
    seen through NVML and the PCI bus together is a missing-GPU fault."""
    kmsg_boot_lookback_s: float = pydantic.Field(default=7200.0, ge=0)
    """After a reboot seen through the state file, replay this boot's kernel log only this far
    back (NVSentinel's bootLookbackWindow, 2 h); 0 is no limit. With no state file the agent
    starts at the tail of the kernel log."""

    gauge_interval_s: float = pydantic.Field(default=1.0, gt=0)
    """Cheap-gauge tier period (temperature, power, utilisation, clocks); 1 s like dcgm-exporter
    at its fastest, and the cost budget in DESIGN.md section 9 is measured at this tier."""
    counter_interval_s: float = pydantic.Field(default=15.0, gt=0)
    """Counter tier period (ECC, remap, PCIe replay, NVLink); 10-30 s per DESIGN.md section 5,
    counters move slowly and each batch costs more."""
    probe_timeout_s: float = pydantic.Field(default=30.0, gt=0)
    """How long one NVML probe pass (or nvmlInit) may take before the GPUs read Unknown; a sick
    GPU can hang NVML calls, and the API and heartbeats must keep answering meanwhile."""
    event_wait_ms: int = pydantic.Field(default=500, gt=0, le=10_000)
    """One NVML event-set wait, in milliseconds; bounds how long shutdown waits for the thread."""
    xid_dedupe_window_s: float = pydantic.Field(default=10.0, gt=0)
    """Seconds within which a kernel-log line and an NVML event for the same GPU and Xid are
    one Xid; kmsg timestamps are monotonic-clock estimates, so allow several seconds of slack."""
    escalation_window_s: float = pydantic.Field(default=24 * 3600.0, gt=0)
    """The same reset-class Xid twice within this many seconds asks for a reboot (24 h)."""
    debounce_s: float = pydantic.Field(default=60.0, ge=0)
    """Thermal and clock-event findings count only after persisting this long (60 s)."""
    app_xid_display_s: float = pydantic.Field(default=60.0, ge=0)
    """How long an application Xid shows as a RestartApp reason before it is only a count."""
    nvlink5_decode_window_s: float = pydantic.Field(default=300.0, gt=0)
    """How long an Xid 144-150 seen without its kernel-log line stays Degraded/Inspect-pending:
    NVIDIA decides these per subcode, which only the kernel log carries. Five minutes lets the
    kernel-log reader catch up (it reads back to boot at start) and stays well short of the
    controller's 30-minute Degraded drain, so an undecoded event never evicts work by itself;
    after it the Xid is only counted."""
    recent_events: int = pydantic.Field(default=50, ge=0, le=10_000)
    """Recent Xid events kept per GPU for `/v1/gpus`."""

    dcgm_enabled: bool = True
    """Use DCGM when `dcgmi` is installed; off turns the agent into NVML only."""
    dcgmi_path: str = "dcgmi"
    """`dcgmi` executable (looked up on PATH when not absolute)."""
    dcgm_hostengine: str = "localhost"
    """nv-hostengine address (`--host`), e.g. the GPU Operator's `nvidia-dcgm` service."""
    dcgm_health_interval_s: float = pydantic.Field(default=60.0, gt=0)
    """Seconds between `dcgmi health -c -j` reads; DCGM needs about a minute of samples."""
    dcgm_retry_initial_s: float = pydantic.Field(default=5.0, gt=0)
    """First wait before setting the health watches again after DCGM did not answer; doubles
    on each failure. Short, because a host-engine restart takes seconds."""
    dcgm_retry_max_s: float = pydantic.Field(default=300.0, gt=0)
    """Cap of that backoff: an absent DCGM is tried every five minutes for as long as the agent
    runs, so one that comes up later is found without a restart."""
    dcgm_command_timeout_s: float = pydantic.Field(default=30.0, gt=0)
    """Timeout of `dcgmi health` and discovery calls."""
    diag_timeout_level1_s: float = pydantic.Field(default=120.0, gt=0)
    """Timeout of a level-1 diagnostic (NVIDIA: seconds; 2 min leaves margin for a slow node)."""
    diag_timeout_level2_s: float = pydantic.Field(default=600.0, gt=0)
    """Timeout of a level-2 diagnostic (NVIDIA: about 2 min)."""
    diag_timeout_level3_s: float = pydantic.Field(default=2700.0, gt=0)
    """Timeout of a level-3 diagnostic (NVIDIA: about 15 min; allow three times that)."""
    diag_after_reset: bool = True
    """Run a level-1 diagnostic by itself once a reset is observed on a GPU with a latched
    ResetGPU fault, so the fault can clear without anyone asking."""
    diag_retry_after_reset_s: float = pydantic.Field(default=60.0, gt=0)
    """Seconds before that level-1 diagnostic runs again when it did not clear the reset GPU's
    fault. After a reboot of an HGX node, Fabric Manager is still training for a minute or so
    and DCGM fails the software test on every GPU with a CONFIG error; waiting and checking
    again is what clears it, not a person."""
    diag_retries_after_reset: int = pydantic.Field(default=10, ge=1, le=1000)
    """How many level-1 diagnostics run, at most, after one observed reset (the first run
    included): ten a minute apart outlast Fabric Manager's training; a fault still there
    after that stays latched until a later reset or a run someone asks for."""

    export_dcgm_families: bool = True
    """Serve the dcgm-exporter `DCGM_FI_*` families; turn off where dcgm-exporter already runs
    on the node so series are never duplicated."""
    hostname_label: bool = True
    """Add dcgm-exporter's host label (like its default; `--no-hostname` drops it)."""
    host_label: str = "Hostname"
    """The host label's name. dcgm-exporter's releases up to 4.5.3-4.8.2 say `Hostname`; its
    main branch renamed it `hostname` (#655, in no release yet), so set `hostname` to match an
    exporter built from there, and keep one spelling across a fleet."""
    pod_labels: bool = True
    """Add `pod`, `namespace` and `container` to the GPU series of allocated GPUs, as
    dcgm-exporter does with its Kubernetes mapping on (its chart's default)."""
    podresources_socket: pathlib.Path | None = pathlib.Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    """The kubelet's PodResources socket (the chart mounts its directory read-only); None turns
    attribution off. dcgm-exporter's default path."""
    podresources_client_dir: pathlib.Path = pathlib.Path("/opt/taugrid/podresources")
    """Where the generated PodResources client lives (`devcluster/podresources.py build
    --out`); the image builds it there. Absent: attribution is off, said in /v1/gpus."""
    podresources_interval_s: float = pydantic.Field(default=10.0, gt=0)
    """Seconds between PodResources reads, a tier of its own: pods come and go in seconds to
    minutes, and one List a period is cheap for the kubelet (dcgm-exporter reads per scrape)."""
    podresources_timeout_s: float = pydantic.Field(default=5.0, gt=0)
    """Timeout of one List call; a kubelet that does not answer leaves the last mapping out."""
    podresources_resources: tuple[str, ...] = ("nvidia.com/gpu",)
    """Device-plugin resources that hold NVIDIA GPUs (dcgm-exporter's `--nvidia-resource-
    names`); `nvidia.com/mig-*` resources always count."""
    dra_driver: str = "gpu.nvidia.com"
    """The DRA driver whose claimed devices are GPUs (NVIDIA's)."""
    dra_devices: dict[str, str] = pydantic.Field(default_factory=dict)
    """DRA device name (or `pool/device`) -> GPU UUID, for a driver that does not name whole
    GPUs `gpu-<NVML index>` as NVIDIA's does; JSON in the environment."""

    auth_enabled: bool = True
    """Authenticate `POST /v1/diag` and `/v1/release` with TokenReview + SubjectAccessReview;
    off only for local development."""
    auth_audience: str = ""
    """Audience the TokenReview asks for (empty: the API server's default)."""
    auth_controller_audience: str = "taugrid-agent"
    """A second audience a caller's token may carry, asked for when the token is not valid
    for `auth_audience`: the controller's own token for the on-call calls it makes here for
    its caller (the chart's controller holds one of this audience). Such a token is good
    for the agents' API alone, never for the API server. The right asked is the same
    (`auth_verb` on this node). Empty: `auth_audience` only."""
    auth_verb: str = "patch"
    """SubjectAccessReview verb on `nodes` required for the write endpoints (as quarantine), and
    for the pod names `GET /v1/gpus` shows (the on-call right)."""
    auth_metrics_verb: str = "get"
    """Verb on `nodes/metrics` a `/metrics` scrape's bearer token needs for pod labels (the right
    Prometheus already holds to scrape kubelets); an unauthenticated scrape gets none."""
    auth_rate_per_s: float = pydantic.Field(default=2.0, gt=0)
    """Reviews per second one source address may cause; past it, 429 before any TokenReview."""
    auth_burst: int = pydantic.Field(default=10, ge=1)
    """Reviews one source address may cause at once before `auth_rate_per_s` applies."""
    auth_cache_s: float = pydantic.Field(default=60.0, gt=0)
    """Seconds a review's answer (allowed or refused) is kept by token hash."""
    log_level: str = "INFO"
    """structlog level."""
    log_json: bool | None = None
    """JSON logs (None: JSON unless stderr is a terminal)."""
    shutdown_grace_s: float = pydantic.Field(default=5.0, ge=0)
    """Seconds between readiness going false and the sites stopping on SIGTERM."""
    http_idle_timeout_s: float = pydantic.Field(default=10.0, gt=0, le=3600)
    """A connection to the agent's API that has not sent a complete request head this long
    after it opened, or after its last response, is closed: a silent or trickling client
    holds no socket for long (aiohttp's default keep-alive timer is an hour; security review
    3, finding 14). A Prometheus scraping less often than this opens a new connection per
    scrape, which is cheap."""

    @pydantic.field_validator("host_label")
    @classmethod
    def _host_label_name(cls, value: str) -> str:
        if not _LABEL.fullmatch(value):
            msg = f"host_label: {value!r} is not a Prometheus label name"
            raise ValueError(msg)
        if value in _TAKEN:
            msg = f"host_label: {value!r} is already one of the GPU series' labels"
            raise ValueError(msg)
        return value

    @pydantic.field_validator("pci_devices_path", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        # An empty variable turns the check off; Path("") would read the working directory.
        return None if isinstance(value, str) and not value.strip() else value

    @pydantic.field_validator("node_name")
    @classmethod
    def _lowercase_node(cls, value: str) -> str:
        if not value:
            msg = "node_name must not be empty"
            raise ValueError(msg)
        return value.lower()

    def diag_timeout_s(self, level: int) -> float:
        """Return the timeout of a diagnostic level."""
        return {
            1: self.diag_timeout_level1_s,
            2: self.diag_timeout_level2_s,
            3: self.diag_timeout_level3_s,
        }[level]

    def effective_agent_url(self) -> str:
        """Return the URL the agent advertises."""
        return self.agent_url or f"http://{self.node_name}:{self.port}"
