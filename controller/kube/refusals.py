"""The API server's refusals of our writes, as the controller's error kinds: a 409 is
`ConflictError`, a 404 `NotFoundError`, a 400/422 `RejectedError` naming the field, an
admission denial `errors.AdmissionRefused` (`refusal`)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client

from controller import errors

MAX_MESSAGE_CHARS = 600
"""How much of the API server's message a refusal carries."""


class ConflictError(errors.Conflict):
    """The object already exists (HTTP 409 from the API server)."""


class NotFoundError(errors.NotFound):
    """The object, or its namespace, does not exist (HTTP 404 from the API server)."""


class RejectedError(errors.Invalid):
    """The API server refused an object we asked it to create (HTTP 400 or 422): `field` is
    the object's field at fault (`spec.template.spec.containers[0].env[0].name`), as the API
    server's Status names it, and `kind` the object's kind."""

    default_code = "RejectedByAPIServer"

    def __init__(self, kind: str, message: str, field: str) -> None:
        super().__init__(message, field=field)
        self.kind = kind


def api_status(err: client.ApiException) -> dict[str, Any]:
    """The API server's Status object in an error, {} when the body is not one."""
    try:
        parsed = json.loads(str(err.reason or ""))
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def refusal(err: client.ApiException, kind: str) -> errors.ControllerError:
    """The error kind for an API server's refusal of a create: 400/422 RejectedError naming
    the field its Status names, 403 Forbidden (the controller may not create there), other
    statuses Unavailable (retry later). The message keeps the API server's words."""
    text = str(err.reason or "")
    status = api_status(err)
    message = str(status.get("message") or text or err.status)[:MAX_MESSAGE_CHARS]
    causes = (status.get("details") or {}).get("causes") or []
    field = next((str(c.get("field") or "") for c in causes if isinstance(c, dict)), "")
    if err.status in (400, 422):
        return RejectedError(kind, f"the API server refused the {kind}: {message}", field)
    if err.status == 403 and ("denied request" in message or "denied the request" in message):
        # An admission policy or webhook said no to this object, as the API server words it
        # (`ValidatingAdmissionPolicy '…' with binding '…' denied request: …`, `admission
        # webhook "…" denied the request: …`), not RBAC: asking again will not change its
        # answer, so the run ends saying why (a Secret its namespace does not list).
        msg = f"the cluster's admission refused the {kind}: {message}"
        return errors.AdmissionRefused(msg)
    if err.status == 403:
        msg = f"the controller may not create the {kind} there: {message}"
        return errors.Forbidden(msg, code="ControllerForbidden")
    msg = f"the API server did not create the {kind} ({err.status}): {message}"
    return errors.Unavailable(msg, code="APIServerError")
