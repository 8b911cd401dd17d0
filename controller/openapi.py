"""The controller's OpenAPI 3.1 document, generated from its routes and the models that
validate them, so it cannot drift from what the API accepts (DESIGN.md section 4).

Every route's handler declares an operation (`controller.serving.operation`): its path and
query models, its body model, its answers' models and the errors it raises. This module
turns those into the document served at `/openapi.json`:

- parameters from the path and query models (names as on the wire, full-match patterns
  published ECMA-style, `^(?:…)$`; see `shared.patterns`), `Idempotency-Key` on submissions;
- request bodies from the body models (tau.yaml's own model for `POST /v1/runs`, in YAML and
  JSON), their schemas in `components.schemas` (validation mode);
- answers from the reply models (serialisation mode), and every error status the
  operation can give (`Operation.error_statuses`) as the one error envelope;
- the bearer scheme (a Kubernetes token, or a run's own token for its checkpoints), and
  `security: []` on the public routes.

A route without an operation makes `document` raise: a unit test builds the document of the
real app, so an undocumented route fails the build, not a client.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from typing import Any

import pydantic
from aiohttp import web
from pydantic import json_schema

from controller import serving
from controller.settings import ControllerSettings

REF = "#/components/schemas/{model}"
SECURITY_SCHEME = "bearer"
ERROR_RESPONSES: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "A path or query parameter, or the body, cannot be read."),
    401: ("Unauthenticated", "No bearer token, or one the API server does not accept."),
    403: ("Forbidden", "The caller's RBAC (or its token's binding) does not allow the call."),
    404: ("NotFound", "What the call names does not exist (or is not the caller's to see)."),
    409: ("Conflict", "The object's state does not allow the call."),
    413: ("TooLarge", "The body exceeds its limit."),
    415: ("UnsupportedMediaType", "The body's Content-Type is not one the call reads."),
    422: ("Invalid", "A value is not acceptable; `error.field` names it."),
    429: ("TooManyRequests", "The caller is over a limit; retry later."),
    502: ("BadGateway", "The node's agent could not be reached, or answered nothing usable."),
    503: ("Unavailable", "Starting, not the leader, or the API server is unreachable; retry."),
    504: ("Timeout", "The call, or the node's agent it called, took longer than its timeout."),
}
TAGS = (
    {"name": "runs", "description": "Researchers: submit, follow and resume runs."},
    {"name": "fleet", "description": "Agents' heartbeats and the on-call calls."},
    {"name": "service", "description": "Health, metrics, the web page, the client, documents."},
)
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A retried submission with the first one's key answers 200 with that run.",
    "schema": {"type": "string", "maxLength": 256},
}
PARAMETER_HEADERS = {"createRun": (IDEMPOTENCY_KEY,)}


def version() -> str:
    """The package version the document carries."""
    try:
        return importlib.metadata.version("taugrid")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
        return "0.0.0"


def routes(app: web.Application) -> Iterable[tuple[str, str, serving.Operation | None]]:
    """Every (method, path template, operation) of the app; HEAD (aiohttp's twin of each
    GET) left out."""
    for resource in app.router.resources():
        info = resource.get_info()
        path = str(info.get("path") or info.get("formatter") or "")
        for route in resource:
            if route.method == "HEAD":
                continue
            yield route.method, path, serving.operation_of(route.handler)


def _schemas(
    wanted: Iterable[tuple[type[Any], json_schema.JsonSchemaMode]],
) -> tuple[dict[tuple[Any, str], Any], dict[str, Any]]:
    """Each (model, mode)'s reference, and the components.schemas they refer to."""
    # TypeAdapter, not models_json_schema: a body may be a msgspec struct (a heartbeat),
    # which publishes its own schema (shared.heartbeat.json_schema).
    keys, top = pydantic.TypeAdapter.json_schemas(
        [
            ((model, mode), mode, pydantic.TypeAdapter(model))
            for model, mode in dict.fromkeys(wanted)
        ],
        by_alias=True,
        ref_template=REF,
    )
    return {key: value for (key, _mode), value in keys.items()}, dict(top.get("$defs") or {})


def document(app: web.Application, settings: ControllerSettings | None = None) -> dict[str, Any]:
    """Build the OpenAPI 3.1 document of `app`'s routes; ValueError on an undocumented one.
    With `settings`, bounds they narrow (`Body.limits`) are published as this controller
    applies them."""
    found = list(routes(app))
    missing = [f"{method} {path}" for method, path, op in found if op is None]
    if missing:
        msg = f"routes without an operation (serving.operation): {', '.join(missing)}"
        raise ValueError(msg)
    documented = [(method, path, op) for method, path, op in found if op is not None]
    wanted: list[tuple[type[Any], json_schema.JsonSchemaMode]] = [
        (serving.ErrorBody, "serialization")
    ]
    for _, _, op in documented:
        body = op.body.model if op.body is not None else None
        wanted += [(m, "validation") for m in (op.path, op.query, body) if m is not None]
        for reply in op.replies.values():
            wanted += [(m, "serialization") for m in (reply.model, *reply.any_of) if m is not None]
    keys, components = _schemas(wanted)

    def ref(model: type[Any], mode: str) -> dict[str, Any]:
        return dict(keys[(model, mode)])

    for _, _, op in documented:
        if settings is not None and op.body is not None and op.body.limits is not None:
            name = ref(op.body.model, "validation")["$ref"].rsplit("/", 1)[-1]
            properties = components[name]["properties"]
            for field, limits in op.body.limits(settings).items():
                bounds = {k: v for k, v in properties[field].items()
                          if k not in {"exclusiveMinimum", "exclusiveMaximum"}}  # fmt: skip
                properties[field] = {**bounds, **limits}
    paths: dict[str, dict[str, Any]] = {}
    for method, path, op in documented:
        paths.setdefault(path, {})[method.lower()] = _operation(op, ref, components)
    error = ref(serving.ErrorBody, "serialization")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "TauGrid controller",
            "version": version(),
            "description": (
                "GPU health, quarantine, health-gated admission and resumable runs. Errors are"
                ' always `{"error": {"code", "message", "field"}}`.'
            ),
        },
        "tags": list(TAGS),
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                name: {
                    "description": description,
                    "content": {
                        serving.JSON: {"schema": error},
                        **(_PROTOCOL_ERROR if status == 400 else {}),
                    },
                    **(_AUTHENTICATE if status == 401 else {}),
                }
                for status, (name, description) in ERROR_RESPONSES.items()
            },
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "A Kubernetes token the API server accepts (TokenReview), authorised"
                        " per call by SubjectAccessReview; agents send their projected token"
                        " (audience `taugrid`); a run's pods may send the run's own token"
                        " (`TAU_TOKEN`) for its checkpoints."
                    ),
                }
            },
        },
    }


_PROTOCOL_ERROR = {
    "text/plain": {
        "schema": {
            "type": "string",
            "description": (
                "A request the HTTP parser cannot read (a request line over 8 KiB, a header"
                " with a NUL) is refused by aiohttp before any handler, in plain text."
            ),
        }
    }
}
_AUTHENTICATE = {
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer realm."}}
}


def _operation(op: serving.Operation, ref: Any, components: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "tags": [op.tag],
        "summary": op.summary,
        "security": [{SECURITY_SCHEME: []}] if op.auth is serving.Auth.BEARER else [],
    }
    if op.description:
        out["description"] = op.description
    parameters = [
        *_parameters(op.path, "path", ref, components),
        *_parameters(op.query, "query", ref, components),
        *PARAMETER_HEADERS.get(op.operation_id, ()),
    ]
    if parameters:
        out["parameters"] = parameters
    if op.body is not None:
        schema = ref(op.body.model, "validation")
        out["requestBody"] = {
            "required": op.body.required,
            "content": {media: {"schema": schema} for media in op.body.media_types},
        }
    responses = {str(status): _reply(reply, ref) for status, reply in sorted(op.replies.items())}
    for status in op.error_statuses():
        responses[str(status)] = {"$ref": f"#/components/responses/{ERROR_RESPONSES[status][0]}"}
    out["responses"] = responses
    return out


def _reply(reply: serving.Reply, ref: Any) -> dict[str, Any]:
    if reply.model is not None:
        schema: dict[str, Any] = ref(reply.model, "serialization")
    elif reply.any_of:
        schema = {"anyOf": [ref(m, "serialization") for m in reply.any_of]}
    else:
        schema = dict(reply.schema or {})
    out: dict[str, Any] = {
        "description": reply.description,
        "content": {reply.media_type: {"schema": schema}},
    }
    if reply.headers:
        out["headers"] = {name: {"schema": {"type": "string"}} for name in reply.headers}
    return out


def _parameters(
    model: type[pydantic.BaseModel] | None, where: str, ref: Any, components: dict[str, Any]
) -> list[dict[str, Any]]:
    """One parameter per field of a path or query model, its schema the field's own."""
    if model is None:
        return []
    target = ref(model, "validation")["$ref"].rsplit("/", 1)[-1]
    schema = components[target]
    out = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        prop = dict(schema["properties"][wire])
        description = prop.pop("description", field.description or "")
        prop.pop("title", None)
        if prop.get("default", ...) is None:
            prop.pop("default")
        out.append(
            {
                "name": wire,
                "in": where,
                "required": where == "path" or field.is_required(),
                "description": description,
                "schema": _without_null(prop),
            }
        )
    return out


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter is absent rather than null: drop the null branch pydantic writes for an
    optional field."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list):
        return schema
    kept = [b for b in branches if b != {"type": "null"}]
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    if len(kept) == 1:
        return {**rest, **kept[0]}
    return {**rest, "anyOf": kept}


def add_route(app: web.Application, settings: ControllerSettings) -> None:
    """Serve the document at `/openapi.json` (built once, on the first request)."""
    built: list[dict[str, Any]] = []

    @serving.operation(
        "getOpenAPI", tag="service", auth=serving.Auth.NONE,
        replies={200: serving.Reply("This document.", schema={"type": "object"})},
    )  # fmt: skip
    async def openapi(request: web.Request) -> web.StreamResponse:
        """The OpenAPI 3.1 document of this API."""
        if not built:
            built.append(document(request.app, settings))
        return web.json_response(built[0])

    app.router.add_get("/openapi.json", openapi)
