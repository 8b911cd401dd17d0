"""Who may run diagnostics and release faults: the seam the HTTP layer calls.

The Kubernetes implementation (TokenReview + SubjectAccessReview) lives in `agent.k8sauth`, the
only module that imports kubernetes_asyncio.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Protocol

from agent import errors

_MAX_SOURCES = 4096
"""Sources a `RateLimiter` remembers; past this the fullest buckets are forgotten first."""
_MAX_CACHED = 4096
"""Answers a `Gate` keeps; past this the oldest go first, so a flood cannot grow memory."""


class AuthError(errors.AgentError):
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

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> Identity:
        """Return the caller, or raise `AuthError` (401 unauthenticated, 403 forbidden).

        The right asked is `verb` on `nodes/<node>` (`nodes/<subresource>` when one is named).
        """
        ...


class AllowAll:
    """For local development only (`TAUGRID_AGENT_AUTH_ENABLED=false`)."""

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> Identity:
        """Accept everyone as `anonymous`."""
        del token, verb, node, subresource
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


class RateLimiter:
    """A token bucket per source address: `rate_per_s` refills, `burst` deep.

    Pure: the caller passes `now` (monotonic seconds). Used before any TokenReview is sent, so
    an unauthenticated flood at one node is answered 429 here and never reaches the API server
    (security review 3, finding 13).
    """

    def __init__(self, *, rate_per_s: float, burst: int) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, source: str, now: float) -> bool:
        """Take one token from `source`'s bucket; False when it is empty."""
        tokens, at = self._buckets.pop(source, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        allowed = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > _MAX_SOURCES:
            self._buckets.popitem(last=False)  # the least recently seen source
        return allowed


@dataclasses.dataclass(frozen=True, slots=True)
class _Answer:
    expires: float
    result: Identity | AuthError


class Gate:
    """Cache of review answers by token hash, and a per-source limit on the reviews sent.

    A cached answer (allowed or refused) is served for `ttl_s` without asking again; only a
    token not seen recently costs a review, and those are rate-limited per source address, so
    the number of TokenReviews a node sends is bounded by its sources' buckets, not by how fast
    callers send tokens.
    """

    def __init__(self, authenticator: Authenticator, limiter: RateLimiter, *, ttl_s: float) -> None:
        self._authenticator = authenticator
        self._limiter = limiter
        self._ttl = ttl_s
        self._cache: collections.OrderedDict[tuple[str, str, str, str], _Answer] = (
            collections.OrderedDict()
        )

    async def authorize(
        self, token: str, *, verb: str, node: str, source: str, now: float, subresource: str = ""
    ) -> Identity:
        """Return the caller, or raise `AuthError` (401, 403, or 429 when `source` is over)."""
        key = (hashlib.sha256(token.encode()).hexdigest(), verb, node, subresource)
        hit = self._cache.get(key)
        if hit is not None and hit.expires > now:
            if isinstance(hit.result, AuthError):
                raise hit.result
            return hit.result
        if not self._limiter.allow(source, now):
            msg = "too many authentication attempts from this address; retry in a second"
            raise AuthError(429, msg)
        try:
            identity = await self._authenticator.authorize(
                token, verb=verb, node=node, subresource=subresource
            )
        except AuthError as err:
            self._remember(key, _Answer(now + self._ttl, err))
            raise
        self._remember(key, _Answer(now + self._ttl, identity))
        return identity

    def _remember(self, key: tuple[str, str, str, str], answer: _Answer) -> None:
        self._cache.pop(key, None)
        self._cache[key] = answer
        while len(self._cache) > _MAX_CACHED:
            self._cache.popitem(last=False)
