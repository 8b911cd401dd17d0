"""The OpenAPI document: valid OpenAPI 3.1, every route documented, built from the models
that validate (so it cannot drift from what the API accepts)."""

from __future__ import annotations

from typing import Any

import openapi_spec_validator
import pytest
from aiohttp import web

from controller import app as controller_app
from controller import openapi, serving
from controller.settings import ControllerSettings
from shared import spec as specs


@pytest.fixture(scope="module")
def app() -> web.Application:
    """The controller's real app (routes only: nothing starts until it runs)."""
    return controller_app.make_app(ControllerSettings())


@pytest.fixture(scope="module")
def doc(app: web.Application) -> dict[str, Any]:
    return openapi.document(app)


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
    ]


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    """openapi-spec-validator accepts it as OpenAPI 3.1 (it raises otherwise)."""
    openapi_spec_validator.validate(doc)
    expected = "3.1.0"
    assert expected == doc["openapi"]


def test_every_route_is_documented(app: web.Application, doc: dict[str, Any]) -> None:
    """Each (method, path) the router serves has an operation in the document, and nothing
    else is documented."""
    served = {(method, path) for method, path, _ in openapi.routes(app)}
    documented = {(method, path) for method, path, _ in _operations(doc)}
    assert served == documented
    assert len(served) >= 24


def test_an_undocumented_route_fails_the_document() -> None:
    """A handler without `serving.operation` cannot slip in: building the document raises."""

    async def secret(request: web.Request) -> web.StreamResponse:
        return web.Response()

    app = web.Application()
    app.router.add_get("/v1/secret", secret)
    with pytest.raises(ValueError, match="GET /v1/secret"):
        openapi.document(app)


def test_operation_ids_are_unique(doc: dict[str, Any]) -> None:
    """A client generator names its methods by operationId."""
    ids = [op["operationId"] for _, _, op in _operations(doc)]
    assert sorted(set(ids)) == sorted(ids)


def test_every_operation_declares_its_security_and_errors(doc: dict[str, Any]) -> None:
    """Authenticated calls use the bearer scheme and declare 401, 403, 429 and 503; public
    ones declare `security: []`; every error answer is the one envelope (but /readyz's 503,
    which is its own answer)."""
    problems = []
    for method, path, op in _operations(doc):
        where = f"{method} {path}"
        responses = op["responses"]
        if op["security"] == [{"bearer": []}]:
            missing = {"401", "403", "429", "503"} - set(responses)
            if missing:
                problems.append(f"{where}: no {sorted(missing)}")
        elif op["security"] != []:
            problems.append(f"{where}: security {op['security']}")
        for status, answer in responses.items():
            readiness = (path, status) == ("/readyz", "503")  # its own answer: not ready
            ref = str(answer.get("$ref", ""))
            if int(status) >= 400 and not readiness and not ref.startswith("#/components/"):
                problems.append(f"{where}: {status} is not the error envelope")
    expected: list[str] = []
    assert expected == problems
    envelope = doc["components"]["responses"]["Invalid"]["content"]["application/json"]
    expected_schema = {"$ref": "#/components/schemas/ErrorBody"}
    assert expected_schema == envelope["schema"]


def test_bodies_and_parameters_say_what_is_validated(doc: dict[str, Any]) -> None:
    """Each body and parameter the API reads is in the document, with the bounds and the
    full-match patterns that validate it (ECMA-262 anchors)."""
    paths = doc["paths"]
    submit = paths["/v1/runs"]["post"]
    run_params = {p["name"]: p for p in paths["/v1/runs/{namespace}/{name}"]["get"]["parameters"]}
    logs = {p["name"]: p for p in paths["/v1/runs/{namespace}/{name}/logs"]["get"]["parameters"]}
    bodies = {
        (method, path): op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for method, path, op in _operations(doc)
        if "requestBody" in op
    }
    actual = {
        "submit media types": sorted(submit["requestBody"]["content"]),
        "submit query": sorted(p["name"] for p in submit["parameters"]),
        "name pattern": run_params["name"]["schema"]["pattern"],
        "namespace max": run_params["namespace"]["schema"]["maxLength"],
        "worker bounds": (logs["worker"]["schema"]["minimum"], logs["worker"]["schema"]["maximum"]),
        "bodies": bodies,
    }
    expected = {
        "submit media types": ["application/json", "application/yaml"],
        "submit query": ["Idempotency-Key", "dryRun", "namespace"],
        "name pattern": "^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$",
        "namespace max": 63,
        "worker bounds": (0, specs.MAX_WORKERS),
        "bodies": {
            ("POST", "/v1/runs"): "#/components/schemas/TauSpec",
            ("POST", "/v1/heartbeats"): "#/components/schemas/Heartbeat",
            ("POST", "/v1/peer/heartbeats"): "#/components/schemas/PeerBatch",
            ("POST", "/v1/runs/{namespace}/{name}/checkpoints"): "#/components/schemas/ReportBody",
            ("POST", "/v1/runs/{namespace}/{name}/resume"): "#/components/schemas/ResumeRequest",
            ("POST", "/v1/runs/{namespace}/{name}/rerun"): "#/components/schemas/RerunRequest",
            ("POST", "/v1/runs/{namespace}/{name}/results"): "#/components/schemas/ResultReport",
            ("POST", "/v1/nodes/{name}/quarantine"): "#/components/schemas/QuarantineRequest",
            ("DELETE", "/v1/nodes/{name}/quarantine"): "#/components/schemas/QuarantineRequest",
            ("PUT", "/v1/fleet/mode"): "#/components/schemas/ModeRequest",
            ("POST", "/v1/fleet/breaker/reset"): "#/components/schemas/BreakerResetRequest",
        },
    }
    assert expected == actual


def test_the_agent_calls_are_documented_with_their_parameters_and_gateway_errors(
    doc: dict[str, Any],
) -> None:
    """The calls the controller makes to a node's agent for on-call are in the document: their
    parameters with the patterns that validate them, 502 and 504 among their answers, and
    the breaker reset's body optional (older clients send none)."""
    paths = doc["paths"]
    diag = paths["/v1/nodes/{name}/diag"]["post"]
    release = paths["/v1/nodes/{name}/agent/release"]["post"]
    gpus = paths["/v1/nodes/{name}/gpus"]["get"]
    release_params = {p["name"]: p for p in release["parameters"]}
    level = next(p for p in diag["parameters"] if p["name"] == "level")

    def pattern(param: dict[str, Any]) -> str:
        schema = param["schema"]
        return str(next(s["pattern"] for s in schema.get("anyOf", [schema]) if "pattern" in s))

    actual = {
        "diag levels": level["schema"].get("enum"),
        "release parameters": sorted(release_params),
        "gpu pattern": pattern(release_params["gpu"]),
        "gateway errors": [
            sorted({"502", "504"} & set(op["responses"])) for op in (gpus, diag, release)
        ],
        "reset body required": paths["/v1/fleet/breaker/reset"]["post"]["requestBody"].get(
            "required", False
        ),
    }
    expected = {
        "diag levels": [1, 2, 3],
        "release parameters": ["code", "force", "gpu", "name"],
        "gpu pattern": "^(?:[0-9]{1,4}|(?:GPU|MIG)-[0-9A-Za-z-]{1,100})$",
        "gateway errors": [["502", "504"]] * 3,
        "reset body required": False,
    }
    assert expected == actual


def test_the_tau_yaml_schema_is_the_one_the_spec_model_publishes(doc: dict[str, Any]) -> None:
    """The submission body is TauSpec's own schema (the one `/v1/schema/run` serves), not a
    copy: the same properties, the same required fields."""
    component = doc["components"]["schemas"]["TauSpec"]
    published = specs.spec_json_schema()
    actual = (sorted(component["properties"]), sorted(component["required"]))
    expected = (sorted(published["properties"]), sorted(published["required"]))
    assert expected == actual


def test_every_error_status_is_one_the_middleware_can_give() -> None:
    """The statuses documented are those of the error kinds (and the handler timeout)."""
    documented = set(openapi.ERROR_RESPONSES)
    expected = {*serving.STATUS.values(), 504}
    assert expected == documented


def test_a_bound_the_settings_narrow_is_published_as_applied(app: web.Application) -> None:
    """The heartbeat's intervalS range is the controller's setting, not the wire's 3600 s:
    a client (or the fuzzer) reading the document sends what this controller accepts."""
    settings = ControllerSettings(heartbeat_min_interval_s=2, heartbeat_max_interval_s=60)
    interval = openapi.document(app, settings)["components"]["schemas"]["Heartbeat"]
    actual = interval["properties"]["intervalS"]
    expected = (2, 60, False)
    assert expected == (actual["minimum"], actual["maximum"], "exclusiveMinimum" in actual)
