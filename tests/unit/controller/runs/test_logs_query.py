"""`GET /v1/runs/{ns}/{name}/logs?sinceSeconds=N`: validated, documented, passed on."""

from __future__ import annotations

from typing import Any

import pytest
import yarl
from aiohttp import test_utils, web

from controller import app as controller_app
from controller import openapi, serving
from controller.runs import schemas
from controller.settings import ControllerSettings


@serving.operation("probeLogs", tag="t", path=schemas.RunPath, query=schemas.LogsQuery,
                   replies={200: serving.Reply("ok")})  # fmt: skip
async def _probe(request: web.Request) -> web.StreamResponse:
    query = serving.query_of(request, schemas.LogsQuery)
    return web.json_response({"sinceSeconds": query.since_seconds})


async def _get(query: str) -> tuple[int, Any]:
    app = web.Application(middlewares=[serving.make_middleware(30.0)])
    app.router.add_get("/v1/runs/{namespace}/{name}/logs", _probe)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        resp = await client.get(yarl.URL("/v1/runs/default/r/logs?" + query, encoded=True))
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param("sinceSeconds=600", (200, 600), id="ten minutes reach the handler"),
        pytest.param("", (200, None), id="none means the whole log"),
        pytest.param("sinceSeconds=0", (400, "sinceSeconds"), id="zero is refused by name"),
        pytest.param("sinceSeconds=-5", (400, "sinceSeconds"), id="a negative is refused"),
        pytest.param("sinceSeconds=10m", (400, "sinceSeconds"),
                     id="a duration with a unit is refused (seconds only)"),
        pytest.param(f"sinceSeconds={schemas.MAX_SINCE_S + 1}", (400, "sinceSeconds"),
                     id="more than a year is refused"),
    ],
)  # fmt: skip
async def test_since_seconds_is_validated_before_the_handler(
    query: str, expected: tuple[int, Any]
) -> None:
    """A bad value is a 400 naming the field; a good one reaches the handler typed."""
    status, body = await _get(query)
    actual = (status, body["sinceSeconds"] if status == 200 else body["error"]["field"])
    assert expected == actual


def test_the_document_gives_since_seconds_its_bounds() -> None:
    """The OpenAPI document lists sinceSeconds on the logs call with the bounds it checks."""
    doc = openapi.document(controller_app.make_app(ControllerSettings()))
    params = doc["paths"]["/v1/runs/{namespace}/{name}/logs"]["get"]["parameters"]
    since = next(p for p in params if p["name"] == "sinceSeconds")
    schema = next(s for s in since["schema"].get("anyOf", [since["schema"]]) if "minimum" in s)
    expected = (1, schemas.MAX_SINCE_S)
    assert expected == (schema["minimum"], schema["maximum"])


class _Content:
    async def iter_any(self) -> Any:
        yield b"line\n"


class _Resp:
    status = 200
    content = _Content()

    def release(self) -> None:
        """Nothing held."""


class _CoreV1:
    """Stands in for kubernetes_asyncio's CoreV1Api: keeps the arguments of the log call."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}

    async def read_namespaced_pod_log(self, pod: str, namespace: str, **kwargs: Any) -> _Resp:
        self.kwargs = kwargs
        return _Resp()


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        pytest.param(600, 600, id="since_seconds goes to the API server by its client name"),
        pytest.param(None, "absent", id="none sends none"),
    ],
)  # fmt: skip
async def test_the_run_store_asks_the_api_server_for_the_lines_since(
    since: int | None, expected: Any
) -> None:
    """The adapter passes `since_seconds` as kubernetes_asyncio names it (its `sinceSeconds`)."""
    from controller.kube import runs as kube_runs

    store = object.__new__(kube_runs.RunStore)
    core = _CoreV1()
    store._logs = core
    chunks = [c async for c in store.stream_log("ns", "pod", "main", follow=False,
                                                 tail_lines=None, since_seconds=since)]  # fmt: skip
    assert (expected, [b"line\n"]) == (core.kwargs.get("since_seconds", "absent"), chunks)
