"""The one error middleware: each error kind has one status, and no handler picks its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import test_utils, web

from controller import auth, errors, leading, serving
from controller.runs import checkpoints, reconciling


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        pytest.param(errors.Invalid("x"), 422, id="a bad value is 422"),
        pytest.param(errors.InvalidParameter("x"), 400, id="a bad query or path parameter is 400"),
        pytest.param(errors.Malformed("x"), 400, id="an unreadable body is 400"),
        pytest.param(errors.TooLarge("x"), 413, id="a body over its limit is 413"),
        pytest.param(errors.UnsupportedMediaType("x"), 415, id="a body of the wrong type is 415"),
        pytest.param(errors.Unauthenticated("x"), 401, id="no or a bad token is 401"),
        pytest.param(errors.Forbidden("x"), 403, id="RBAC saying no is 403"),
        pytest.param(errors.NotFound("x"), 404, id="something missing is 404"),
        pytest.param(errors.Conflict("x"), 409, id="a state that does not allow it is 409"),
        pytest.param(errors.TooManyRequests("x"), 429, id="over a limit is 429"),
        pytest.param(errors.Unavailable("x"), 503, id="retry later is 503"),
        pytest.param(leading.NotLeaderError("x"), 503, id="a lost lease is Unavailable"),
        pytest.param(auth.ReviewUnavailable("x"), 503, id="an unreachable API server is 503"),
        pytest.param(reconciling.RunNotFoundError("ns", "r"), 404, id="a missing run is 404"),
        pytest.param(checkpoints.FencedError("StaleAttempt", "x"), 409, id="a stale report is 409"),
        pytest.param(checkpoints.ReportError("step", "x"), 422, id="a bad report is 422"),
    ],
)
def test_each_kind_maps_to_one_status(err: errors.ControllerError, expected: int) -> None:
    """A domain error takes the status of its kind (its nearest ancestor in the table)."""
    assert expected == serving.status_of(err)


async def _call(handler: serving.Handler, timeout_s: float = 30.0) -> tuple[int, Any, str]:
    app = web.Application(middlewares=[serving.make_middleware(timeout_s)])
    app.router.add_get("/x", handler)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        resp = await client.get("/x")
        return resp.status, await resp.json(), resp.headers.get("WWW-Authenticate", "")


async def test_a_raised_kind_becomes_the_error_envelope_naming_field_and_code() -> None:
    """The body is {"error": {code, message, field}} plus the error's extra members."""

    async def handler(request: web.Request) -> web.StreamResponse:
        raise errors.Invalid("bad spec", field="image", problems=[{"field": "image"}])

    expected = (
        422,
        {
            "error": {"code": "Invalid", "message": "bad spec", "field": "image"},
            "problems": [{"field": "image"}],
        },
        "",
    )
    assert expected == await _call(handler)


async def test_unauthenticated_asks_for_a_bearer_token() -> None:
    """A 401 says which scheme to use (RFC 6750)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        raise errors.Unauthenticated("missing bearer token", field="Authorization")

    status, body, challenge = await _call(handler)
    assert (
        status, body["error"]["code"], body["error"]["field"], challenge
    ) == (401, "Unauthenticated", "Authorization", 'Bearer realm="taugrid"')  # fmt: skip


async def test_a_streaming_handler_outlives_the_handler_timeout() -> None:
    """Only handlers marked as streaming are exempt from the timeout; others answer 504."""
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.wait_for(gate.wait(), 0.5)
        except TimeoutError:
            return web.json_response({"waited": True})
        return web.json_response({"waited": False})

    async def slow_stream(request: web.Request) -> web.StreamResponse:
        return await slow(request)

    plain = await _call(slow, timeout_s=0.05)
    streamed = await _call(serving.streaming(slow_stream), timeout_s=0.05)
    assert (
        (plain[0], plain[1]["error"]["code"]), (streamed[0], streamed[1])
    ) == ((504, "Timeout"), (200, {"waited": True}))  # fmt: skip
