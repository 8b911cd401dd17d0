"""HTTP plumbing every domain's API shares; it imports no domain.

What one replica needs to answer a request: who is calling (`identity`, `on_call`), bodies
read within a limit, forwarding to the leader (under this replica's own peer token, for a
caller reviewed here: a caller's credential never leaves the replica that received it), the
one error middleware with the one table from error kinds to HTTP statuses, and how this
replica is reached (its URL, the client context it verifies the leader with).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
import json
import os
import random
import secrets
import socket
import ssl
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import msgspec
import pydantic
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import MultiMapping

from controller import auth, errors, leading, limits
from controller import metrics as metrics_mod
from controller.settings import ControllerSettings

log = structlog.get_logger()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=pydantic.BaseModel)

JSON = "application/json"

STATUS: dict[type[errors.ControllerError], int] = {
    errors.Invalid: 422,
    errors.InvalidParameter: 400,
    errors.Malformed: 400,
    errors.TooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooManyRequests: 429,
    errors.Unavailable: 503,
    errors.BadGateway: 502,
    errors.GatewayTimeout: 504,
}
"""The one mapping from error kinds to HTTP statuses; a subclass takes its nearest kind's."""

STREAMING_ATTRIBUTE = "taugrid_streaming"
"""Set on a handler that streams (it outlives the handler timeout by design)."""


@dataclasses.dataclass
class Limits:
    """What one caller may make this replica do at once (429 beyond; review H2, M10)."""

    log_streams: limits.Slots
    expensive_reads: limits.Slots
    reviews: limits.Buckets
    reports: limits.Buckets
    """Results and checkpoint reports per run and caller: each costs a TauRun read."""
    spec_parses: limits.Slots
    """Submissions whose body (up to 1 MiB of YAML or JSON) is being parsed, per caller and
    per replica: a parse holds a worker thread and its memory."""

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> Limits:
        return cls(
            log_streams=limits.Slots("log streams", per_key=settings.log_streams_per_identity,
                                     total=settings.log_streams_max),
            expensive_reads=limits.Slots("run lists or queue reads",
                                         per_key=settings.expensive_reads_per_identity),
            reviews=limits.Buckets(rate_per_s=settings.review_rate_per_source,
                                   burst=settings.review_burst_per_source),
            reports=limits.Buckets(rate_per_s=settings.reports_per_s_per_run,
                                   burst=settings.reports_burst_per_run),
            spec_parses=limits.Slots("submissions being parsed",
                                     per_key=settings.spec_parses_per_identity,
                                     total=settings.spec_parses_max),
        )  # fmt: skip


@dataclasses.dataclass
class ServingState:
    """What every handler of this replica shares: built at startup by the composition root."""

    settings: ControllerSettings
    metrics: metrics_mod.ControllerMetrics
    authn: auth.Authenticator
    elector: leading.Elector
    http: aiohttp.ClientSession
    url: str
    peer_token: Callable[[], str] = lambda: ""
    """This replica's peer token (audience `peer_audience`), '' when it has none."""
    ready: bool = False
    readiness: list[Callable[[], bool]] = dataclasses.field(default_factory=list)
    """More conditions of readiness (the node cache is synced), each asked on `/readyz`."""
    limits: Limits = dataclasses.field(init=False)
    """The per-caller limits, from the settings."""

    def __post_init__(self) -> None:
        self.limits = Limits.from_settings(self.settings)

    def is_ready(self) -> bool:
        """Ready to serve: started, not shutting down, every readiness condition met."""
        return self.ready and all(check() for check in self.readiness)


SERVING = web.AppKey("serving", ServingState)


def serving_of(request: web.Request) -> ServingState:
    """The serving state of the app handling `request`; Unavailable while it starts."""
    if SERVING not in request.app:
        raise errors.Unavailable("the controller is starting; retry shortly", code="Starting")
    return request.app[SERVING]


# ---------------------------------------------------------------------- requests
async def read_body(request: web.Request, limit: int) -> bytes:
    """Read the body, refusing anything above `limit` before reading it all."""
    if request.content_length is not None and request.content_length > limit:
        msg = f"body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        raise errors.TooLarge(msg)
    chunks = []
    size = 0
    try:
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                msg = f"body exceeds the limit of {limit} bytes"
                raise errors.TooLarge(msg)
            chunks.append(chunk)
    except (ConnectionResetError, aiohttp.ClientPayloadError) as err:
        # The client hung up (or broke its framing) mid-body: its fault, not a 500 with a
        # traceback per disconnect.
        msg = f"the body ended after {size} bytes, before it was complete"
        raise errors.Malformed(msg, field="body") from err
    return b"".join(chunks)


async def identity(request: web.Request, audiences: tuple[str, ...] | None = None) -> auth.Identity:
    """Who calls: the identity TokenReview gives the bearer token, reviewed for `audiences`
    (None: the audiences a person's token must carry, `user_audiences`); or, from a follower
    with a replica's peer token, the caller that follower reviewed."""
    st = serving_of(request)
    if CALLER_HEADER in request.headers:
        return await _speaking_for(request, st)
    wanted = st.settings.user_audiences if audiences is None else audiences
    return await st.authn.authenticate(
        request.headers.get("Authorization"), wanted, before_review=unseen_credential(request)
    )


def unseen_credential(request: web.Request) -> Callable[[], None]:
    """What to call before asking the API server about a credential not seen before: one
    token of the source address's bucket, 429 when it is empty. So an unauthenticated flood
    costs the API server at most the bucket's rate, per address (review M10)."""
    st = serving_of(request)
    source = request.remote or ""
    return lambda: st.limits.reviews.take(source, "unknown tokens from this address")


async def allow(request: web.Request, who: auth.Identity, access: auth.Access) -> None:
    """Raise Forbidden unless RBAC lets `who` make `access`."""
    await serving_of(request).authn.authorize(who, access)


async def on_call(request: web.Request, verb: str) -> auth.Identity:
    """Authenticate an on-call caller and authorise the matching verb on nodes."""
    who = await identity(request)
    await allow(request, who, auth.Access(verb=verb, resource="nodes"))
    return who


def json_response(body: Any, *, status: int = 200) -> web.Response:
    """A JSON answer; values JSON cannot hold (datetimes) are written as strings."""
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, default=str))


def streaming(handler: Handler) -> Handler:
    """Mark a handler that streams, so the middleware leaves it without a timeout."""
    setattr(handler, STREAMING_ATTRIBUTE, True)
    return handler


# ---------------------------------------------------------------------- operations
class Auth(enum.StrEnum):
    """Who may call an operation, as the OpenAPI document declares it."""

    NONE = "none"
    """Anyone: health, metrics, the page, the client, the documents."""
    BEARER = "bearer"
    """A bearer token: a Kubernetes token reviewed by TokenReview and authorised by
    SubjectAccessReview, or (checkpoint calls) the run's own token."""


@dataclasses.dataclass(frozen=True)
class Body:
    """The request body an operation reads."""

    model: type[pydantic.BaseModel] | type[msgspec.Struct]
    """The model that validates it (a struct: a heartbeat); the document's schema is its."""
    media_types: tuple[str, ...] = (JSON,)
    required: bool = True
    checks_media_type: bool = False
    """The handler refuses other types with 415."""
    limits: Callable[[ControllerSettings], Mapping[str, Mapping[str, Any]]] | None = None
    """Bounds of top-level fields that the controller's settings narrow (a heartbeat's
    `intervalS`): JSON Schema keywords by wire name, published in the document."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """One success answer of an operation."""

    description: str
    model: type[pydantic.BaseModel] | None = None
    """The body's model (its serialisation schema is published); None with `schema`."""
    any_of: tuple[type[pydantic.BaseModel], ...] = ()
    """Several models, one of which the body is (a replay, or a dry run)."""
    media_type: str = JSON
    schema: Mapping[str, Any] | None = None
    """The body's schema when no model describes it (text, a document of its own)."""
    headers: tuple[str, ...] = ()
    """Response headers worth declaring (`X-TauGrid-Pod`)."""


@dataclasses.dataclass(frozen=True)
class Operation:
    """What the OpenAPI document says of one route; attached to its handler by `operation`."""

    operation_id: str
    tag: str
    summary: str
    description: str
    auth: Auth
    path: type[pydantic.BaseModel] | None
    query: type[pydantic.BaseModel] | None
    body: Body | None
    replies: Mapping[int, Reply]
    errors: tuple[int, ...]
    """Statuses the handler itself raises (404, 409); those every call of its shape can get
    are added by `error_statuses`."""
    streaming: bool

    def error_statuses(self) -> tuple[int, ...]:
        """Every error status the call can answer: its own, and those of its shape (an
        authenticated call can get 401, 403 and 429; any call 503 while starting or when the
        leader is unreachable; a non-streaming one 504 past the handler timeout)."""
        found = set(self.errors)
        if self.auth is Auth.BEARER:
            found |= {401, 403, 429, 503}
        if self.path is not None or self.query is not None:
            found.add(400)
        if self.body is not None:
            found |= {400, 413, 422}
            if self.body.checks_media_type:
                found.add(415)
        if not self.streaming and self.auth is Auth.BEARER:
            found.add(504)
        return tuple(sorted(found - set(self.replies)))


OPERATION_ATTRIBUTE = "taugrid_operation"
PATH_PARAMETERS = web.RequestKey("path_parameters", pydantic.BaseModel)
QUERY_PARAMETERS = web.RequestKey("query_parameters", pydantic.BaseModel)


def operation(
    operation_id: str,
    *,
    tag: str,
    replies: Mapping[int, Reply],
    auth: Auth = Auth.BEARER,
    path: type[pydantic.BaseModel] | None = None,
    query: type[pydantic.BaseModel] | None = None,
    body: Body | None = None,
    errors: tuple[int, ...] = (),
) -> Callable[[Handler], Handler]:
    """Declare what a handler takes and answers (the OpenAPI document is built from it), and
    validate its path and query parameters before it runs: a bad one is a 400 naming it, so
    no handler can forget a check. The summary is the docstring's first line."""

    def decorate(handler: Handler) -> Handler:
        doc = inspect.cleandoc(handler.__doc__ or "")
        summary, _, description = doc.partition("\n\n")
        op = Operation(
            operation_id=operation_id, tag=tag, summary=" ".join(summary.split()),
            description=description.strip(), auth=auth, path=path, query=query, body=body,
            replies=dict(replies), errors=errors,
            streaming=bool(getattr(handler, STREAMING_ATTRIBUTE, False)),
        )  # fmt: skip

        @functools.wraps(handler)
        async def wrapped(request: web.Request) -> web.StreamResponse:
            if path is not None:
                request[PATH_PARAMETERS] = parameters(path, request.match_info)
            if query is not None:
                request[QUERY_PARAMETERS] = parameters(query, request.query)
            return await handler(request)

        setattr(wrapped, OPERATION_ATTRIBUTE, op)
        return wrapped

    return decorate


def operation_of(handler: object) -> Operation | None:
    """The operation a route's handler declares, None for an undocumented one."""
    op = getattr(handler, OPERATION_ATTRIBUTE, None)
    return op if isinstance(op, Operation) else None


def parameters(model: type[M], values: Mapping[str, str] | MultiMapping[str]) -> M:
    """Validate path or query parameters with `model`; a value given twice (where the model
    wants one), or one the model refuses, is InvalidParameter naming it. A list-valued field
    takes the parameter repeated (`run=a&run=b`). Unknown query parameters are ignored."""
    lists = _list_fields(model)
    data: dict[str, str | list[str]] = {}
    for key in values:
        given = values.getall(key) if isinstance(values, MultiMapping) else [values[key]]
        if key in lists:
            data[key] = list(given)
            continue
        if len(given) > 1:
            msg = f"{key[:100]} is given {len(given)} times; give it once"
            raise errors.InvalidParameter(msg, field=key[:100])
        data[key] = given[0]
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise errors.validation_error(err, errors.InvalidParameter) from err


def _list_fields(model: type[pydantic.BaseModel]) -> frozenset[str]:
    """The wire names of a parameter model's list-valued fields."""
    return frozenset(
        field.alias or name
        for name, field in model.model_fields.items()
        if typing.get_origin(field.annotation) in (list, tuple)
    )


def path_of(request: web.Request, model: type[M]) -> M:
    """The validated path parameters of this request (the route's `operation` declares
    `model`)."""
    return _stored(request, PATH_PARAMETERS, model)


def query_of(request: web.Request, model: type[M]) -> M:
    """The validated query parameters of this request (the route's `operation` declares
    `model`)."""
    return _stored(request, QUERY_PARAMETERS, model)


def _stored(request: web.Request, key: web.RequestKey[pydantic.BaseModel], model: type[M]) -> M:
    value = request.get(key)
    if not isinstance(value, model):
        msg = f"{request.path}: its operation declares no {model.__name__} (documented != read)"
        raise TypeError(msg)
    return value


async def json_document(
    request: web.Request, model: type[pydantic.BaseModel], *, optional: bool = False
) -> Any:
    """Read and parse (`shared.jsonsafe`'s limits) the JSON body the route's operation
    documents as `model`, for a domain that validates it itself; Malformed or TooLarge
    otherwise. An `optional` body may be empty (it reads as `{}`)."""
    op = operation_of(request.match_info.route.handler)
    if op is None or op.body is None or op.body.model is not model:
        msg = f"{request.path}: its operation documents no {model.__name__} body"
        raise TypeError(msg)
    raw = await read_body(request, serving_of(request).settings.max_body_bytes)
    if not raw.strip():
        if not optional:
            raise errors.Malformed("the body is empty; send a JSON object", field="body")
        raw = b"{}"
    return errors.read_json(raw)


async def json_body(request: web.Request, model: type[M], *, optional: bool = False) -> M:
    """Read, parse and validate the JSON body the route's operation documents; Malformed,
    TooLarge or Invalid naming the field otherwise (see `json_document`)."""
    data = await json_document(request, model, optional=optional)
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise errors.validation_error(err, root="body") from err


class ErrorDetail(pydantic.BaseModel):
    """What went wrong: a stable code clients branch on, a message, the field at fault."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")
    code: str
    message: str
    field: str
    """The path of the field, parameter or header at fault ("" when none is)."""


class ErrorProblem(pydantic.BaseModel):
    """One of several problems (every field of a body at fault, at once)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")
    field: str
    message: str


class ErrorBody(pydantic.BaseModel):
    """The one error envelope (DESIGN.md section 4): `{"error": {code, message, field}}`,
    with `problems` when a body has several."""

    model_config = pydantic.ConfigDict(frozen=True, extra="allow")
    error: ErrorDetail
    problems: list[ErrorProblem] = []


# ---------------------------------------------------------------------- the leader
CALLER_HEADER = "X-TauGrid-Caller"
"""The caller a follower reviewed, sent with the follower's own peer token (never the
caller's credential); the leader honours it only from the replicas' ServiceAccount."""
PRIVILEGED_GROUP = "system:masters"
"""The group whose members no authoriser refuses; never relayed by a peer."""
FORWARDED_BY = web.RequestKey("forwarded_by", auth.Identity)
"""On the leader: the peer (a follower) that forwarded this request, once verified."""


async def peer(request: web.Request) -> auth.Identity:
    """The replica calling, once its peer token proves it is one: valid for
    `peer_audience` (else 401) and the replicas' ServiceAccount's (else 403 PeerRefused).
    Nothing of the request but its `Authorization` header is read before."""
    st = serving_of(request)
    settings = st.settings
    who = await st.authn.authenticate(
        request.headers.get("Authorization"), (settings.peer_audience,),
        before_review=unseen_credential(request),
    )  # fmt: skip
    expected = auth.agent_username(settings.namespace, settings.controller_service_account)
    if who.username != expected:
        msg = f"{who.username} is not a controller replica ({expected})"
        raise errors.Forbidden(msg, code="PeerRefused", field="Authorization")
    # Bound to a pod of the install namespace that exists now, as a replica's projected token
    # is: a token minted by hand for the ServiceAccount (unbound) or outliving its pod is not
    # a replica's (review 3, finding 8).
    if who.extra_value(auth.POD_NAME_EXTRA) is None or not st.authn.pod_alive(who.pod_uid or ""):
        msg = "the peer token is not bound to a running controller pod of this install"
        raise errors.Forbidden(msg, code="PeerRefused", field="Authorization")
    return who


async def _speaking_for(request: web.Request, st: ServingState) -> auth.Identity:
    """The caller a follower speaks for, once its peer token proves it is a replica.

    The peer token must be valid for `peer_audience` and belong to the replicas'
    ServiceAccount; anything else is 403 PeerRefused, whatever the caller header says, so no
    one but a replica can make the leader act for somebody else.
    """
    try:
        who = await peer(request)
    except errors.Unauthenticated as err:
        msg = f"a request speaking for a caller needs a replica's peer token: {err.message}"
        raise errors.Forbidden(msg, code="PeerRefused", field="Authorization") from err
    except errors.Forbidden as err:
        msg = f"{err.message}; it speaks for nobody"
        raise errors.Forbidden(msg, code="PeerRefused", field="Authorization") from err
    request[FORWARDED_BY] = who
    caller = auth.decode_caller(request.headers[CALLER_HEADER])
    if PRIVILEGED_GROUP in caller.groups:
        # No caller of the HTTP API is ever in it (a token of it is a cluster credential that
        # never reaches us): a peer that says so speaks for somebody it did not authenticate.
        msg = f"a peer may not speak for a member of {PRIVILEGED_GROUP}"
        raise errors.Forbidden(msg, code="PeerRefused", field=CALLER_HEADER)
    return caller


# ---------------------------------------------------------------------- errors
def status_of(err: errors.ControllerError) -> int:
    """The HTTP status of an error: its own kind's, else its nearest ancestor's."""
    for kind in type(err).__mro__:
        if kind in STATUS:
            return STATUS[kind]
    return 500


def error_response(
    status: int, code: str, message: str, field: str = "", **extra: Any
) -> web.Response:
    """The JSON error body: `{"error": {"code", "message", "field"}}` (DESIGN.md section 4)."""
    body = {"error": {"code": code, "message": message, "field": field}, **extra}
    return web.json_response(body, status=status)


def make_middleware(timeout_s: float) -> Middleware:
    """Return the error middleware: request id, timeout, error kinds to HTTP statuses."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Not uuid4: it reads os.urandom, a system call per request, measurable on the
        # heartbeat path. A request id needs to be unique enough to grep, not secret.
        request_id = request.headers.get("X-Request-Id") or f"{random.getrandbits(64):016x}"
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            route = request.match_info.route.handler
            if getattr(route, STREAMING_ATTRIBUTE, False):
                resp = await handler(request)
            else:
                async with asyncio.timeout(timeout_s):
                    resp = await handler(request)
        except errors.ControllerError as err:
            resp = error_response(status_of(err), err.code, err.message, err.field, **err.extra)
            if isinstance(err, errors.Unauthenticated):
                resp.headers["WWW-Authenticate"] = 'Bearer realm="taugrid"'
            if isinstance(err, errors.TooManyRequests):
                resp.headers["Retry-After"] = "1"
        except TimeoutError:
            resp = error_response(504, "Timeout", f"the request took longer than {timeout_s:.0f}s")
        except web.HTTPException as err:
            if err.status < 400:
                raise
            resp = error_response(err.status, err.reason.replace(" ", ""), err.text or err.reason)
            if "Allow" in err.headers:
                resp.headers["Allow"] = err.headers["Allow"]
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error", path=request.path, method=request.method)
            resp = error_response(500, "Internal", f"internal error; request id {request_id}")
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
        resp.headers["X-Request-Id"] = request_id
        return resp

    return middleware


# ---------------------------------------------------------------------- this replica
def make_identity(settings: ControllerSettings) -> str:
    """This replica's Lease identity."""
    return settings.identity or f"{socket.gethostname()}-{secrets.token_hex(3)}"


def peer_ssl_context(settings: ControllerSettings) -> ssl.SSLContext:
    """Build the client context for calls to the leader: `tls_ca_file` alone, never the
    system store, so only a certificate the chart's CA issued (for the leader-only
    Service's name) passes; any publicly trusted certificate would otherwise do."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies peer and host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.tls_ca_file:
        context.load_verify_locations(cafile=settings.tls_ca_file)
    return context


def pod_dns_name(pod_ip: str, domain: str) -> str:
    """Return the name DNS serves for `pod_ip` as an endpoint of the headless Service whose
    domain is `domain` (`10.1.2.3` -> `10-1-2-3.<domain>`). A Deployment's pods get no
    `<pod name>.<service>` record (that takes `spec.hostname`, one value for all replicas),
    so this is the per-pod name a wildcard certificate for `*.<domain>` can cover."""
    return f"{pod_ip.replace('.', '-').replace(':', '-')}.{domain}"


def default_url(settings: ControllerSettings) -> str:
    """Where this replica is reached when `advertise_url` is empty (DESIGN.md section 6)."""
    scheme = "https" if settings.tls_cert_file else "http"
    pod_ip = os.environ.get("POD_IP", "")
    host = pod_ip or settings.host
    if host in ("0.0.0.0", "", "::"):  # noqa: S104
        host = "127.0.0.1"
    if pod_ip and settings.advertise_domain:
        host = pod_dns_name(pod_ip, settings.advertise_domain)
    return f"{scheme}://{host}:{settings.port}"
