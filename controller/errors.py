"""Domain errors and the one middleware that maps them to HTTP answers.

Every error body is `{"error": {"code", "message", "field"}}` (DESIGN.md section 4). Nothing a
client sends can make a handler answer 500: validation problems are 4xx naming the field, and
an unexpected exception is logged once with the request id and answered 500 without details.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from controller import auth, leading

log = structlog.get_logger()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error with an HTTP status, a stable code and the field it concerns."""

    def __init__(self, status: int, code: str, message: str, field: str = "", **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.extra = extra


def error_response(
    status: int, code: str, message: str, field: str = "", **extra: Any
) -> web.Response:
    """Build the JSON error body every handler uses."""
    body = {"error": {"code": code, "message": message, "field": field}, **extra}
    return web.json_response(body, status=status)


def validation_error(err: pydantic.ValidationError, status: int = 422) -> ApiError:
    """Turn a pydantic error into a 4xx naming the first field (all problems listed)."""
    problems = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"])
        problems.append({"field": loc, "message": e["msg"]})
    first = problems[0] if problems else {"field": "", "message": "invalid"}
    msg = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    return ApiError(status, "Invalid", msg, first["field"], problems=problems)


def read_json(raw: bytes) -> Any:
    """Parse a JSON body, answering 400 with the position of the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"body is not UTF-8 (byte {err.start})"
        raise ApiError(400, "Malformed", msg) from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        msg = f"body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        raise ApiError(400, "Malformed", msg) from err


def make_middleware(timeout_s: float) -> Middleware:
    """Return the error middleware: request id, timeout, domain errors to HTTP."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Not uuid4: it reads os.urandom, a system call per request, measurable on the
        # heartbeat path. A request id needs to be unique enough to grep, not secret.
        request_id = request.headers.get("X-Request-Id") or f"{random.getrandbits(64):016x}"
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            streaming = request.path.endswith("/logs")
            if streaming:
                resp = await handler(request)
            else:
                async with asyncio.timeout(timeout_s):
                    resp = await handler(request)
        except ApiError as err:
            resp = error_response(err.status, err.code, err.message, err.field, **err.extra)
        except auth.AuthError as err:
            code = type(err).__name__
            resp = error_response(err.status, code, str(err))
            if err.status == 401:
                resp.headers["WWW-Authenticate"] = 'Bearer realm="taugrid"'
        except leading.NotLeaderError as err:
            resp = error_response(503, "NotLeader", str(err))
        except TimeoutError:
            resp = error_response(504, "Timeout", f"the request took longer than {timeout_s:.0f}s")
        except web.HTTPException as err:
            if err.status < 400:
                raise
            resp = error_response(err.status, err.reason.replace(" ", ""), err.text or err.reason)
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
