"""Who may run diagnostics and release faults: the seam the HTTP layer calls.

The Kubernetes implementation (TokenReview + SubjectAccessReview) lives in `agent.k8sauth`, the
only module that imports kubernetes_asyncio.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class AuthError(Exception):
    """The caller could not be authenticated (401) or is not allowed (403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller."""

    user: str
    groups: tuple[str, ...] = ()


class Authenticator(Protocol):
    """Authenticate a bearer token and authorise one action on this node."""

    async def authorize(self, token: str, *, verb: str, node: str) -> Identity:
        """Return the caller, or raise `AuthError` (401 unauthenticated, 403 forbidden)."""
        ...


class AllowAll:
    """For local development only (`TAUGRID_AGENT_AUTH_ENABLED=false`)."""

    async def authorize(self, token: str, *, verb: str, node: str) -> Identity:
        """Accept everyone as `anonymous`."""
        del token, verb, node
        return Identity(user="anonymous")


def bearer(header: str | None) -> str:
    """Extract the token from an `Authorization: Bearer` header; raise 401 when absent."""
    if not header or not header.lower().startswith("bearer "):
        msg = "missing 'Authorization: Bearer <token>' header"
        raise AuthError(401, msg)
    token = header[7:].strip()
    if not token:
        msg = "empty bearer token"
        raise AuthError(401, msg)
    return token
