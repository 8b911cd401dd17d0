"""Who is calling, and may they: TokenReview and SubjectAccessReview, cached.

Identity comes from the API server (TokenReview); each call is authorised against the
Kubernetes verb it corresponds to (SubjectAccessReview). Both answers are cached so that a
busy endpoint (heartbeats from thousands of agents) does not become API-server load: a token
is reviewed once and reused until shortly before it expires (at most `token_ttl_s`), an access
answer is reused for `access_ttl_s`. Identical reviews in flight at the same moment are made
once. Refusals are cached briefly too, so a flood of bad tokens costs one review each few
seconds rather than one per request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import enum
import hashlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Annotated, Any, Protocol, TypeVar, cast

import pydantic

from controller import errors, marks

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NEGATIVE_TTL_S = 5.0
EXPIRY_MARGIN_S = 30.0
MAX_ENTRIES = 50_000

T = TypeVar("T")


class ReviewUnavailable(errors.Unavailable):
    """The API server could not be asked; the caller may retry."""

    default_code = "ReviewUnavailable"


@dataclasses.dataclass(frozen=True)
class Identity:
    """An authenticated caller, as TokenReview described it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def extra_value(self, key: str) -> str | None:
        """Return the single value of an extra field, None when absent or ambiguous."""
        for k, values in self.extra:
            if k == key and len(values) == 1:
                return values[0]
        return None

    @property
    def node_name(self) -> str | None:
        """The node of the pod the token is bound to (pod-bound ServiceAccount tokens)."""
        return self.extra_value(NODE_NAME_EXTRA)

    @property
    def pod_uid(self) -> str | None:
        """The UID of the pod the token is bound to (pod-bound ServiceAccount tokens)."""
        return self.extra_value(POD_UID_EXTRA)

    @property
    def pod_name(self) -> str | None:
        """The name of the pod the token is bound to (pod-bound ServiceAccount tokens)."""
        return self.extra_value(POD_NAME_EXTRA)


@dataclasses.dataclass(frozen=True)
class Access:
    """A Kubernetes verb on a resource: what a SubjectAccessReview asks."""

    verb: str
    resource: str
    group: str = ""
    namespace: str | None = None
    subresource: str = ""
    name: str = ""


class Reviewer(Protocol):
    """The API server's review endpoints (the seam tests and adapters implement)."""

    async def review_token(self, token: str, audiences: tuple[str, ...]) -> Identity | None:
        """Return the identity behind a token, None when the API server rejects it."""
        ...

    async def review_access(self, identity: Identity, access: Access) -> bool:
        """Return whether the identity may perform the access."""
        ...


def _unverified_claims(token: str) -> dict[str, Any]:
    """A JWT's payload, read without verifying it ({} for anything that is not a JWT): only
    to bound caching and to choose which audience TokenReview is asked about."""
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > 16_384:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def token_expiry(token: str) -> float | None:
    """Read `exp` from a JWT's payload without verifying it (only to bound caching)."""
    exp = _unverified_claims(token).get("exp")
    return float(exp) if isinstance(exp, int | float) else None


CACHE_JITTER = 0.2
"""Review answers are kept 80–100 % of their TTL, at random, so re-reviews spread out."""


class TTLCache:
    """A small expiring map with single-flight loading: concurrent `get`s of one key share
    one `load`; a `load` that raises is not kept.

    `jitter` shortens each entry's TTL by a random share of up to that fraction (never
    lengthens it): a fleet whose agents were all reviewed within seconds (a new leader)
    would otherwise be reviewed again all at once, every TTL, a storm the API write budget
    then queues heartbeats behind."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        jitter: float = 0.0,
        rnd: Callable[[], float] = random.random,
    ) -> None:
        self._clock = clock
        self._jitter = jitter
        self._rnd = rnd
        self._data: dict[Hashable, tuple[float, object]] = {}
        self._inflight: dict[Hashable, asyncio.Future[object]] = {}
        self.hits = 0
        self.misses = 0

    def fresh(self, key: Hashable) -> bool:
        """Whether `key` has an answer that has not expired."""
        hit = self._data.get(key)
        return hit is not None and hit[0] > self._clock()

    def drop(self, key: Hashable) -> None:
        """Forget `key`'s answer: the next `get` loads it again."""
        self._data.pop(key, None)

    async def get(
        self,
        key: Hashable,
        load: Callable[[], Awaitable[T]],
        ttl: Callable[[T], float],
    ) -> T:
        now = self._clock()
        hit = self._data.get(key)
        if hit is not None and hit[0] > now:
            self.hits += 1
            return cast("T", hit[1])
        pending = self._inflight.get(key)
        if pending is not None:
            self.hits += 1
            return cast("T", await asyncio.shield(pending))
        self.misses += 1
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            value = await load()
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            self._inflight.pop(key, None)
        fut.set_result(value)
        if len(self._data) >= MAX_ENTRIES:
            self._evict(now)
        self._data[key] = (now + ttl(value) * (1.0 - self._jitter * self._rnd()), value)
        return value

    def _evict(self, now: float) -> None:
        for k in [k for k, (exp, _) in self._data.items() if exp <= now]:
            del self._data[k]
        while len(self._data) >= MAX_ENTRIES:
            self._data.pop(next(iter(self._data)))


def token_audiences(token: str) -> tuple[str, ...]:
    """The `aud` claim of a JWT, read without verifying it: it only chooses which audience
    to ask TokenReview about, which then verifies the token for that audience alone. () for
    anything that is not a JWT with an audience."""
    aud = _unverified_claims(token).get("aud")
    if isinstance(aud, str):
        return (aud,)
    if isinstance(aud, list) and all(isinstance(a, str) for a in aud):
        return tuple(aud)
    return ()


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header; errors.Unauthenticated otherwise."""
    if not header or not header.startswith("Bearer "):
        msg = "missing bearer token: send `Authorization: Bearer <token>`"
        raise errors.Unauthenticated(msg)
    token = header.removeprefix("Bearer ").strip()
    if not token:
        msg = "empty bearer token"
        raise errors.Unauthenticated(msg)
    return token


class ReviewKind(enum.StrEnum):
    """Which review a call needed (the `kind` label of `taugrid_auth_reviews`)."""

    TOKEN = "token"  # noqa: S105  (a label, not a secret)
    ACCESS = "access"


class ReviewOutcome(enum.StrEnum):
    """How a review ended (the `outcome` label of `taugrid_auth_reviews`)."""

    ALLOWED = "allowed"
    """The token was accepted, or the access allowed."""
    DENIED = "denied"
    """The token was rejected, or the access refused."""
    SHED = "shed"
    """Not asked: a cap or a rate said no first (429, 503 `ReviewBusy`)."""
    FAILED = "failed"
    """The API server could not be asked in time."""


def outcome_of(err: Exception) -> ReviewOutcome:
    """The outcome of a review that raised `err`: refused by our own limits, or failed."""
    if isinstance(err, errors.TooManyRequests):
        return ReviewOutcome.SHED
    if isinstance(err, errors.Unavailable) and err.code == "ReviewBusy":
        return ReviewOutcome.SHED
    return ReviewOutcome.FAILED


Observe = Callable[[ReviewKind, bool, ReviewOutcome], None]
"""Told each review's kind, whether the cache answered (or a review in flight did), and its
outcome (metrics)."""


class AccessCap:
    """SubjectAccessReviews in flight, at most `per_identity` for one username and `total`
    on this replica: past either, the call is refused 429 at once, naming the limit, rather
    than queueing reviews for the API server (pure: no I/O, no clock)."""

    def __init__(self, *, per_identity: int, total: int) -> None:
        self.per_identity = per_identity
        self.total = total
        self.held: collections.Counter[str] = collections.Counter()

    @property
    def in_flight(self) -> int:
        """Reviews taken and not yet released, over every username."""
        return self.held.total()

    def take(self, username: str) -> None:
        """Count one review for `username`; TooManyRequests when a limit is reached."""
        if self.held[username] >= self.per_identity:
            msg = (
                f"{username} already has {self.held[username]} access reviews in flight, the"
                f" most one caller may have at once (access_reviews_per_identity"
                f" {self.per_identity}); retry shortly"
            )
            raise errors.TooManyRequests(msg, code="TooMany")
        if self.in_flight >= self.total:
            msg = (
                f"this replica has {self.total} access reviews in flight, its most"
                f" (access_reviews_in_flight_max {self.total}); retry shortly"
            )
            raise errors.TooManyRequests(msg, code="TooMany")
        self.held[username] += 1

    def release(self, username: str) -> None:
        """One review of `username` answered (or failed)."""
        self.held[username] -= 1
        if self.held[username] <= 0:
            del self.held[username]


class Authenticator:
    """Authenticate bearer tokens and authorise calls, with caches in front of the reviews."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        token_ttl_s: float = 300.0,
        bound_token_ttl_s: float = 60.0,
        access_ttl_s: float = 60.0,
        max_reviews: int = 64,
        access_per_identity: int = 8,
        access_max: int = 64,
        pod_alive: Callable[[str], bool] = lambda _uid: False,
        clock: Callable[[], float] = time.time,
        observe: Observe | None = None,
    ) -> None:
        self._reviewer = reviewer
        self._observe = observe
        self.pod_alive = pod_alive
        """Whether a pod (by UID) exists and its deletion will reach `forget_pod`: a token
        bound to such a pod is kept as long as any token, others `bound_token_ttl_s`."""
        self._by_pod: dict[str, set[Hashable]] = {}
        self.max_reviews = max_reviews
        """TokenReviews in flight at once; a token that needs one past it is answered 503."""
        self.reviewing = 0
        self.access_reviews = AccessCap(per_identity=access_per_identity, total=access_max)
        """SubjectAccessReviews in flight, per username and in all (security review 3,
        finding 1): an answer not cached costs a review, and a caller naming a new
        namespace each request would otherwise make as many at once as it sends."""
        self._token_ttl_s = token_ttl_s
        self._bound_token_ttl_s = bound_token_ttl_s
        self._access_ttl_s = access_ttl_s
        self._clock = clock
        self.tokens = TTLCache(clock, jitter=CACHE_JITTER)
        self.access = TTLCache(clock, jitter=CACHE_JITTER)

    async def authenticate(
        self,
        header: str | None,
        audiences: tuple[str, ...] = (),
        *,
        before_review: Callable[[], None] | None = None,
    ) -> Identity:
        """Return the identity behind an `Authorization: Bearer` header, or raise.

        `before_review` runs only when the API server must be asked (the token is in no cache
        and no review of it is in flight), so it can refuse that cost (a rate limit per
        source address) without slowing down a known token.
        """
        token = bearer_token(header)
        key = (hashlib.sha256(token.encode()).hexdigest(), audiences)

        def ttl(identity: Identity | None) -> float:
            # Only on a cache miss: decoding the token's expiry on every hit would cost a
            # base64 and a JSON decode per heartbeat.
            if identity is None:
                return NEGATIVE_TTL_S
            limit = self._token_ttl_s
            if identity.extra_value(POD_NAME_EXTRA) is not None and not self.pod_alive(
                identity.pod_uid or ""
            ):
                # A pod-bound token dies with its pod; the API server knows at once. Where we
                # watch the pod (the install namespace's), its deletion drops the answer at
                # once (`forget_pod`); elsewhere we learn at the next review, so those are
                # asked again sooner (review L7). Judged when the answer is stored: a pod
                # deleted while its token was being reviewed is not alive any more.
                limit = min(limit, self._bound_token_ttl_s)
            expiry = token_expiry(token)
            if expiry is not None:
                limit = min(limit, expiry - EXPIRY_MARGIN_S - self._clock())
            return max(limit, 0.0)

        asked: list[bool] = []

        async def review() -> Identity | None:
            asked.append(True)
            if before_review is not None:
                before_review()
            if self.reviewing >= self.max_reviews:
                # Shed rather than queue: reviews that pile up past what the API server
                # answers in time fail, are not cached, and are asked again by the same
                # callers, a loop that only grows (123,230 reviews for 10,000 tokens once).
                msg = "too many token reviews in flight on this replica; retry shortly"
                raise errors.Unavailable(msg, code="ReviewBusy")
            self.reviewing += 1
            try:
                return await self._reviewer.review_token(token, audiences)
            finally:
                self.reviewing -= 1

        try:
            identity = await self.tokens.get(key, review, ttl)
        except Exception as err:
            self._seen(ReviewKind.TOKEN, not asked, outcome_of(err))
            raise
        verdict = ReviewOutcome.DENIED if identity is None else ReviewOutcome.ALLOWED
        self._seen(ReviewKind.TOKEN, not asked, verdict)
        if identity is not None and identity.pod_uid and self.pod_alive(identity.pod_uid):
            self._remember(identity.pod_uid, key)  # only watched pods are ever forgotten
        if identity is None:
            msg = "token rejected by the API server (expired, revoked or wrong audience)"
            raise errors.Unauthenticated(msg)
        return identity

    def _seen(self, kind: ReviewKind, cached: bool, outcome: ReviewOutcome) -> None:
        if self._observe is not None:
            self._observe(kind, cached, outcome)

    def _remember(self, uid: str, key: Hashable) -> None:
        keys = self._by_pod.setdefault(uid, set())
        if key not in keys:  # a new token of the pod (the kubelet rotates them): prune
            keys.difference_update([k for k in keys if not self.tokens.fresh(k)])
            keys.add(key)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone: forget every answer about a token bound to it, so the next use
        of such a token is reviewed again (and refused: it died with its pod)."""
        for key in self._by_pod.pop(uid, ()):
            self.tokens.drop(key)

    async def authorize(self, identity: Identity, access: Access) -> None:
        """Raise Forbidden unless Kubernetes RBAC allows the access; TooManyRequests when the
        answer is not cached and the caller (or this replica) has its most reviews in flight."""

        asked: list[bool] = []

        async def review() -> bool:
            asked.append(True)
            self.access_reviews.take(identity.username)
            try:
                return await self._reviewer.review_access(identity, access)
            finally:
                self.access_reviews.release(identity.username)

        try:
            allowed = await self.access.get(
                access_key(identity, access),
                review,
                lambda ok: self._access_ttl_s if ok else min(self._access_ttl_s, NEGATIVE_TTL_S),
            )
        except Exception as err:
            self._seen(ReviewKind.ACCESS, not asked, outcome_of(err))
            raise
        verdict = ReviewOutcome.ALLOWED if allowed else ReviewOutcome.DENIED
        self._seen(ReviewKind.ACCESS, not asked, verdict)
        if not allowed:
            where = f" in namespace {access.namespace}" if access.namespace else ""
            res = (
                f"{access.resource}/{access.subresource}" if access.subresource else access.resource
            )
            group = f".{access.group}" if access.group else ""
            msg = f"{identity.username} may not {access.verb} {res}{group}{where}"
            raise errors.Forbidden(msg)


def access_key(identity: Identity, access: Access) -> Hashable:
    """What an access answer is cached under: everything the SubjectAccessReview is asked
    (user, uid, groups, extra; verb, group, resource, subresource, namespace, name), so one
    answer is never reused for a question that differs in any of them."""
    return (identity, access)


def agent_username(namespace: str, service_account: str) -> str:
    """The TokenReview username of a ServiceAccount's token (an agent's, a replica's)."""
    return f"system:serviceaccount:{namespace}:{service_account}"


# ---------------------------------------------------------------------- speaking for a caller
RUN_CALLER = "system:taugrid:run-token"
"""The username the controller gives a run's pod once its `taugrid-run` token is reviewed and
mapped to the run (`controller.runs.identity`); a follower forwards that, not the token.
Under `system:`, which the API server's OIDC and ServiceAccount authenticators never hand out
to anyone else, so no reviewed token can pass for it."""


def run_caller(namespace: str, name: str, attempt: int) -> Identity:
    """The caller behind a pod of attempt `attempt` of run `namespace/name` (its projected
    `taugrid-run` token, mapped to the run through the pod it is bound to)."""
    extra = {marks.RUN_CALLER_EXTRA: (f"{namespace}/{name}",),
             marks.RUN_ATTEMPT_EXTRA: (str(attempt),)}  # fmt: skip
    return Identity(RUN_CALLER, extra=tuple(sorted(extra.items())))


def run_of(identity: Identity) -> tuple[str, str, int] | None:
    """(namespace, run, attempt) of a `run_caller` identity; None for anyone else."""
    if identity.username != RUN_CALLER:
        return None
    run = identity.extra_value(marks.RUN_CALLER_EXTRA) or ""
    attempt = identity.extra_value(marks.RUN_ATTEMPT_EXTRA) or ""
    namespace, _, name = run.partition("/")
    if not (namespace and name and attempt.isdigit()):
        return None
    return namespace, name, int(attempt)


class _CallerClaim(pydantic.BaseModel):
    """The wire form of an Identity a follower reviewed, in the `X-TauGrid-Caller` header."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")
    username: str = pydantic.Field(min_length=1, max_length=1024)
    uid: str = pydantic.Field(default="", max_length=256)
    groups: tuple[Annotated[str, pydantic.StringConstraints(max_length=1024)], ...] = (
        pydantic.Field(default=(), max_length=256)
    )
    extra: dict[str, tuple[str, ...]] = pydantic.Field(default_factory=dict, max_length=64)


MAX_CALLER_HEADER = 6000
"""Bytes of an encoded caller; below aiohttp's 8190-byte limit on one header field."""


def encode_caller(identity: Identity) -> str:
    """The identity as one header value: base64url of compact JSON."""
    doc = {"username": identity.username, "uid": identity.uid, "groups": list(identity.groups),
           "extra": {k: list(v) for k, v in identity.extra}}  # fmt: skip
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_caller(value: str) -> Identity:
    """Read a header written by `encode_caller`; `Malformed` for anything else."""
    if len(value) > MAX_CALLER_HEADER:
        msg = f"the caller header exceeds {MAX_CALLER_HEADER} bytes"
        raise errors.Malformed(msg, field="X-TauGrid-Caller")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        claim = _CallerClaim.model_validate_json(raw)
    except (ValueError, pydantic.ValidationError) as err:
        msg = "the caller header is not a caller this controller wrote"
        raise errors.Malformed(msg, field="X-TauGrid-Caller") from err
    extra = tuple(sorted(claim.extra.items()))
    return Identity(claim.username, claim.uid, claim.groups, extra)


def check_heartbeat_identity(identity: Identity, expected_user: str) -> str:
    """Refuse, before its body is read, a heartbeat from anyone but the agent ServiceAccount
    with a token bound to a pod on a node; return that node."""
    if identity.username != expected_user:
        msg = f"{identity.username} is not the agent ServiceAccount ({expected_user})"
        raise errors.Forbidden(msg)
    bound = identity.node_name
    if bound is None:
        msg = "the token is not bound to a pod on a node; use a projected ServiceAccount token"
        raise errors.Forbidden(msg)
    return bound


def check_heartbeat_sender(identity: Identity, expected_user: str, node_name: str) -> None:
    """Accept a heartbeat only from the agent ServiceAccount bound to a pod on that node."""
    bound = check_heartbeat_identity(identity, expected_user)
    if bound != node_name:
        msg = f"a token bound to node {bound} may not report for node {node_name}"
        raise errors.Forbidden(msg)
