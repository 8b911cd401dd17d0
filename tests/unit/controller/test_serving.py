"""The one error middleware: each error kind has one status, and no handler picks its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yarl
from aiohttp import test_utils, web

from controller import auth, errors, leading, serving
from controller.runs import checkpoints, reconciling, schemas
from shared import spec as specs
from tests import support


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


# ---------------------------------------------------------------------- operations
class _Path(schemas.Params):
    namespace: specs.DnsLabel
    name: specs.ObjectName


class _Query(schemas.Params):
    worker: int = 0


@serving.operation("probe", tag="t", path=_Path, query=_Query,
                   replies={200: serving.Reply("ok")})  # fmt: skip
async def _probe(request: web.Request) -> web.StreamResponse:
    path = serving.path_of(request, _Path)
    query = serving.query_of(request, _Query)
    return web.json_response({"name": path.name, "worker": query.worker})


async def _get(raw_path: str) -> tuple[int, Any]:
    app = web.Application(middlewares=[serving.make_middleware(30.0)])
    app.router.add_get("/v1/runs/{namespace}/{name}", _probe)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        resp = await client.get(yarl.URL(raw_path, encoded=True))
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("raw_path", "field"),
    [
        pytest.param("/v1/runs/default/%2e", "name", id="a run named . (the collection)"),
        pytest.param("/v1/runs/default/%2e%2e", "name", id="a run named .."),
        pytest.param("/v1/runs/default/x%2F..%2Fy", "name", id="an encoded x/../y"),
        pytest.param("/v1/runs/default/a%0A", "name", id="a name with a trailing newline"),
        pytest.param("/v1/runs/Default/a", "namespace", id="an upper-case namespace"),
        pytest.param("/v1/runs/default/a?worker=%C2%B2", "worker", id="a superscript two"),
        pytest.param("/v1/runs/default/a?worker=" + "9" * 5000, "worker",
                     id="a five-thousand-digit number"),
        pytest.param("/v1/runs/default/a?worker=1&worker=2", "worker", id="a parameter twice"),
    ],
)  # fmt: skip
async def test_path_and_query_parameters_are_validated_before_the_handler(
    raw_path: str, field: str
) -> None:
    """A declared operation validates its parameters in full: a bad one is a 400 naming it,
    and the handler never sees it (L1, L10)."""
    status, body = await _get(raw_path)
    expected = (400, field)
    assert expected == (status, body["error"]["field"])


async def test_valid_parameters_reach_the_handler_typed() -> None:
    """The handler reads the validated models."""
    expected = (200, {"name": "my.run", "worker": 3})
    assert expected == await _get("/v1/runs/default/my.run?worker=3&other=ignored")


async def test_a_405_keeps_its_allow_header() -> None:
    """The error middleware turns aiohttp's 405 into the envelope and keeps `Allow`."""
    app = web.Application(middlewares=[serving.make_middleware(30.0)])
    app.router.add_get("/x", _probe)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        resp = await client.patch("/x")
        actual = (resp.status, (await resp.json())["error"]["code"], "GET" in resp.headers["Allow"])
    expected = (405, "MethodNotAllowed", True)
    assert expected == actual


async def test_a_body_cut_short_by_the_client_is_malformed_not_a_500() -> None:
    """A client that stops sending mid-body (its last chunk never comes) is its own fault:
    the handler raises Malformed (400), not an unhandled error logged with a traceback."""
    seen: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            await serving.read_body(request, 1 << 20)
        except errors.Malformed as err:
            seen.append(serving.status_of(err))
            raise
        return web.json_response({})

    app = web.Application(middlewares=[serving.make_middleware(30.0)])
    app.router.add_post("/x", handler)
    # Served as the controller is (an AppRunner), which lets a handler finish after the
    # client hangs up; aiohttp's TestServer would cancel it instead.
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        _, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        await writer.drain()
        writer.write_eof()  # the client is done sending: the body will never be complete

        async def handled() -> None:
            assert seen, "the handler has not seen the short body yet"

        await support.eventually(handled, what="the short body to be refused")
        writer.close()
    finally:
        await runner.cleanup()
    expected = [400]
    assert expected == seen
