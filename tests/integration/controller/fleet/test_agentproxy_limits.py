"""The controller's calls to an agent keep their limits: a timeout, a size cap, no redirect.

An agent stand-in on loopback answers slowly, too much, or with a redirect; the client must
answer 504 and 502 saying why, and never follow the redirect.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import test_utils, web

from controller import errors, serving
from controller.fleet import agentcalls, agentproxy

CAP = 64 * 1024


@pytest_asyncio.fixture
async def agent() -> AsyncIterator[tuple[test_utils.TestServer, list[str], dict[str, str]]]:
    """A stand-in agent: /v1/gpus behaves as the test sets `mode["gpus"]`; the paths it was
    called at are in `seen`."""
    seen: list[str] = []
    mode: dict[str, str] = {"gpus": "ok"}

    async def gpus(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        what = mode["gpus"]
        if what == "slow":
            await asyncio.sleep(30)
        if what == "big":
            return web.json_response({"pad": "x" * (2 * CAP)})
        if what == "big-chunked":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(4):
                await resp.write(b" " * CAP)
            return resp
        if what == "redirect":
            raise web.HTTPFound("/v1/release")
        return web.json_response({"gpus": []})

    async def release(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        return web.json_response({"released": []})

    app = web.Application()
    app.router.add_get("/v1/gpus", gpus)
    app.router.add_route("*", "/v1/release", release)
    server = test_utils.TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server, seen, mode
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        pytest.param("slow", (504, "AgentTimeout"), id="an agent that does not answer in time"),
        pytest.param("big", (502, "AgentAnswerTooLarge"), id="an answer over the cap"),
        pytest.param("big-chunked", (502, "AgentAnswerTooLarge"),
                     id="a chunked answer over the cap, refused while read"),
        pytest.param("redirect", (502, "AgentError"), id="a redirect is not followed"),
    ],
)  # fmt: skip
async def test_the_call_to_an_agent_keeps_its_limits(
    agent: tuple[test_utils.TestServer, list[str], dict[str, str]],
    mode: str,
    expected: tuple[int, str],
) -> None:
    """Each misbehaviour is a 502 or 504 naming what happened; a redirect is never followed."""
    server, seen, modes = agent
    modes["gpus"] = mode
    async with aiohttp.ClientSession() as http:
        proxy = agentproxy.AgentClient(http, lambda: "t", scheme="http", port=server.port or 0,
                                       timeout_s=0.5, max_bytes=CAP)  # fmt: skip
        with pytest.raises(errors.ControllerError) as caught:
            await proxy.call("gpu-1", "127.0.0.1", agentcalls.gpus())
    actual = (serving.status_of(caught.value), caught.value.code)
    assert (expected, ["/v1/gpus"]) == (actual, seen)


async def test_a_plain_answer_is_relayed(
    agent: tuple[test_utils.TestServer, list[str], dict[str, str]],
) -> None:
    """Within the limits, the agent's JSON is handed on with its status."""
    server, _, _ = agent
    async with aiohttp.ClientSession() as http:
        proxy = agentproxy.AgentClient(http, lambda: "t", scheme="http", port=server.port or 0,
                                       timeout_s=5.0, max_bytes=CAP)  # fmt: skip
        relayed = await proxy.call("gpu-1", "127.0.0.1", agentcalls.gpus())
    expected = (200, b'{"gpus": []}')
    assert expected == (relayed.status, relayed.payload)
