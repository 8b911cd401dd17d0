"""Heartbeats against a small real aiohttp controller stand-in: leader hints, backoff, token
rotation, an immediate heartbeat on a verdict change, and local serving while it is away.

The probe side is a `Monitor` whose start and stop touch no NVML; each test publishes the views
it needs. Randomness and pauses are injected, so nothing here sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import pathlib
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import test_utils, web

from agent import app as agent_app
from agent import monitoring, reporting, settings, snapshots, verdicts
from shared import health, heartbeat

DEADLINE_S = 30.0
T0 = dt.datetime(2026, 5, 1, 3, 0, tzinfo=dt.UTC)


class StubMonitor(monitoring.Monitor):
    """A monitor that never touches NVML: tests publish the views a probe pass would."""

    async def start(self, *, loops: bool = True) -> None:
        """Start nothing."""
        del loops

    async def stop(self) -> None:
        """Stop nothing."""

    def publish(self, view: snapshots.View) -> None:
        """Install `view` and tell the subscribers, as a probe pass with a changed verdict does."""
        self.view = view
        for listener in self._listeners:
            listener(view)


def gpu(index: int, verdict: health.Verdict, action: health.Action) -> verdicts.GpuVerdict:
    """One GPU's verdict, with a reason when it is not healthy."""
    reasons: tuple[heartbeat.Reason, ...] = ()
    if verdict is not health.Verdict.HEALTHY:
        reasons = (
            heartbeat.Reason(code="XidFallenOffBus", verdict=verdict, action=action, xid=79),
        )
    return verdicts.GpuVerdict(f"GPU-{index:04d}", index, verdict, action, reasons)


def view(*gpus: verdicts.GpuVerdict) -> snapshots.View:
    """A probe view taken at T0."""
    return snapshots.View(node_name="gpu-node-1", boot_id="boot-1", taken_at=T0, verdicts=gpus)


HEALTHY = gpu(0, health.Verdict.HEALTHY, health.Action.NONE)
FAILED = gpu(0, health.Verdict.FAILED, health.Action.REBOOT_NODE)

Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass
class Controller:
    """A controller stand-in: records heartbeats and answers with `reply`."""

    url: str = ""
    beats: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    auths: list[str] = dataclasses.field(default_factory=list)
    reply: Reply | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Record the heartbeat, then answer."""
        self.beats.append(await request.json())
        self.auths.append(request.headers.get("Authorization", ""))
        if self.reply is not None:
            return await self.reply(request)
        return web.json_response({"ok": True})


async def serve_controller(controller: Controller) -> web.AppRunner:
    """Serve `controller` on a free local port and set its URL."""
    application = web.Application()
    application.router.add_post("/v1/heartbeats", controller.handle)
    runner = web.AppRunner(application)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    controller.url = f"http://127.0.0.1:{port}"
    return runner


@pytest.fixture
async def controllers() -> AsyncIterator[Callable[[], Awaitable[Controller]]]:
    """Make as many controller stand-ins as a test needs; all stop at the end."""
    runners: list[web.AppRunner] = []

    async def make() -> Controller:
        controller = Controller()
        runners.append(await serve_controller(controller))
        return controller

    yield make
    for runner in runners:
        await runner.cleanup()


def closed_port_url() -> str:
    """A local URL nothing listens on (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def config(tmp_path: pathlib.Path, controller_url: str, **overrides: Any) -> settings.Settings:
    """Agent settings on temporary files."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("token-1\n")
    values: dict[str, Any] = {
        "node_name": "gpu-node-1",
        "controller_url": controller_url,
        "token_path": token,
        "boot_id_path": boot,
        "state_path": tmp_path / "state.json",
        "kmsg_path": None,
        "dcgm_enabled": False,
        "auth_enabled": False,
        "heartbeat_interval_s": 3600.0,
        "heartbeat_timeout_s": 10.0,
        **overrides,
    }
    return settings.Settings(**values)


@dataclasses.dataclass
class Rig:
    """A reporter on a stub monitor."""

    monitor: StubMonitor
    reporter: reporting.Reporter


@pytest.fixture
async def make_rig(
    tmp_path: pathlib.Path,
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    """Start a reporter (its session open) for a controller URL; it stops at the end."""
    rigs: list[Rig] = []

    async def make(
        controller_url: str,
        *,
        loop: bool = False,
        pause: Callable[[float], Awaitable[None]] | None = None,
        rnd: random.Random | None = None,
        **overrides: Any,
    ) -> Rig:
        cfg = config(tmp_path, controller_url, **overrides)
        mon = StubMonitor(cfg)
        mon.publish(view(HEALTHY))
        reporter = reporting.Reporter(cfg, mon, clock=lambda: T0, rnd=rnd, pause=pause)
        rig = Rig(mon, reporter)
        rigs.append(rig)
        if loop:
            await reporter.start()
        else:
            await reporter.open()
        return rig

    yield make
    for rig in rigs:
        await rig.reporter.stop()


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` against a generous deadline."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what}: not seen before the deadline")
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ no URL is followed


async def hint_in_body(request: web.Request, leader: str) -> web.Response:
    """A follower naming a leader in the JSON body (what followers used to send)."""
    del request
    body = {"error": {"code": "NotLeader", "message": "not the leader"}, "leaderUrl": leader}
    return web.json_response(body, status=503)


async def hint_in_error(request: web.Request, leader: str) -> web.Response:
    """A follower naming a leader inside the error object."""
    del request
    body = {"error": {"code": "NotLeader", "message": "not the leader", "leaderUrl": leader}}
    return web.json_response(body, status=503)


async def hint_in_header(request: web.Request, leader: str) -> web.Response:
    """A follower naming a leader in `X-Leader-URL` with a plain-text body."""
    del request
    return web.Response(status=503, text="not the leader", headers={"X-Leader-URL": leader})


async def redirect(request: web.Request, leader: str) -> web.Response:
    """A reply sending the agent elsewhere by HTTP redirect."""
    del request
    raise web.HTTPTemporaryRedirect(f"{leader}/v1/heartbeats")


@pytest.mark.parametrize(
    "follower",
    [
        pytest.param(hint_in_body, id="a leaderUrl in a 503 body is not followed"),
        pytest.param(hint_in_error, id="a leaderUrl inside the 503 error object is not followed"),
        pytest.param(hint_in_header, id="an X-Leader-URL header on a 503 is not followed"),
        pytest.param(redirect, id="a redirect is not followed"),
    ],
)
async def test_the_agent_sends_its_token_only_to_the_configured_controller(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
    follower: Callable[[web.Request, str], Awaitable[web.Response]],
) -> None:
    """Whatever a reply names, the heartbeat counts as failed, the named server never hears
    from the agent (so never sees its token), and the next heartbeat goes to controllerUrl."""
    elsewhere = await controllers()
    configured = await controllers()
    configured.reply = lambda request: follower(request, elsewhere.url)
    rig = await make_rig(configured.url)
    refused = await rig.reporter.send_once()
    configured.reply = None
    landed = await rig.reporter.send_once()
    expected = (False, True, 0, 2, f"{configured.url}/v1/heartbeats")
    actual = (refused, landed, len(elsewhere.beats), len(configured.beats),
              rig.reporter.stats.target)  # fmt: skip
    assert expected == actual


# ------------------------------------------------------------------ backoff


class Highest(random.Random):
    """A random source that always picks the top of the range, so bounds become exact."""

    def uniform(self, a: float, b: float) -> float:
        """Return the upper end."""
        del a
        return b


@pytest.mark.parametrize(
    ("attempt", "initial_s", "max_s", "bound_s"),
    [
        pytest.param(0, 0.5, 30.0, 0.5, id="the first retry waits at most the initial delay"),
        pytest.param(1, 0.5, 30.0, 1.0, id="the second retry may wait twice as long"),
        pytest.param(5, 0.5, 30.0, 16.0, id="the bound doubles with each failure"),
        pytest.param(6, 0.5, 30.0, 30.0, id="the bound stops at the maximum"),
        pytest.param(2000, 0.5, 30.0, 30.0,
                     id="two thousand failures in a row still give the maximum, not an overflow"),
    ],
)  # fmt: skip
def test_backoff_grows_and_is_bounded(
    attempt: int, initial_s: float, max_s: float, bound_s: float
) -> None:
    """The jitter range is [0, min(max, initial * 2**attempt)]."""
    assert reporting.backoff_s(attempt, initial_s=initial_s, max_s=max_s, rnd=Highest()) == bound_s
    low = reporting.backoff_s(attempt, initial_s=initial_s, max_s=max_s, rnd=random.Random(7))  # noqa: S311 - jitter
    assert 0.0 <= low <= bound_s


async def test_failed_heartbeats_back_off_with_growing_bounded_jitter(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Against an unreachable controller the loop's pauses double up to min(max, interval)."""
    pauses: list[float] = []
    enough = asyncio.Event()

    async def pause(delay_s: float) -> None:
        pauses.append(delay_s)
        if len(pauses) >= 8:
            enough.set()
            await asyncio.Event().wait()  # park the loop; stop() cancels it

    rig = await make_rig(
        closed_port_url(),
        loop=True,
        pause=pause,
        rnd=Highest(),
        backoff_initial_s=0.5,
        backoff_max_s=30.0,
        heartbeat_interval_s=5.0,
    )
    await asyncio.wait_for(enough.wait(), DEADLINE_S)
    assert pauses == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert rig.reporter.stats.failed == 8
    assert "ClientConnectorError" in rig.reporter.stats.last_error


async def test_a_success_after_failures_returns_to_the_interval(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """After the controller comes back the pause is the heartbeat interval, not a backoff."""
    controller = await controllers()
    failures = 3

    async def flaky(request: web.Request) -> web.Response:
        del request
        if len(controller.beats) <= failures:
            return web.json_response({"error": {"code": "Unavailable"}}, status=503)
        return web.json_response({"ok": True})

    controller.reply = flaky
    pauses: list[float] = []
    enough = asyncio.Event()

    async def pause(delay_s: float) -> None:
        pauses.append(delay_s)
        if len(pauses) >= failures + 1:
            enough.set()
            await asyncio.Event().wait()

    await make_rig(controller.url, loop=True, pause=pause, rnd=Highest(), heartbeat_interval_s=7.0)
    await asyncio.wait_for(enough.wait(), DEADLINE_S)
    assert pauses == [0.5, 1.0, 2.0, 7.0]


# ------------------------------------------------------------------ token rotation


def rotate(path: pathlib.Path, token: str) -> None:
    """Replace the token file atomically, as the kubelet's projected volume does."""
    tmp = path.with_name(".token.tmp")
    tmp.write_text(token + "\n")
    tmp.replace(path)


def overwrite_keeping_stamp(path: pathlib.Path, token: str) -> None:
    """Change the token in place keeping inode, size and mtime, so only a 401 reveals it."""
    st = path.stat()
    path.write_text(token + "\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(rotate, id="a rotated token file is read again before the next heartbeat"),
        pytest.param(overwrite_keeping_stamp,
                     id="a 401 forces a re-read even when the file looks unchanged"),
    ],
)  # fmt: skip
async def test_token_rotation_is_picked_up_without_a_restart(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
    tmp_path: pathlib.Path,
    change: Callable[[pathlib.Path, str], None],
) -> None:
    """Heartbeats carry the current token; one the controller rejects is retried with the new."""
    controller = await controllers()
    accepted = {"Bearer token-1"}

    async def check(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") not in accepted:
            return web.json_response({"error": {"code": "Unauthorized"}}, status=401)
        return web.json_response({"ok": True})

    controller.reply = check
    rig = await make_rig(controller.url)
    assert await rig.reporter.send_once()
    change(tmp_path / "token", "token-2")
    accepted = {"Bearer token-2"}
    assert await rig.reporter.send_once()
    assert controller.auths[-1] == "Bearer token-2"


async def test_a_missing_token_file_sends_no_authorization_and_does_not_crash(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
    tmp_path: pathlib.Path,
) -> None:
    """Without a token the heartbeat goes out unauthenticated; the controller decides."""
    controller = await controllers()
    rig = await make_rig(controller.url)
    (tmp_path / "token").unlink()
    assert await rig.reporter.send_once()
    assert controller.auths[-1] == ""


def test_token_file_that_cannot_be_read_gives_no_token(tmp_path: pathlib.Path) -> None:
    """A token path that is a directory (a broken mount) reads as no token, not an exception."""
    (tmp_path / "token").mkdir()
    assert reporting.TokenFile(tmp_path / "token").get() == ""


# ------------------------------------------------------------------ verdict changes


async def test_a_verdict_change_is_sent_at_once_not_at_the_next_interval(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """With an hour-long interval, a GPU failing still reaches the controller right away."""
    controller = await controllers()
    rig = await make_rig(controller.url, loop=True, heartbeat_interval_s=3600.0)
    await until(lambda: len(controller.beats) == 1, "the first heartbeat")
    assert controller.beats[0]["gpus"][0]["verdict"] == "Healthy"
    rig.monitor.publish(view(FAILED))
    await until(lambda: len(controller.beats) == 2, "the heartbeat after the verdict change")
    assert controller.beats[1]["gpus"][0]["verdict"] == "Failed"
    assert controller.beats[1]["gpus"][0]["action"] == "RebootNode"
    assert controller.beats[1]["sequence"] > controller.beats[0]["sequence"]


async def test_stop_ends_the_loop_when_a_verdict_change_arrives_in_the_same_tick(
    controllers: Callable[[], Awaitable[Controller]],
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A poke and stop()'s cancel meeting in one loop iteration still stop the loop.

    CPython 3.11's `asyncio.wait_for` returns the inner result when both land together
    (python/cpython#86296): the cancel was lost and stop() waited forever, as the agent's
    shutdown once did in CI (its probe loop, on the same pattern).
    """
    controller = await controllers()
    rig = await make_rig(controller.url, loop=True, heartbeat_interval_s=3600.0)
    await until(lambda: len(controller.beats) == 1, "the first heartbeat")
    await asyncio.sleep(0.05)  # the loop is back in its hour-long pause
    rig.monitor.publish(view(FAILED))  # sets the poke, and in the same tick:
    try:
        async with asyncio.timeout(DEADLINE_S):
            await rig.reporter.stop()
    except TimeoutError:
        pytest.fail("stop() did not return: the loop swallowed its cancel")
    assert len(controller.beats) == 1


# ------------------------------------------------------------------ controller away


async def test_the_agent_keeps_serving_while_the_controller_is_unreachable(
    tmp_path: pathlib.Path,
) -> None:
    """`/v1/gpus`, `/metrics` and `/readyz` answer, and `/v1/gpus` shows the failing heartbeats."""
    cfg = config(tmp_path, closed_port_url(), backoff_initial_s=0.01, backoff_max_s=0.05)
    mon = StubMonitor(cfg)
    mon.publish(view(FAILED))
    application = agent_app.make_app(cfg, monitor=mon)
    async with test_utils.TestClient(test_utils.TestServer(application)) as client:
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while True:
            resp = await client.get("/v1/gpus")
            assert resp.status == 200
            doc = await resp.json()
            if doc["heartbeats"]["failed"] >= 3:
                break
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"heartbeat failures not reported: {doc['heartbeats']}")
            await asyncio.sleep(0.01)
        assert doc["verdict"] == "Failed"
        assert doc["heartbeats"]["sent"] == 0
        assert "ClientConnectorError" in doc["heartbeats"]["lastError"]
        metrics = await client.get("/metrics")
        assert metrics.status == 200
        assert 'taugrid_gpu_verdict{gpu="0"' in await metrics.text()
        assert (await client.get("/readyz")).status == 200
