"""The agent as a process: LD_LIBRARY_PATH on the fake, a fault injected from outside, the
changed verdict posted to a test receiver; plus its HTTP surface."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from devcluster import fakenvml
from tests import support

DEADLINE_S = 60.0


def free_port() -> int:
    """Ask the kernel for a free TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[dict[str, Any]], list[str]]]:
    """A tiny controller stand-in recording heartbeats and the Authorization header."""
    beats: list[dict[str, Any]] = []
    auths: list[str] = []

    async def heartbeats(request: web.Request) -> web.Response:
        beats.append(await request.json())
        auths.append(request.headers.get("Authorization", ""))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/heartbeats", heartbeats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", beats, auths
    await runner.cleanup()


@pytest.fixture
def agent_proc(
    tmp_path: pathlib.Path, receiver: tuple[str, list[dict[str, Any]], list[str]]
) -> Any:
    """Start `python -m agent` on the fake library; stop it with SIGTERM."""
    lib = fakenvml.build()
    sock = tmp_path / "fake.sock"
    port = free_port()
    (tmp_path / "boot_id").write_text("boot-a\n")
    (tmp_path / "token").write_text("token-1\n")
    (tmp_path / "kmsg").write_text("")
    env = {
        **os.environ,
        **fakenvml.agent_env(lib, sock),
        "TAUGRID_AGENT_NODE_NAME": "gpu-node-7",
        "TAUGRID_AGENT_LISTEN_HOST": "127.0.0.1",
        "TAUGRID_AGENT_PORT": str(port),
        "TAUGRID_AGENT_CONTROLLER_URL": receiver[0],
        "TAUGRID_AGENT_TOKEN_PATH": str(tmp_path / "token"),
        "TAUGRID_AGENT_BOOT_ID_PATH": str(tmp_path / "boot_id"),
        "TAUGRID_AGENT_STATE_PATH": str(tmp_path / "state.json"),
        "TAUGRID_AGENT_KMSG_PATH": str(tmp_path / "kmsg"),
        "TAUGRID_AGENT_DCGMI_PATH": str(tmp_path / "no-dcgmi"),
        "TAUGRID_AGENT_AUTH_ENABLED": "true",
        "TAUGRID_AGENT_AUTH_AUDIENCE": "taugrid",
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "TAUGRID_AGENT_SHUTDOWN_GRACE_S": "0",
        "TAUGRID_AGENT_HEARTBEAT_INTERVAL_S": "30",
        "TAUGRID_AGENT_LOG_JSON": "true",
        "TAUGRID_AGENT_HTTP_IDLE_TIMEOUT_S": "2",
    }
    with (tmp_path / "agent.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent"], env=env, stdout=subprocess.DEVNULL, stderr=log
        )
        yield proc, fakenvml.SocketControl(sock), f"http://127.0.0.1:{port}", tmp_path
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def poll_json(session: aiohttp.ClientSession, url: str, check: Any) -> Any:
    """GET `url` until `check(json)` holds or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    last = await resp.json()
                    if check(last):
                        return last
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    pytest.fail(f"{url} never satisfied the check; last answer: {last}")


async def test_injected_fault_reaches_the_controller_as_a_heartbeat(
    agent_proc: Any, receiver: tuple[str, list[dict[str, Any]], list[str]]
) -> None:
    """Xid 79 injected through the fake's socket is posted as Failed/RebootNode at once."""
    proc, control, url, tmp = agent_proc
    _, beats, auths = receiver
    async with aiohttp.ClientSession() as session:
        await poll_json(session, f"{url}/v1/gpus", lambda d: d["nvml"]["eventsRegistered"] == 8)
        control.xid(2, 79)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            hit = [
                g
                for b in beats
                for g in b["gpus"]
                if g["index"] == 2 and g["verdict"] == "Failed" and g["action"] == "RebootNode"
            ]
            if hit:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"no Failed heartbeat; got {len(beats)} heartbeats")
        assert hit[0]["reasons"][0]["latched"] is True
        assert beats[-1]["nodeName"] == "gpu-node-7"
        assert auths[-1] == "Bearer token-1"

        # The token is re-read when it rotates.
        (tmp / "token").write_text("token-2\n")
        control.xid(4, 13)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and auths[-1] != "Bearer token-2":
            await asyncio.sleep(0.1)
        assert auths[-1] == "Bearer token-2"

        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert "DCGM_FI_DEV_GPU_TEMP" in families
        verdict = [
            s.value
            for s in families["taugrid_gpu_verdict"].samples
            if s.labels["gpu"] == "2" and s.labels["verdict"] == "Failed"
        ]
        assert verdict == [1.0]

        async with session.post(f"{url}/v1/diag?level=1") as resp:
            assert resp.status == 401
        async with session.post(f"{url}/v1/release", headers={"Authorization": "Bearer x"}) as resp:
            assert resp.status == 401
            assert "unavailable" in (await resp.json())["error"]["message"]
        doc = await poll_json(session, f"{url}/v1/gpus", lambda d: True)
        assert doc["dcgm"]["available"] is False
        assert "not found" in doc["dcgm"]["detail"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


async def test_a_connection_that_never_finishes_its_request_head_is_closed(agent_proc: Any) -> None:
    """A client that sends nothing and one that trickles header bytes are both hung up on
    (`http_idle_timeout_s`, 2 s here; aiohttp's default an hour: security review 3,
    finding 14), while the API still answers."""
    _, _, url, _ = agent_proc
    async with aiohttp.ClientSession() as session:
        await poll_json(session, f"{url}/v1/gpus", lambda body: "gpus" in body)
    port = int(url.rsplit(":", 1)[1])
    closed = await support.silent_and_trickling_closed(port, "/v1/gpus", 0.2, DEADLINE_S)
    assert closed == (True, True), "(sent nothing, trickled its head) stayed open"
