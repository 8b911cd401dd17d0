"""Diagnostics over HTTP and the recovery paths, on real pynvml against the fake NVML library and
the fake `dcgmi` (synthesized DCGM fixtures, see tests/fixtures/dcgm/README.md).

- `POST /v1/diag`: authenticated, one at a time, levels above 1 only on an idle or unhealthy
  node, the result folded into `/v1/gpus`.
- The automatic level-1 diagnostic after an observed reset: a ResetGPU latch clears only once it
  passes.
- NVML events for a GPU that was lost when events were registered arrive after its reset,
  without restarting the agent.
- An unusable state file is set aside and the agent starts clean, saying so.

The fake is loaded once for this module (pynvml keeps one global library handle) and reset
before every test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import test_utils

from agent import app as agent_app
from agent import auth, monitoring, readings, settings, snapshots
from agent.probing import nvml
from devcluster import fakenvml
from shared import health

DEADLINE_S = 30.0
FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures" / "dcgm"
NODE = "gpu-node-1"


@pytest.fixture(scope="module")
def fake() -> Iterator[fakenvml.InProcessControl]:
    """Build and load the fake library once for the module."""
    control = fakenvml.InProcessControl(fakenvml.build())
    yield control
    control.reset_all()


@pytest.fixture
def dcgmi(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Point the fake dcgmi at passing fixtures; return the gate file that releases a diag."""
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(tmp_path / "dcgmi.log"))
    monkeypatch.setenv("FAKE_DCGMI_HEALTH", str(FIXTURES / "health_pass.json"))
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4_pass.json"))
    gate = tmp_path / "diag-gate"
    monkeypatch.setenv("FAKE_DCGMI_GATE", str(gate))
    gate.touch()
    return gate


def hold(gate: pathlib.Path) -> None:
    """Hold diagnostics: the fake dcgmi waits for the gate file."""
    gate.unlink()


def release(gate: pathlib.Path) -> None:
    """Let held diagnostics finish."""
    gate.touch()


def agent_settings(tmp_path: pathlib.Path, **overrides: Any) -> settings.Settings:
    """Settings on temporary files, DCGM through the fake dcgmi, fast tiers."""
    boot = tmp_path / "boot_id"
    if not boot.exists():
        boot.write_text("boot-1\n")
    values: dict[str, Any] = {
        "node_name": NODE,
        "boot_id_path": boot,
        "state_path": tmp_path / "state.json",
        "kmsg_path": None,
        "dcgm_enabled": True,
        "dcgmi_path": str(FIXTURES / "fake_dcgmi.py"),
        "gauge_interval_s": 0.05,
        "counter_interval_s": 0.05,
        "event_wait_ms": 50,
        "debounce_s": 0.3,
        "auth_verb": "patch",
        **overrides,
    }
    return settings.Settings(**values)


class TokenTable:
    """A test `Authenticator`: known tokens, and which of them hold the RBAC right."""

    def __init__(self) -> None:
        self.allowed = {"on-call-token": "alice"}
        self.known_without_right = {"viewer-token": "bob"}
        self.asked: list[tuple[str, str]] = []

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> auth.Identity:
        """Accept allowed tokens, refuse known ones without the right (403), others 401."""
        del subresource
        self.asked.append((verb, node))
        if token in self.allowed:
            return auth.Identity(user=self.allowed[token])
        if token in self.known_without_right:
            msg = f"{self.known_without_right[token]} may not {verb} nodes/{node}"
            raise auth.AuthError(403, msg)
        msg = "token rejected by TokenReview"
        raise auth.AuthError(401, msg)


ON_CALL = {"Authorization": "Bearer on-call-token"}


async def poll(
    client: test_utils.TestClient[Any, Any],
    check: Callable[[dict[str, Any]], bool],
    what: str,
) -> dict[str, Any]:
    """GET /v1/gpus until `check` holds, against a generous deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resp = await client.get("/v1/gpus")
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
        if check(doc):
            return doc
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen before the deadline; last document: {doc}")
        await asyncio.sleep(0.05)


def gpu_doc(doc: dict[str, Any], index: int) -> dict[str, Any]:
    """One GPU's entry in /v1/gpus."""
    return next(g for g in doc["gpus"] if g["index"] == index)


@pytest.fixture
async def client(
    fake: fakenvml.InProcessControl, dcgmi: pathlib.Path, tmp_path: pathlib.Path
) -> AsyncIterator[test_utils.TestClient[Any, Any]]:
    """The agent app on the fake library and the fake dcgmi, with a test authenticator."""
    del dcgmi
    fake.reset_all()
    application = agent_app.make_app(agent_settings(tmp_path), authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        await poll(
            c,
            lambda d: len(d["gpus"]) == 8 and d["dcgm"]["available"] and d["takenAt"] is not None,
            "the first probe pass with DCGM available",
        )
        yield c


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        pytest.param({}, 401, "Unauthorized", id="a request without a token is refused with 401"),
        pytest.param({"Authorization": "Basic abc"}, 401, "Unauthorized",
                     id="a non-bearer authorization is refused with 401"),
        pytest.param({"Authorization": "Bearer stolen"}, 401, "Unauthorized",
                     id="a token the TokenReview rejects is refused with 401"),
        pytest.param({"Authorization": "Bearer viewer-token"}, 403, "Forbidden",
                     id="a token without patch on the node is refused with 403"),
    ],
)  # fmt: skip
async def test_diag_requires_an_authorised_caller(
    client: test_utils.TestClient[Any, Any], headers: dict[str, str], status: int, code: str
) -> None:
    """Only a caller the authenticator accepts may start a diagnostic; nothing runs otherwise."""
    resp = await client.post("/v1/diag?level=1", headers=headers)
    assert resp.status == status
    assert (await resp.json())["error"]["code"] == code
    doc = await poll(client, lambda _d: True, "the GPU document")
    assert doc["lastDiagnostic"] is None
    assert doc["dcgm"]["diagRunning"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param("level=4", "level", id="level 4 is refused naming the level field"),
        pytest.param("level=one", "level", id="a level that is not a number names the field"),
        pytest.param("level=1&wait=maybe", "wait", id="a wait flag that is not a boolean is named"),
    ],
)  # fmt: skip
async def test_diag_refuses_bad_parameters_naming_the_field(
    client: test_utils.TestClient[Any, Any], query: str, field: str
) -> None:
    """Bad query parameters give 400 with the parameter's name."""
    resp = await client.post(f"/v1/diag?{query}", headers=ON_CALL)
    assert resp.status == 400
    assert (await resp.json())["error"]["field"] == field


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param("gpu=%C2%B2", "gpu", id="a superscript two is no GPU index (review L10)"),
        pytest.param("gpu=" + "9" * 5000, "gpu", id="a 5000-digit index is refused"),
        pytest.param("gpu=../../etc", "gpu", id="a path is no GPU"),
        pytest.param("gpu=0&code=" + "x" * 65, "code", id="a code longer than 64 is refused"),
        pytest.param("gpu=0&code=79%0A", "code", id="a newline-suffixed code is refused"),
    ],
)  # fmt: skip
async def test_release_refuses_bad_parameters_naming_the_field(
    client: test_utils.TestClient[Any, Any], query: str, field: str
) -> None:
    """Bad query parameters of a release give 400 with the parameter's name, never a 500."""
    resp = await client.post(f"/v1/release?{query}", headers=ON_CALL)
    assert (400, field) == (resp.status, (await resp.json())["error"]["field"])


async def test_one_diagnostic_at_a_time_and_the_result_is_folded_into_gpus(
    client: test_utils.TestClient[Any, Any],
    dcgmi: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second request while one runs gets 409 DiagRunning; the finished result shows per GPU."""
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4_fail.json"))
    hold(dcgmi)  # hold the diagnostic until the second request has been answered
    first = await client.post("/v1/diag?level=1", headers=ON_CALL)
    assert first.status == 202
    assert await first.json() == {"started": True, "level": 1}
    await poll(client, lambda d: d["dcgm"]["diagRunning"] == 1, "the running diagnostic")
    second = await client.post("/v1/diag?level=1", headers=ON_CALL)
    assert second.status == 409
    assert (await second.json())["error"]["code"] == "DiagRunning"
    release(dcgmi)
    doc = await poll(
        client,
        lambda d: d["lastDiagnostic"] is not None and d["dcgm"]["diagRunning"] is None,
        "the finished diagnostic",
    )
    assert doc["lastDiagnostic"]["level"] == 1
    assert doc["lastDiagnostic"]["overall"] == "Fail"
    doc = await poll(
        client,
        lambda d: any(r["code"] == "DcgmDiagFailed" for r in gpu_doc(d, 1)["reasons"]),
        "the failed diagnostic in GPU 1's verdict",
    )
    assert gpu_doc(doc, 1)["lastDiagnostic"]["status"] == "Fail"
    assert gpu_doc(doc, 1)["verdict"] == "Failed"
    assert gpu_doc(doc, 0)["lastDiagnostic"]["status"] == "Pass"
    assert gpu_doc(doc, 0)["verdict"] == "Healthy"


async def test_wait_true_answers_with_the_result(client: test_utils.TestClient[Any, Any]) -> None:
    """With wait=true the reply is the diagnostic itself, per GPU."""
    resp = await client.post("/v1/diag?level=1&wait=true", headers=ON_CALL)
    assert resp.status == 200
    result = await resp.json()
    assert result["level"] == 1
    assert result["overall"] == "Pass"
    assert {g["gpuIndex"] for g in result["gpus"]} == set(range(8))


def busy(control: fakenvml.InProcessControl) -> None:
    """A job runs on GPU 2; every GPU is healthy."""
    control.set_value(2, "util_gpu", 87)
    control.set_value(2, "memory_used", 40 * 1024**3)


def busy_and_failed(control: fakenvml.InProcessControl) -> None:
    """A job runs on GPU 2, and GPU 5 failed (the controller quarantines such a node)."""
    busy(control)
    control.reset_required(5)


@pytest.mark.parametrize(
    ("setup", "level", "status", "code"),
    [
        pytest.param(busy, 2, 409, "NodeBusy",
                     id="level 2 on a busy healthy node is refused with NodeBusy"),
        pytest.param(busy, 3, 409, "NodeBusy",
                     id="level 3 on a busy healthy node is refused with NodeBusy"),
        pytest.param(busy, 1, 202, None, id="level 1 on a busy node is allowed"),
        pytest.param(busy_and_failed, 3, 202, None,
                     id="level 3 on a node that is already unhealthy is allowed"),
    ],
)  # fmt: skip
async def test_long_diagnostics_only_on_idle_or_unhealthy_nodes(  # noqa: PLR0917 - parametrized
    client: test_utils.TestClient[Any, Any],
    fake: fakenvml.InProcessControl,
    setup: Callable[[fakenvml.InProcessControl], None],
    level: int,
    status: int,
    code: str | None,
) -> None:
    """Levels 2 and 3 stress the GPUs for minutes: never under a running job on a healthy node."""
    setup(fake)
    await poll(
        client,
        lambda d: (gpu_doc(d, 2)["readings"] or {}).get("utilizationGpuPct") == 87.0,
        "the busy GPU in the readings",
    )
    if setup is busy_and_failed:
        await poll(client, lambda d: gpu_doc(d, 5)["verdict"] == "Failed", "the failed GPU")
    resp = await client.post(f"/v1/diag?level={level}", headers=ON_CALL)
    body = await resp.json()
    assert resp.status == status, body
    if code is not None:
        assert body["error"]["code"] == code
        assert "idle or quarantined" in body["error"]["message"]
        assert body["error"]["field"] == "level"
    await poll(
        client,
        lambda d: (
            d["dcgm"]["diagRunning"] is None
            and (code is not None or d["lastDiagnostic"] is not None)
        ),
        "no diagnostic left running",
    )


async def test_diag_without_dcgm_is_unavailable(
    fake: fakenvml.InProcessControl, tmp_path: pathlib.Path
) -> None:
    """A node without dcgmi answers 503 and says why in /v1/gpus."""
    fake.reset_all()
    cfg = agent_settings(tmp_path, dcgmi_path=str(tmp_path / "no-dcgmi"))
    application = agent_app.make_app(cfg, authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        doc = await poll(c, lambda d: d["takenAt"] is not None, "the first pass")
        assert doc["dcgm"]["available"] is False
        assert "not found" in doc["dcgm"]["detail"]
        resp = await c.post("/v1/diag?level=1", headers=ON_CALL)
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "DcgmUnavailable"


# ------------------------------------------------------------------ stepping a monitor


@dataclasses.dataclass
class Rig:
    """A monitor stepped by hand on the fake library."""

    control: fakenvml.InProcessControl
    monitor: monitoring.Monitor

    async def until(self, check: Callable[[snapshots.View], bool], what: str) -> snapshots.View:
        """Step probe passes until `check(view)` holds, against a generous deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            view = await self.monitor.probe_once()
            if check(view):
                return view
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not seen before the deadline; last: {view.verdicts}")
            await asyncio.sleep(0.02)


@pytest.fixture
async def make_rig(
    fake: fakenvml.InProcessControl, tmp_path: pathlib.Path
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    """Start a monitor (no loops) after an optional setup of the fake; stop it at the end."""
    rigs: list[Rig] = []
    fake.reset_all()

    async def make(**overrides: Any) -> Rig:
        mon = monitoring.Monitor(agent_settings(tmp_path, **overrides))
        await mon.start(loops=False)
        rig = Rig(fake, mon)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.monitor.stop()


def verdict_of(view: snapshots.View, index: int) -> tuple[health.Verdict, health.Action]:
    """The (verdict, action) of one GPU."""
    v = next(v for v in view.verdicts if v.index == index)
    return v.verdict, v.action


def latched_codes(view: snapshots.View, index: int) -> set[str]:
    """The latched fault codes of one GPU."""
    uuid = next(v.uuid for v in view.verdicts if v.index == index)
    return {f.code for f in view.state.gpus[uuid].latched}


FAILED_RESET = (health.Verdict.FAILED, health.Action.RESET_GPU)
HEALTHY = (health.Verdict.HEALTHY, health.Action.NONE)


async def test_a_reset_with_dcgm_clears_only_after_the_automatic_level_1_passes(
    make_rig: Callable[..., Awaitable[Rig]], dcgmi: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Xid 95 latches ResetGPU; a passing diag before the reset does not clear it; the reset
    alone does not either; the level-1 diagnostic the agent starts by itself then clears it."""
    rig = await make_rig()
    gpu = 3
    await rig.until(lambda v: v.events_registered == 8 and v.dcgm_status.available, "events")
    rig.control.ecc_corrected(gpu, 1)  # so that the reset shows in the volatile counters
    rig.control.xid(gpu, 95)
    await rig.until(lambda v: verdict_of(v, gpu) == FAILED_RESET, "the Xid 95 verdict")
    early = await rig.monitor.run_diag(1)
    assert early.overall is readings.DiagStatus.PASS
    view = await rig.until(lambda v: v.last_diag is early, "the early diagnostic folded")
    assert verdict_of(view, gpu) == FAILED_RESET, "a diagnostic before any reset clears nothing"
    hold(dcgmi)  # hold the automatic diagnostic so the in-between state can be seen
    rig.control.reset(gpu)
    view = await rig.until(lambda v: v.diag_running == 1, "the automatic diagnostic running")
    assert verdict_of(view, gpu) == FAILED_RESET, "the reset alone does not clear with DCGM"
    assert "XidUncontainedEcc" in latched_codes(view, gpu)
    release(dcgmi)
    view = await rig.until(lambda v: verdict_of(v, gpu) == HEALTHY, "the cleared verdict")
    assert view.last_diag is not None
    assert view.last_diag is not early
    assert view.last_diag.level == 1
    assert "diag -r 1 -j" in (tmp_path / "dcgmi.log").read_text()


async def test_a_failing_automatic_diagnostic_keeps_the_latch(
    make_rig: Callable[..., Awaitable[Rig]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reset, a level-1 diagnostic that fails the GPU leaves it failed, saying so."""
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4_fail.json"))
    rig = await make_rig()
    gpu = 1  # the GPU diag4_fail.json fails
    await rig.until(lambda v: v.events_registered == 8 and v.dcgm_status.available, "events")
    rig.control.ecc_corrected(gpu, 1)
    rig.control.xid(gpu, 95)
    await rig.until(lambda v: verdict_of(v, gpu) == FAILED_RESET, "the Xid 95 verdict")
    rig.control.reset(gpu)
    view = await rig.until(
        lambda v: v.last_diag is not None and "DcgmDiagFailed" in latched_codes(v, gpu),
        "the failed automatic diagnostic folded",
    )
    assert view.last_diag is not None
    assert view.last_diag.level == 1
    assert "XidUncontainedEcc" in latched_codes(view, gpu)
    assert verdict_of(view, gpu)[0] is health.Verdict.FAILED
    for _ in range(3):
        view = await rig.monitor.probe_once()
    assert "XidUncontainedEcc" in latched_codes(view, gpu), "no second diagnostic clears it"


async def test_fabric_manager_training_after_a_reset_is_waited_out(
    make_rig: Callable[..., Awaitable[Rig]],
    dcgmi: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: pathlib.Path,
) -> None:
    """The automatic level 1 meets Fabric Manager still training (DCGM 4.6: every GPU printed
    Fail, a CONFIG error of no entity): no GPU latches for a person, the reset GPU keeps
    waiting, and the run the agent makes again later passes and clears it."""
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4.6_l1_fm_training.json"))
    rig = await make_rig(diag_retry_after_reset_s=0.3)
    gpu = 3
    await rig.until(lambda v: v.events_registered == 8 and v.dcgm_status.available, "events")
    rig.control.ecc_corrected(gpu, 1)
    rig.control.xid(gpu, 95)
    await rig.until(lambda v: verdict_of(v, gpu) == FAILED_RESET, "the Xid 95 verdict")
    rig.control.reset(gpu)
    view = await rig.until(
        lambda v: v.last_diag is not None and bool(v.last_diag.node_findings),
        "the Fabric Manager run folded",
    )
    assert (verdict_of(view, gpu), latched_codes(view, gpu)) == (
        FAILED_RESET, {"XidUncontainedEcc"}
    )  # fmt: skip
    assert {verdict_of(view, i) for i in range(8) if i != gpu} == {
        (health.Verdict.DEGRADED, health.Action.NONE)
    }
    assert all(not latched_codes(view, i) for i in range(8) if i != gpu)
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4_pass.json"))
    view = await rig.until(
        lambda v: {verdict_of(v, i) for i in range(8)} == {HEALTHY}, "cleared by the retry"
    )
    assert (tmp_path / "dcgmi.log").read_text().count("diag -r 1 -j") >= 2


def register_fails_as_lost(control: fakenvml.InProcessControl, gpu: int) -> None:
    """The GPU falls off the bus between enumeration and event registration."""
    control.set_rc("nvmlDeviceRegisterEvents", gpu, 15)


def lost_before_start(control: fakenvml.InProcessControl, gpu: int) -> None:
    """The GPU is off the bus when the agent starts: it does not even enumerate."""
    control.lost(gpu)


@pytest.mark.parametrize(
    "before_start",
    [
        pytest.param(register_fails_as_lost,
                     id="a GPU lost when events were registered gets them after its reset"),
        pytest.param(lost_before_start,
                     id="a GPU lost when the agent started is enumerated and watched after reset"),
    ],
)  # fmt: skip
async def test_events_of_a_gpu_lost_at_registration_arrive_after_its_reset(
    make_rig: Callable[..., Awaitable[Rig]],
    fake: fakenvml.InProcessControl,
    before_start: Callable[[fakenvml.InProcessControl, int], None],
) -> None:
    """Once the GPU is reset its Xids come through the NVML event set, with no agent restart."""
    gpu = 4
    fake.reset_all()
    before_start(fake, gpu)
    rig = await make_rig(dcgm_enabled=False)
    await rig.until(lambda v: v.events_registered == 7, "the other GPUs registered")
    rig.control.lost(gpu)
    rig.control.set_rc("nvmlDeviceRegisterEvents", gpu, 0)
    rig.control.reset(gpu)
    await rig.until(
        lambda v: (
            v.events_registered == 8
            and any(s.index == gpu and s.nvml_error is None for s in v.snapshots)
        ),
        "the reset GPU answering and registered",
    )
    rig.control.xid(gpu, 13)
    view = await rig.until(
        lambda v: any(e.xid == 13 for e in v.recent_events.get(gpu, ())), "the Xid on the GPU"
    )
    event = next(e for e in view.recent_events[gpu] if e.xid == 13)
    assert event.source is readings.XidSource.NVML


async def test_an_unusable_state_file_is_set_aside_and_the_agent_starts_clean(
    fake: fakenvml.InProcessControl, dcgmi: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """The agent starts with every GPU healthy, keeps the bad file as evidence, and says so."""
    del dcgmi
    fake.reset_all()
    (tmp_path / "state.json").write_text('{"version": 1, "gpus": {"GPU-x": ')
    application = agent_app.make_app(agent_settings(tmp_path), authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        doc = await poll(c, lambda d: len(d["gpus"]) == 8, "the first pass")
        assert {g["verdict"] for g in doc["gpus"]} == {"Healthy"}
        problem = doc["stateFile"]["problem"]
        assert "is invalid" in problem
        assert "state.json.corrupt" in problem
    assert (tmp_path / "state.json.corrupt").read_text().startswith('{"version": 1')
    assert (tmp_path / "state.json").exists(), "the clean state is written in its place"


async def test_gpus_answers_while_nvml_hangs_and_the_gpus_read_unknown(
    fake: fakenvml.InProcessControl,
    dcgmi: pathlib.Path,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe pass stuck in NVML does not stop `/v1/gpus`; the GPUs read Unknown (not the last
    good verdict) until NVML answers, then they are Healthy again."""
    del dcgmi
    fake.reset_all()
    unblock = threading.Event()
    original = nvml.Probe.gauges

    def hanging(self: nvml.Probe, device: nvml.Device) -> dict[str, Any]:
        unblock.wait(DEADLINE_S)
        return original(self, device)

    cfg = agent_settings(tmp_path, probe_timeout_s=0.2)
    application = agent_app.make_app(cfg, authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        await poll(c, lambda d: len(d["gpus"]) == 8, "the first pass")
        monkeypatch.setattr(nvml.Probe, "gauges", hanging)
        doc = await poll(
            c, lambda d: {g["verdict"] for g in d["gpus"]} == {"Unknown"}, "Unknown verdicts"
        )
        assert "did not answer" in doc["nvml"]["detail"]
        assert {r["code"] for r in gpu_doc(doc, 0)["reasons"]} == {"NvmlUnavailable"}
        assert (await c.get("/metrics")).status == 200
        monkeypatch.setattr(nvml.Probe, "gauges", original)
        unblock.set()
        doc = await poll(
            c, lambda d: {g["verdict"] for g in d["gpus"]} == {"Healthy"}, "Healthy again"
        )
        assert doc["nvml"]["detail"] == "8 GPUs"


DCGM_FAST = {"dcgm_health_interval_s": 0.1, "dcgm_retry_initial_s": 0.05, "dcgm_retry_max_s": 0.2}


async def test_health_watches_are_set_again_after_a_host_engine_restart(
    fake: fakenvml.InProcessControl,
    tmp_path: pathlib.Path,
    dcgmi: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host engine that forgot its watches ("not enabled", not JSON) has them set again."""
    del dcgmi
    fake.reset_all()
    engine = tmp_path / "engine"
    monkeypatch.setenv("FAKE_DCGMI_STATE", str(engine))
    cfg = agent_settings(tmp_path, **DCGM_FAST)
    application = agent_app.make_app(cfg, authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        await poll(c, lambda d: d["dcgm"]["lastCheckAt"] is not None, "a first health read")
        engine.unlink()  # the host engine restarts and forgets its watches
        doc = await poll(
            c,
            lambda d: d["dcgm"]["watchesSetAgain"] >= 1 and d["dcgm"]["available"],
            "the watches set again",
        )
        assert doc["dcgm"]["detail"] == "health watches set"
    calls = (tmp_path / "dcgmi.log").read_text().splitlines()
    assert sum(1 for call in calls if call.startswith("health -s a")) >= 2


async def test_a_dcgm_down_at_start_is_retried_and_found(
    fake: fakenvml.InProcessControl,
    tmp_path: pathlib.Path,
    dcgmi: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No host engine at start: unavailable with the retry said in /v1/gpus, then found."""
    del dcgmi
    fake.reset_all()
    down = tmp_path / "down"
    down.touch()
    monkeypatch.setenv("FAKE_DCGMI_DOWN", str(down))
    cfg = agent_settings(tmp_path, **DCGM_FAST)
    application = agent_app.make_app(cfg, authenticator=TokenTable())
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:
        doc = await poll(c, lambda d: d["dcgm"]["failures"] >= 2, "retries")
        assert doc["dcgm"]["available"] is False
        assert "unable to establish a connection" in doc["dcgm"]["detail"]
        assert "retrying in" in doc["dcgm"]["detail"]
        assert doc["dcgm"]["retryAt"] is not None
        down.unlink()
        await poll(c, lambda d: d["dcgm"]["available"], "DCGM found")
