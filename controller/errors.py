"""The controller's errors: one base, a few kinds, and nothing about HTTP.

Domain code raises a kind (`Invalid`, `NotFound`, `Conflict`, `Forbidden`, `Unavailable`…)
with a message, the field it concerns and, where a client branches on it, a specific code
(`NotResumable`, `StaleAttempt`). One table in the error middleware (`controller.serving`)
maps each kind to its HTTP status; no handler builds an error response or picks a status
itself. `Unavailable` is the retryable kind: the client may try again, the same request
may succeed. Every other kind is permanent for that request.

Internal parse errors of damaged records on the cluster (a Node's history annotation) stay
`ValueError`s: they are reported as problems of the record and never reach a client.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pydantic

from shared import jsonsafe


class ControllerError(Exception):
    """Base of every error the controller raises on purpose."""

    default_code: ClassVar[str] = "Error"
    """The stable code clients read when an instance names none of its own."""

    def __init__(self, message: str, *, field: str = "", code: str = "", **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code or type(self).default_code
        self.extra = extra
        """More members of the error body, such as `problems`."""


class Invalid(ControllerError):  # noqa: N818  (the kinds read as outcomes: Invalid, NotFound)
    """The request is well formed but a value in it is not acceptable."""

    default_code = "Invalid"


class InvalidParameter(Invalid):
    """A path or query parameter is not acceptable."""


class Malformed(Invalid):
    """The body cannot be read at all (not UTF-8, not JSON, empty)."""

    default_code = "Malformed"


class TooLarge(Invalid):
    """The body exceeds its limit."""

    default_code = "TooLarge"


class UnsupportedMediaType(Invalid):
    """The body's Content-Type is not one the call reads."""

    default_code = "UnsupportedMediaType"


class Unauthenticated(ControllerError):  # noqa: N818  (an outcome, named as clients read it)
    """No token, or a token the API server does not accept."""

    default_code = "Unauthenticated"


class Forbidden(ControllerError):  # noqa: N818
    """A known identity without the permission the call needs."""

    default_code = "Forbidden"


class AdmissionRefused(Forbidden):
    """The cluster's admission (a ValidatingAdmissionPolicy, a webhook) denied an object the
    controller asked to create: a permanent answer, not a retry."""

    default_code = "AdmissionRefused"


class NotFound(ControllerError):  # noqa: N818
    """What the call names does not exist (or is not this caller's to see)."""

    default_code = "NotFound"


class Conflict(ControllerError):  # noqa: N818
    """The object's current state does not allow the call."""

    default_code = "Conflict"


class NameTaken(Conflict):
    """An object of a name a run needs exists and is not that run's (security review M4:
    the controller never writes into, nor deletes, somebody else's object)."""

    default_code = "NameTaken"


class TooManyRequests(ControllerError):  # noqa: N818
    """The caller is over a limit; it may retry later."""

    default_code = "TooManyRequests"


class Unavailable(ControllerError):  # noqa: N818
    """This replica cannot serve the call right now (starting, not the leader, the API
    server unreachable); retrying, here or elsewhere, may succeed."""

    default_code = "Unavailable"


class BadGateway(ControllerError):  # noqa: N818
    """A service the controller calls for the caller (a node's agent) could not be reached
    or answered something unusable; the message says which and why."""

    default_code = "BadGateway"


class GatewayTimeout(BadGateway):
    """A service the controller calls for the caller did not answer within its timeout."""

    default_code = "GatewayTimeout"


def validation_error(
    err: pydantic.ValidationError, kind: type[Invalid] = Invalid, *, root: str = ""
) -> Invalid:
    """Turn a pydantic error into `kind` (Invalid; InvalidParameter for a path or a query)
    naming the first field (all problems listed); a problem of the whole value is `root`'s."""
    problems = []
    for e in err.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in e["loc"]) or root
        problems.append({"field": loc, "message": e["msg"]})
    first = problems[0] if problems else {"field": "", "message": "invalid"}
    msg = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    return kind(msg, field=first["field"], problems=problems)


def read_json(raw: bytes) -> Any:
    """Parse a JSON body under `shared.jsonsafe`'s limits (integer length, depth, no NaN);
    `Malformed` naming the position (or, for a duplicate key, the field) of the problem."""
    try:
        return jsonsafe.load(raw)
    except jsonsafe.JsonError as err:
        msg = f"the body is not JSON we read: {err}"
        raise Malformed(msg, field=err.path) from err
