"""The probe loop: the I/O shell around the verdict core.

It owns NVML (`agent.probing.nvml`), the event thread, the kernel-log reader, DCGM and the
state file. Each pass reads the due tiers, folds new Xids and DCGM results into the node state
with `verdicts.evaluate_node`, writes the state file when it changed and publishes an immutable
`snapshots.View` that metrics, `/v1/gpus` and heartbeats read; nothing reads NVML at scrape time.
A new event wakes the loop at once, so an Xid reaches the verdict without waiting for the next
tick.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import structlog

from agent import (
    attribution,
    dcgmwatch,
    dedupe,
    latching,
    readings,
    settings,
    snapshots,
    statefile,
    verdicts,
)
from agent.probing import dcgm, kmsg, nvml, pci, podresources
from shared import health

log = structlog.get_logger("agent.monitoring")

_REGISTRATION_RETRY_S = 30.0
"""How often NVML event registration is retried for a GPU that answers but refused it."""

_COUNTER_TRIGGERS = {48, 63, 64, 92, 94, 95, 154}
"""Xids after which the counters (ECC, remap, recovery action) are read at once."""


def utcnow() -> dt.datetime:
    """Return the current UTC time (the one clock read of the shell)."""
    return dt.datetime.now(dt.UTC)


def read_boot_id(path: Any) -> str:
    """Read the kernel boot id."""
    return str(path.read_text()).strip()


class Monitor:
    """Run the probe tiers and keep the `snapshots.View` current."""

    def __init__(
        self,
        config: settings.Settings,
        *,
        clock: Callable[[], dt.datetime] = utcnow,
        dcgm_client: dcgm.Dcgm | None = None,
    ) -> None:
        self._settings = config
        self._clock = clock
        self._probe = nvml.Probe()
        self._dcgm = dcgm_client or dcgm.Dcgm(
            config.dcgmi_path,
            config.dcgm_hostengine,
            command_timeout_s=config.dcgm_command_timeout_s,
            diag_timeout_s=config.diag_timeout_s,
            clock=clock,
        )
        self._watch = dcgmwatch.WatchState()
        self._timing = dcgmwatch.Timing(
            check_interval_s=config.dcgm_health_interval_s,
            retry_initial_s=config.dcgm_retry_initial_s,
            retry_max_s=config.dcgm_retry_max_s,
        )
        self._pods = attribution.Attribution()
        self._pods_status = readings.AttributionStatus(False, "not started")
        self._pod_client: podresources.Client | None = None
        self._mig_parents: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._pending: collections.deque[nvml.NvmlEvent | kmsg.Record] = collections.deque()
        self._recent: list[dedupe.Seen] = []
        self._recent_events: dict[int, collections.deque[readings.XidEvent]] = {}
        self._last_xid: dict[int, int] = {}
        self._counter_cache: dict[int, tuple[dict[str, Any], dt.datetime]] = {}
        self._counters_due_at = 0.0
        self._force_counters = False
        self._watcher: nvml.EventWatcher | None = None
        self._kmsg: kmsg.Reader | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._state = latching.NodeState()
        self._last_diag: readings.DiagResult | None = None
        self._last_health: readings.HealthCheck | None = None
        self._boot_time = kmsg.boot_time_now()
        self._listeners: list[Callable[[snapshots.View], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nvml_retry_at = 0.0
        self._kmsg_seq: int | None = None
        self._kmsg_replay = kmsg.Replay(tail=False)
        self._sxids: list[readings.SxidEvent] = []
        self._state_problem = ""
        self._state_write_error = ""
        self._registration_retry_at = 0.0
        self._reset_waiting: dt.datetime | None = None
        self._pci_gpus: tuple[str, ...] | None = None
        self._diag_runs_since_reset = 0
        self._start_future: asyncio.Future[None] | None = None
        self._hung_pass: asyncio.Future[tuple[list[readings.GpuSnapshot], float]] | None = None
        boot_id = read_boot_id(config.boot_id_path)
        self.view = snapshots.View(node_name=config.node_name, boot_id=boot_id)
        self.passes = 0

    def subscribe(self, listener: Callable[[snapshots.View], None]) -> None:
        """Call `listener(view)` from the event loop whenever a verdict or action changes."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, *, loops: bool = True) -> None:
        """Load the state file, start NVML, the event thread, kmsg and DCGM, then the loops.

        `loops=False` leaves the passes to the caller (`probe_once`), for tests that step.
        """
        self._loop = asyncio.get_running_loop()
        loaded = statefile.load(self._settings.state_path)
        if loaded.problem:
            log.error(
                "state_file_invalid_starting_clean",
                problem=loaded.problem,
                moved_to=str(loaded.moved_to) if loaded.moved_to else None,
            )
        self._state_problem = loaded.problem
        self._state = loaded.state
        self._kmsg_replay = kmsg.replay_from(
            state_boot_id=loaded.state.boot_id,
            boot_id=self.view.boot_id,
            started_at=self._clock(),
            lookback_s=self._settings.kmsg_boot_lookback_s,
        )
        await self._start_nvml()
        if self._dcgm_usable:
            await self.dcgm_step()
        self._set_view()
        if not loops:
            return
        self._tasks.append(asyncio.create_task(self._run(), name="probe-loop"))
        if self._dcgm_usable:
            self._tasks.append(asyncio.create_task(self._health_loop(), name="dcgm-health"))
        if self._settings.pod_labels and self._settings.podresources_socket is not None:
            self._tasks.append(asyncio.create_task(self._pods_loop(), name="pod-attribution"))
        else:
            self._pods_status = readings.AttributionStatus(False, "off by setting")
            self._set_view()

    async def _start_nvml(self) -> None:
        if self._start_future is None:
            self._start_future = asyncio.ensure_future(asyncio.to_thread(self._probe.start))
        future = self._start_future
        try:
            async with asyncio.timeout(self._settings.probe_timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            # A wedged driver can hang nvmlInit; serve and report instead of never starting.
            detail = (
                f"NVML initialisation did not answer within {self._settings.probe_timeout_s:g} s"
            )
            self.view = dataclasses.replace(self.view, nvml_available=False, nvml_detail=detail)
            log.error("nvml_start_hung", timeout_s=self._settings.probe_timeout_s)
            self._nvml_retry_at = time.monotonic() + 5.0
            return
        except nvml.NvmlUnavailableError as err:
            self._start_future = None
            self.view = dataclasses.replace(self.view, nvml_available=False, nvml_detail=str(err))
            log.error("nvml_unavailable", error=str(err))
            self._nvml_retry_at = time.monotonic() + 30.0
            return
        self._start_future = None
        self.view = dataclasses.replace(
            self.view,
            nvml_available=True,
            nvml_detail=self._nvml_ok_detail(),
            driver_version=self._probe.driver_version,
        )
        self._watcher = nvml.EventWatcher(
            self._probe.devices,
            self._deliver,
            wait_ms=self._settings.event_wait_ms,
            clock=self._clock,
        )
        self._watcher.start()
        if self._settings.kmsg_path is not None and self._kmsg is None:
            self._kmsg = kmsg.Reader(
                self._settings.kmsg_path, self._deliver, tail=self._kmsg_replay.tail
            )
            self._kmsg.start()
        log.info("nvml_started", gpus=len(self._probe.devices), driver=self._probe.driver_version)

    async def stop(self) -> None:
        """Cancel the loops, stop the threads, write the state and release NVML."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._pod_client is not None:
            await self._pod_client.close()
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
        if self._kmsg is not None:
            self._kmsg.stop(0.5)
        await self._save(self._state)
        stuck = [f for f in (self._hung_pass, self._start_future) if f is not None and not f.done()]
        if stuck:
            # nvmlShutdown would wait behind the hung call; the process exit releases NVML.
            log.warning("nvml_shutdown_skipped", reason="an NVML call is still hung")
            return
        await asyncio.to_thread(self._probe.shutdown)

    async def _save(self, state: latching.NodeState) -> None:
        """Write the state file; a failure is logged and shown, never fatal to the probe loop.

        A read-only or full hostPath must not stop verdicts from reaching the controller; the
        latches then live in memory only, which `/v1/gpus` says.
        """
        try:
            await asyncio.to_thread(statefile.save, self._settings.state_path, state)
        except OSError as err:
            detail = f"cannot write {self._settings.state_path}: {err.strerror or err}"
            if detail != self._state_write_error:
                log.error("state_file_write_failed", error=detail)
            self._state_write_error = detail
            return
        if self._state_write_error:
            log.info("state_file_written_again", path=str(self._settings.state_path))
        self._state_write_error = ""

    def _deliver(self, item: nvml.NvmlEvent | kmsg.Record) -> None:
        """Hand an event from a thread to the loop (thread-safe)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._enqueue, item)

    def _enqueue(self, item: nvml.NvmlEvent | kmsg.Record) -> None:
        self._pending.append(item)
        self._wake.set()

    # ------------------------------------------------------------------ loops
    async def _run(self) -> None:
        interval = self._settings.gauge_interval_s
        while True:
            try:
                await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("probe_pass_failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()

    @property
    def _dcgm_usable(self) -> bool:
        return self._settings.dcgm_enabled and self._dcgm.installed

    async def _health_loop(self) -> None:
        while True:
            now = self._clock()
            due = dcgmwatch.plan(self._watch, now).at
            wait = (due - now).total_seconds()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.dcgm_step()

    async def dcgm_step(self) -> dcgmwatch.Step:
        """Make the one dcgmi call the supervisor asks for, and fold its outcome."""
        step = dcgmwatch.plan(self._watch, self._clock()).step
        before = self._watch
        if step is dcgmwatch.Step.ARM:
            ok, detail = await self._dcgm.arm()
            self._watch = dcgmwatch.after_arm(
                self._watch, ok=ok, detail=detail, now=self._clock(), timing=self._timing
            )
        else:
            try:
                check = await self._dcgm.health()
            except dcgm.DcgmError as err:
                self._last_health = None
                self._watch = dcgmwatch.after_check(
                    self._watch, ok=False, detail=str(err), now=self._clock(), timing=self._timing
                )
            else:
                self._last_health = check
                self._watch = dcgmwatch.after_check(
                    self._watch, ok=True, detail="", now=self._clock(), timing=self._timing
                )
        if (before.available, before.armed) != (self._watch.available, self._watch.armed):
            log.info(
                "dcgm",
                step=str(step),
                available=self._watch.available,
                armed=self._watch.armed,
                detail=self._watch.detail,
            )
        self.view = dataclasses.replace(self.view, dcgm_status=self._dcgm_status())
        return step

    def _dcgm_status(self) -> readings.DcgmStatus:
        host = self._dcgm.hostengine
        if not self._settings.dcgm_enabled:
            return readings.DcgmStatus(False, "disabled by setting", host)
        if not self._dcgm.installed:
            return readings.DcgmStatus(False, self._dcgm.missing, host)
        w = self._watch
        return readings.DcgmStatus(
            available=w.available,
            detail=w.detail,
            hostengine=host,
            failures=w.failures,
            retry_at=None if w.available else w.next_at,
            rearmed=w.rearmed,
            last_check_at=w.last_check_at,
        )

    async def _pods_loop(self) -> None:
        while True:
            await self.refresh_pods()
            await asyncio.sleep(self._settings.podresources_interval_s)

    async def refresh_pods(self) -> readings.AttributionStatus:
        """Read the kubelet's PodResources once and map allocations to this node's GPUs.

        Off, with the reason, when the generated client or the socket is missing or the kubelet
        does not answer: the GPU series then carry no pod labels, as with dcgm-exporter.
        """
        cfg = self._settings
        socket = cfg.podresources_socket
        if socket is None or not cfg.pod_labels:
            return self._pods_off("off by setting", "")
        if self._pod_client is None:
            try:
                self._pod_client = podresources.Client(
                    cfg.podresources_client_dir, socket, timeout_s=cfg.podresources_timeout_s
                )
            except podresources.PodResourcesError as err:
                return self._pods_off(f"off: {err}", str(socket))
        if not socket.exists():
            return self._pods_off(f"off: the kubelet socket {socket} does not exist", str(socket))
        try:
            devices, claims = await self._pod_client.list()
        except podresources.PodResourcesError as err:
            return self._pods_off(f"off: {err}", str(socket))
        missing = attribution.mig_ids(devices, cfg.podresources_resources) - set(self._mig_parents)
        for mig in sorted(missing):
            parent = await asyncio.to_thread(self._probe.mig_parent, mig)
            if parent is not None:
                self._mig_parents[mig] = parent
        self._pods = attribution.attribute(
            devices,
            claims,
            [attribution.Gpu(d.index, d.uuid) for d in self._probe.devices],
            resources=cfg.podresources_resources,
            dra_driver=cfg.dra_driver,
            dra_table=cfg.dra_devices,
            mig_parents=self._mig_parents,
        )
        self._pods_status = readings.AttributionStatus(
            True,
            f"{len(self._pods.pods)} of {len(self._probe.devices)} GPUs allocated to pods",
            str(socket),
            self._clock(),
            {k: str(v) for k, v in self._pod_client.source.items()},
        )
        self.view = dataclasses.replace(
            self.view, pods=self._pods, attribution_status=self._pods_status
        )
        return self._pods_status

    def _pods_off(self, detail: str, socket: str) -> readings.AttributionStatus:
        if detail != self._pods_status.detail:
            log.info("pod_attribution", enabled=False, detail=detail)
        client = self._pod_client.source if self._pod_client is not None else {}
        self._pods = attribution.Attribution()
        self._pods_status = readings.AttributionStatus(
            False, detail, socket, self._clock(), {k: str(v) for k, v in client.items()}
        )
        self.view = dataclasses.replace(
            self.view, pods=self._pods, attribution_status=self._pods_status
        )
        return self._pods_status

    def _take_events(self) -> list[readings.XidEvent]:
        by_pci = {
            key: d.index
            for d in self._probe.devices
            if (key := kmsg.pci_key(d.pci_bus_id)) is not None
        }
        events: list[readings.XidEvent] = []
        while self._pending:
            item = self._pending.popleft()
            if isinstance(item, kmsg.Record):
                if self._state.kmsg_seq is not None and item.seq <= self._state.kmsg_seq:
                    continue
                self._kmsg_seq = max(item.seq, self._kmsg_seq or 0)
                event = kmsg.to_event(item, gpus_by_pci=by_pci, boot_time=self._boot_time)
                not_before = self._kmsg_replay.not_before
                sxid = kmsg.to_sxid(item, boot_time=self._boot_time)
                if sxid is not None and (not_before is None or sxid.at >= not_before):
                    self._sxids.append(sxid)
                if event is not None and not_before is not None and event.at < not_before:
                    continue
                if event is not None:
                    events.append(event)
                continue
            if item.error is not None or item.event_type & nvml.EVENTS_NEEDING_COUNTERS:
                self._force_counters = True
            if item.error is not None:
                log.warning("nvml_event_error", gpu_index=item.gpu_index, error=item.detail)
            if item.event_type & nvml.EVENT_XID:
                events.append(
                    readings.XidEvent(
                        xid=item.data,
                        at=item.at,
                        source=readings.XidSource.NVML,
                        gpu_index=item.gpu_index,
                    )
                )
        return events

    def _probe_pass(
        self, now: dt.datetime, counters_due: bool
    ) -> tuple[list[readings.GpuSnapshot], float]:
        started = time.perf_counter()
        if counters_due and self._probe.enumeration_errors:
            found = self._probe.rediscover()
            if found:
                log.info("gpus_enumerated_again", gpu_indexes=[d.index for d in found])
                if self._watcher is not None:
                    self._watcher.add_devices(found)
        snapshots: list[readings.GpuSnapshot] = []
        for device in self._probe.devices:
            cached = None if counters_due else self._counter_cache.get(device.index)
            snap, counters = self._probe.snapshot(
                device,
                now,
                counters=cached[0] if cached else None,
                counters_at=cached[1] if cached else None,
            )
            if counters is None:
                self._counter_cache.pop(device.index, None)
            elif cached is None:
                self._counter_cache[device.index] = (counters, now)
            snapshots.append(snap)
        return snapshots, time.perf_counter() - started

    async def probe_once(self) -> snapshots.View:
        """Run one pass: read the due tiers, fold events and DCGM results, publish the view."""
        if not self.view.nvml_available and time.monotonic() >= self._nvml_retry_at:
            await self._start_nvml()
        now = self._clock()
        events = self._take_events()
        if any(e.xid in _COUNTER_TRIGGERS for e in events):
            self._force_counters = True
        counters_due = self._force_counters or time.monotonic() >= self._counters_due_at
        snapshots: list[readings.GpuSnapshot] = []
        seconds = dict(self.view.probe_seconds)
        if self.view.nvml_available:
            passed = await self._bounded_pass(now, counters_due)
            if passed is not None:
                snapshots, took = passed
                seconds["counters" if counters_due else "gauges"] = took
                if counters_due:
                    self._force_counters = False
                    self._counters_due_at = time.monotonic() + self._settings.counter_interval_s
        nvml_ok = self.view.nvml_available and self._hung_pass is None
        if self._settings.pci_devices_path is not None and (counters_due or self._pci_gpus is None):
            self._pci_gpus = await asyncio.to_thread(
                pci.nvidia_gpus, self._settings.pci_devices_path
            )
        missing = verdicts.missing_gpus(
            [(d.index, d.pci_bus_id) for d in self._probe.devices],
            {
                index: (
                    self._probe.enumeration_kinds.get(index, readings.NvmlErrorKind.UNKNOWN),
                    error,
                )
                for index, error in self._probe.enumeration_errors.items()
            },
            self._pci_gpus or (),
            expected=self._settings.expected_gpu_count,
            unavailable="" if nvml_ok else self.view.nvml_detail,
        )
        deduped = dedupe.dedupe(
            self._recent, events, window_s=self._settings.xid_dedupe_window_s, now=now
        )
        fresh, self._recent = deduped.fresh, deduped.recent
        for event in fresh:
            if event.gpu_index is not None:
                queue = self._recent_events.setdefault(
                    event.gpu_index, collections.deque(maxlen=self._settings.recent_events)
                )
                queue.append(event)
                self._last_xid[event.gpu_index] = event.xid
            log.info(
                "xid",
                gpu_index=event.gpu_index,
                xid=event.xid,
                source=str(event.source),
                pci_bus_id=event.pci_bus_id,
            )
        before = {v.uuid: v for v in self.view.verdicts}
        policy = self.policy()
        state, gpu_verdicts = verdicts.evaluate_node(
            self._state,
            verdicts.Inputs(
                boot_id=self.view.boot_id,
                snapshots=snapshots,
                xids=fresh,
                diag=self._last_diag,
                health_check=self._last_health,
                nvml_available=nvml_ok,
                nvml_detail="" if nvml_ok else self.view.nvml_detail,
                missing=missing,
                kmsg_seq=self._kmsg_seq,
                twins=deduped.twins,
                driver_version=self.view.driver_version,
                sxids=tuple(self._sxids),
            ),
            policy,
            now,
        )
        self._maybe_retry_registration(snapshots)
        self._sxids.clear()
        if state != self._state:
            self._state = state
            await self._save(state)
        self.passes += 1
        self._set_view(
            taken_at=now, snapshots=tuple(snapshots), verdicts=gpu_verdicts, probe_seconds=seconds
        )
        if verdicts.changed(before, gpu_verdicts) or not before:
            for v in gpu_verdicts:
                if before.get(v.uuid) is None or (
                    before[v.uuid].verdict,
                    before[v.uuid].action,
                ) != (
                    v.verdict,
                    v.action,
                ):
                    log.info(
                        "verdict",
                        gpu_uuid=v.uuid,
                        gpu_index=v.index,
                        verdict=str(v.verdict),
                        action=str(v.action),
                        reason=",".join(r.code for r in v.reasons),
                    )
            for listener in self._listeners:
                listener(self.view)
        self._maybe_diag_after_reset()
        return self.view

    async def _bounded_pass(
        self, now: dt.datetime, counters_due: bool
    ) -> tuple[list[readings.GpuSnapshot], float] | None:
        """Run the NVML pass in a thread for at most `probe_timeout_s`; None while it hangs.

        A hung NVML call cannot be cancelled: its thread is left to finish, no second pass is
        started meanwhile (threads would pile up), and the GPUs read Unknown until it returns,
        so heartbeats stop presenting the last good pass as current.
        """
        if self._hung_pass is not None:
            if not self._hung_pass.done():
                return None
            with contextlib.suppress(Exception):
                self._hung_pass.result()
            self._hung_pass = None
            self.view = dataclasses.replace(self.view, nvml_detail=self._nvml_ok_detail())
            log.info("nvml_answers_again")
        future = asyncio.ensure_future(asyncio.to_thread(self._probe_pass, now, counters_due))
        try:
            async with asyncio.timeout(self._settings.probe_timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            self._hung_pass = future
            detail = (
                f"an NVML probe pass did not answer within {self._settings.probe_timeout_s:g} s"
                f" (stuck since {now.isoformat()}); GPUs are Unknown until it returns"
            )
            self.view = dataclasses.replace(self.view, nvml_detail=detail)
            log.error("nvml_probe_hung", timeout_s=self._settings.probe_timeout_s)
            return None

    def _nvml_calls(self) -> dict[str, str]:
        calls: dict[str, str] = {}
        if self._probe.memory_version is not None:
            calls["memoryInfo"] = f"v{self._probe.memory_version}"
        if self._probe.clock_reasons_call:
            calls["clockReasons"] = self._probe.clock_reasons_call
        if self._watcher is not None and self._watcher.registered:
            masks = {f"0x{m:x}" for m in self._watcher.registered.values()}
            calls["eventTypes"] = ",".join(sorted(masks))
        return calls

    def _nvml_ok_detail(self) -> str:
        return f"{len(self._probe.devices)} GPUs"

    def _maybe_retry_registration(self, snapshots: list[readings.GpuSnapshot]) -> None:
        """Register events again for GPUs whose registration failed and that answer now.

        At once when such a GPU has just come back (lost or reset-required before, or newly
        enumerated), otherwise at most every `_REGISTRATION_RETRY_S`, so a GPU that refuses
        registration but answers readings does not retry (and log) every pass.
        """
        if self._watcher is None:
            return
        unregistered = self._watcher.missing()
        answering = {s.index for s in snapshots if s.nvml_error is None} & unregistered
        if not answering:
            return
        before = {s.index: s.nvml_error for s in self.view.snapshots}
        came_back = any(i not in before or before[i] is not None for i in answering)
        if came_back or time.monotonic() >= self._registration_retry_at:
            self._registration_retry_at = time.monotonic() + _REGISTRATION_RETRY_S
            self._watcher.retry_registration()

    def policy(self) -> verdicts.Policy:
        """Build the fault-table policy from the settings and DCGM's availability."""
        return verdicts.Policy(
            escalation_window_s=self._settings.escalation_window_s,
            debounce_s=self._settings.debounce_s,
            app_xid_display_s=self._settings.app_xid_display_s,
            dcgm_present=self.view.dcgm_status.available,
            nvlink5_decode_window_s=self._settings.nvlink5_decode_window_s,
        )

    def _set_view(self, **changes: Any) -> None:
        self.view = dataclasses.replace(
            self.view,
            state=self._state,
            recent_events={i: tuple(q) for i, q in self._recent_events.items()},
            last_xid=dict(self._last_xid),
            last_diag=self._last_diag,
            last_health=self._last_health,
            dcgm_status=self._dcgm_status(),
            diag_running=self._dcgm.running_level,
            probe_errors=dict(self._probe.errors),
            kmsg_detail=self._kmsg.error if self._kmsg else "",
            events_registered=len(self._watcher.registered) if self._watcher else 0,
            nvml_calls=self._nvml_calls(),
            pods=self._pods,
            attribution_status=self._pods_status,
            enumeration_errors=dict(self._probe.enumeration_errors),
            state_detail="; ".join(d for d in (self._state_problem, self._state_write_error) if d),
            **changes,
        )

    # ------------------------------------------------------------------ actions
    def idle_or_unhealthy(self) -> bool:
        """Say whether a long diagnostic may run: no GPU busy, or the node is already unhealthy.

        An unhealthy verdict is what gets the node quarantined by the controller, so it stands
        in for "quarantined" without the agent needing the Node object.
        """
        if any(
            v.verdict in (health.Verdict.FAILED, health.Verdict.DEGRADED)
            for v in self.view.verdicts
        ):
            return True
        return all(
            (s.utilization_gpu_pct or 0) == 0 and (s.fb_used_mib or 0) < 1024
            for s in self.view.snapshots
        )

    @property
    def diag_running(self) -> bool:
        """Say whether a diagnostic runs now (asked or automatic), without waiting for a pass."""
        return self._dcgm.diag_running

    async def run_diag(self, level: int) -> readings.DiagResult:
        """Run a DCGM diagnostic and fold the result into the verdict at once."""
        indices = tuple(d.index for d in self._probe.devices)
        result = await self._dcgm.diag(level, indices)
        self._last_diag = result
        log.info(
            "diag",
            level=level,
            overall=str(result.overall),
            error=result.error,
            duration_s=(result.finished_at - result.started_at).total_seconds(),
        )
        self._wake.set()
        return result

    def _maybe_diag_after_reset(self) -> None:
        if not (self._settings.diag_after_reset and self.view.dcgm_status.available):
            return
        if self._dcgm.diag_running:
            return
        waiting = latching.waiting_for_diag(self._state)
        if waiting != self._reset_waiting:
            self._reset_waiting, self._diag_runs_since_reset = waiting, 0
        due = latching.diag_after_reset_due(
            self._state,
            self._last_diag,
            runs_since_reset=self._diag_runs_since_reset,
            retry_after_s=self._settings.diag_retry_after_reset_s,
            max_runs=self._settings.diag_retries_after_reset,
        )
        if due is None or due > self._clock():
            return
        self._diag_runs_since_reset += 1
        task = asyncio.create_task(self._diag_quietly(1), name="diag-after-reset")
        self._tasks.append(task)

    async def _diag_quietly(self, level: int) -> None:
        with contextlib.suppress(dcgm.DiagBusyError):
            await self.run_diag(level)

    async def release(
        self, *, gpu: str | int | None, code: str | None, force: bool
    ) -> list[tuple[str, latching.LatchedFault]]:
        """Release latched faults by hand (on-call); return (GPU UUID, fault) pairs released."""
        released: list[tuple[str, latching.LatchedFault]] = []
        gpus = dict(self._state.gpus)
        for uuid, state in gpus.items():
            if gpu is not None and gpu not in (uuid, state.index):
                continue
            gpus[uuid], out = latching.release(state, code=code, force=force)
            released.extend((uuid, fault) for fault in out)
        if released:
            self._state = self._state.model_copy(update={"gpus": gpus})
            await self._save(self._state)
            for uuid, fault in released:
                log.info("released", gpu_uuid=uuid, reason=fault.code, action=str(fault.action))
            self._wake.set()
        return released
