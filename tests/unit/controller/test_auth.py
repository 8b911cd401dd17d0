"""Authentication and authorisation: reviews are asked once, cached, and bounded by expiry."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import pytest

from controller import auth, errors

AGENT = auth.Identity(
    "system:serviceaccount:taugrid-system:taugrid-agent",
    extra=((auth.NODE_NAME_EXTRA, ("node-a",)),),
)


def jwt(exp: float) -> str:
    """A token shaped like a JWT with an `exp` claim (unsigned: only the API server verifies)."""
    payload = base64.urlsafe_b64encode(json.dumps({"exp": exp}).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.sig"


class CountingReviewer:
    """A reviewer that answers from tables and counts the questions it was asked."""

    def __init__(self, tokens: dict[str, auth.Identity], allowed: set[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.allowed = allowed
        self.token_reviews = 0
        self.access_reviews = 0
        self.gate: asyncio.Event | None = None
        self.access_gate: asyncio.Event | None = None

    async def review_token(self, token: str, audiences: tuple[str, ...]) -> auth.Identity | None:
        self.token_reviews += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.tokens.get(token)

    async def review_access(self, identity: auth.Identity, access: auth.Access) -> bool:
        self.access_reviews += 1
        if self.access_gate is not None:
            await self.access_gate.wait()
        return (identity.username, access.verb) in self.allowed


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


async def test_a_token_is_reviewed_once_and_then_answered_from_the_cache() -> None:
    """Heartbeat load must not become API-server load: one review per token per TTL."""
    token = jwt(2_000_000)
    reviewer = CountingReviewer({token: AGENT}, set())
    a = auth.Authenticator(reviewer, clock=Clock())
    for _ in range(100):
        assert await a.authenticate(f"Bearer {token}") == AGENT
    assert reviewer.token_reviews == 1


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    """A burst of identical requests in flight asks the API server once."""
    token = jwt(2_000_000)
    reviewer = CountingReviewer({token: AGENT}, set())
    reviewer.gate = asyncio.Event()
    a = auth.Authenticator(reviewer, clock=Clock())
    calls = [asyncio.create_task(a.authenticate(f"Bearer {token}")) for _ in range(20)]
    await asyncio.sleep(0)
    reviewer.gate.set()
    assert await asyncio.gather(*calls) == [AGENT] * 20
    assert reviewer.token_reviews == 1


async def test_the_cache_never_outlives_the_token() -> None:
    """A cached identity is dropped shortly before its token expires."""
    clock = Clock()
    token = jwt(clock.t + 100)
    reviewer = CountingReviewer({token: AGENT}, set())
    a = auth.Authenticator(reviewer, token_ttl_s=300, clock=clock)
    await a.authenticate(f"Bearer {token}")
    clock.t += 100 - auth.EXPIRY_MARGIN_S + 1
    await a.authenticate(f"Bearer {token}")
    assert reviewer.token_reviews == 2


@pytest.mark.parametrize(
    ("identity", "reviews"),
    [
        pytest.param(auth.Identity("ada"), 1, id="a person's token is reused for the long TTL"),
        pytest.param(auth.Identity(AGENT.username, extra=(
            (auth.NODE_NAME_EXTRA, ("node-a",)), (auth.POD_NAME_EXTRA, ("agent-x",)))), 2,
                     id="a pod-bound token is asked again after the short one"),
    ],
)  # fmt: skip
async def test_a_pod_bound_token_is_reviewed_again_sooner(
    identity: auth.Identity, reviews: int
) -> None:
    """After 61 s a pod-bound token (its pod may be gone) is reviewed again; a person's
    token stays cached up to the token TTL (review L7)."""
    clock = Clock()
    token = jwt(clock.t + 3600)
    reviewer = CountingReviewer({token: identity}, set())
    a = auth.Authenticator(reviewer, token_ttl_s=300, bound_token_ttl_s=60, clock=clock)
    await a.authenticate(f"Bearer {token}")
    clock.t += 61
    await a.authenticate(f"Bearer {token}")
    assert reviews == reviewer.token_reviews


WATCHED = auth.Identity(AGENT.username, extra=(
    (auth.NODE_NAME_EXTRA, ("node-a",)), (auth.POD_NAME_EXTRA, ("agent-x",)),
    (auth.POD_UID_EXTRA, ("uid-x",))))  # fmt: skip


async def test_a_watched_pods_token_is_kept_until_the_pod_is_gone() -> None:
    """A token bound to a pod the controller watches is not asked about again after the
    short TTL (the fleet would be reviewed every minute), but as soon as the watch says the
    pod is gone its answer is forgotten and the next use is reviewed (review L7)."""
    clock = Clock()
    token = jwt(clock.t + 3600)
    reviewer = CountingReviewer({token: WATCHED}, set())
    alive = {"uid-x"}
    a = auth.Authenticator(reviewer, token_ttl_s=300, bound_token_ttl_s=60,
                           pod_alive=alive.__contains__, clock=clock)  # fmt: skip
    await a.authenticate(f"Bearer {token}")
    clock.t += 61
    await a.authenticate(f"Bearer {token}")
    kept = reviewer.token_reviews
    alive.clear()
    a.forget_pod("uid-x")
    await a.authenticate(f"Bearer {token}")
    clock.t += 61
    await a.authenticate(f"Bearer {token}")
    assert (kept, reviewer.token_reviews) == (1, 3)


async def test_a_pod_deleted_while_its_token_is_reviewed_gets_the_short_ttl() -> None:
    """The deletion arrives while the review is in flight (nothing to forget yet): the
    answer is stored with the short TTL, because the pod is no longer alive when stored."""
    clock = Clock()
    token = jwt(clock.t + 3600)
    reviewer = CountingReviewer({token: WATCHED}, set())
    reviewer.gate = asyncio.Event()
    alive = {"uid-x"}
    a = auth.Authenticator(reviewer, token_ttl_s=300, bound_token_ttl_s=60,
                           pod_alive=alive.__contains__, clock=clock)  # fmt: skip
    call = asyncio.create_task(a.authenticate(f"Bearer {token}"))
    await asyncio.sleep(0)
    alive.clear()
    a.forget_pod("uid-x")
    reviewer.gate.set()
    await call
    clock.t += 61
    await a.authenticate(f"Bearer {token}")
    assert reviewer.token_reviews == 2


async def test_forgetting_pods_keeps_no_record_of_tokens_gone_from_the_cache() -> None:
    """Each new token of a pod (the kubelet rotates them) prunes the pod's expired ones, so
    the record of which answers to forget stays as small as the cache."""
    clock = Clock()
    alive = {"uid-x"}
    tokens = [jwt(clock.t + 3600 + i) for i in range(5)]
    reviewer = CountingReviewer(dict.fromkeys(tokens, WATCHED), set())
    a = auth.Authenticator(reviewer, token_ttl_s=300, pod_alive=alive.__contains__,
                           clock=clock)  # fmt: skip
    for token in tokens:
        await a.authenticate(f"Bearer {token}")
        clock.t += 301  # the last token's answer has expired when the next one comes
    assert len(a._by_pod["uid-x"]) == 1


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        pytest.param(None, "missing bearer token", id="no header is refused"),
        pytest.param("Basic abc", "missing bearer token", id="another scheme is refused"),
        pytest.param("Bearer ", "empty bearer token", id="an empty token is refused"),
        pytest.param("Bearer unknown", "rejected", id="a token the API server rejects"),
    ],
)
async def test_bad_credentials_are_401_with_a_reason(header: str | None, fragment: str) -> None:
    """Each kind of bad credential gets Unauthenticated saying what was wrong."""
    a = auth.Authenticator(CountingReviewer({}, set()), clock=Clock())
    with pytest.raises(errors.Unauthenticated) as err:
        await a.authenticate(header)
    assert fragment in str(err.value)


async def test_a_rejected_token_is_remembered_briefly() -> None:
    """A flood of one bad token costs one review every few seconds, not one per request."""
    clock = Clock()
    reviewer = CountingReviewer({}, set())
    a = auth.Authenticator(reviewer, clock=clock)
    for _ in range(10):
        with pytest.raises(errors.Unauthenticated):
            await a.authenticate("Bearer bad")
    assert reviewer.token_reviews == 1
    clock.t += auth.NEGATIVE_TTL_S + 1
    with pytest.raises(errors.Unauthenticated):
        await a.authenticate("Bearer bad")
    assert reviewer.token_reviews == 2


async def test_access_answers_are_cached_and_a_refusal_names_verb_and_resource() -> None:
    """SubjectAccessReview answers are reused; a refusal says who may not do what where."""
    oncall = auth.Identity("alice")
    reviewer = CountingReviewer({}, {("alice", "get")})
    a = auth.Authenticator(reviewer, clock=Clock())
    for _ in range(5):
        await a.authorize(oncall, auth.Access("get", "nodes"))
    assert reviewer.access_reviews == 1
    with pytest.raises(errors.Forbidden) as err:
        await a.authorize(oncall, auth.Access("patch", "nodes"))
    assert str(err.value) == "alice may not patch nodes"


@pytest.mark.parametrize(
    ("identity", "node", "fragment"),
    [
        pytest.param(AGENT, "node-b", "bound to node node-a", id="node A's token naming node B"),
        pytest.param(
            auth.Identity("system:serviceaccount:default:other", extra=AGENT.extra),
            "node-a",
            "is not the agent ServiceAccount",
            id="another ServiceAccount's token on the right node",
        ),
        pytest.param(
            auth.Identity(AGENT.username),
            "node-a",
            "not bound to a pod",
            id="an agent token not bound to a pod",
        ),
    ],
)
def test_heartbeats_are_accepted_only_from_the_agent_on_its_own_node(
    identity: auth.Identity, node: str, fragment: str
) -> None:
    """A heartbeat needs the agent ServiceAccount's token bound to a pod on the named node."""
    with pytest.raises(errors.Forbidden) as err:
        auth.check_heartbeat_sender(identity, AGENT.username, node)
    assert fragment in str(err.value)


def test_the_agent_on_its_own_node_is_accepted() -> None:
    """The right ServiceAccount, bound to a pod on the node it reports for, passes."""
    auth.check_heartbeat_sender(AGENT, AGENT.username, "node-a")
    assert AGENT.node_name == "node-a"


@pytest.mark.parametrize(
    "identity",
    [
        pytest.param(AGENT, id="an agent bound to its node"),
        pytest.param(auth.Identity("ada", "uid-1", ("team-a", "system:authenticated")),
                     id="a person with groups"),
        pytest.param(auth.run_caller("team-a", "mnist", 3), id="a pod of a run's attempt"),
    ],
)  # fmt: skip
def test_a_reviewed_caller_survives_the_header_unchanged(identity: auth.Identity) -> None:
    """What a follower reviewed is exactly what the leader authorises: user, uid, groups and
    extras all cross."""
    assert identity == auth.decode_caller(auth.encode_caller(identity))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("not base64 at all!", id="not base64"),
        pytest.param(base64.urlsafe_b64encode(b"[1, 2]").decode(), id="not an object"),
        pytest.param(base64.urlsafe_b64encode(b'{"username": ""}').decode(), id="no username"),
        pytest.param(base64.urlsafe_b64encode(b'{"username": "a", "admin": true}').decode(),
                     id="an unknown field"),
        pytest.param("A" * 7000, id="longer than the limit"),
    ],
)  # fmt: skip
def test_a_caller_header_the_controller_did_not_write_is_malformed(value: str) -> None:
    """Anything but `encode_caller`'s output is refused as Malformed naming the header."""
    with pytest.raises(errors.Malformed) as caught:
        auth.decode_caller(value)
    expected = "X-TauGrid-Caller"
    assert expected == caught.value.field


@pytest.mark.parametrize(
    ("identity", "node", "refused"),
    [
        pytest.param(AGENT, "node-a", "", id="the agent for its own node is accepted"),
        pytest.param(AGENT, "node-b", "bound to node node-a", id="another node is refused"),
        pytest.param(auth.Identity("system:serviceaccount:taugrid-system:other",
                                   extra=AGENT.extra), "node-a",
                     "is not the agent ServiceAccount", id="another ServiceAccount is refused"),
        pytest.param(auth.Identity(AGENT.username), "node-a", "not bound to a pod",
                     id="a token bound to no pod is refused"),
    ],
)  # fmt: skip
def test_only_the_agent_bound_to_the_node_may_report_for_it(
    identity: auth.Identity, node: str, refused: str
) -> None:
    """The identity checks (made before the body is read) and the node check after it."""
    try:
        auth.check_heartbeat_sender(identity, AGENT.username, node)
        message = ""
    except errors.Forbidden as err:
        message = err.message
    expected = (bool(refused), True)
    assert expected == (bool(message), refused in message)


async def test_the_guard_before_a_review_runs_only_when_the_api_server_would_be_asked() -> None:
    """A known token costs nothing; an unknown one runs the guard first, and a guard that
    refuses (a rate limit) keeps the review from being made at all."""
    known, unknown = jwt(2_000_000), "garbage"
    reviewer = CountingReviewer({known: AGENT}, set())
    a = auth.Authenticator(reviewer, clock=Clock())
    guarded: list[str] = []

    def guard() -> None:
        guarded.append("asked")

    def refuse() -> None:
        raise errors.TooManyRequests("slow down")

    await a.authenticate(f"Bearer {known}", before_review=guard)
    await a.authenticate(f"Bearer {known}", before_review=guard)
    with pytest.raises(errors.TooManyRequests):
        await a.authenticate(f"Bearer {unknown}", before_review=refuse)
    expected = (["asked"], 1)
    assert expected == (guarded, reviewer.token_reviews)


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        pytest.param(0.0, [False, False, True], id="drawn 0, an entry lives its whole TTL"),
        pytest.param(1.0, [False, True, True], id="drawn 1, it lives 80 % of it and no more"),
    ],
)
async def test_cached_answers_expire_spread_out_never_later(
    draw: float, expected: list[bool]
) -> None:
    """With jitter 0.2 a 100 s entry expires between 80 s and 100 s: a fleet reviewed at
    once is not reviewed again at once; no entry outlives its TTL. Asked again 79 s, 90 s
    and 100.5 s after its load, is it loaded again?"""
    reloaded = []
    for after in (79.0, 90.0, 100.5):
        clock = Clock()
        cache = auth.TTLCache(clock, jitter=0.2, rnd=lambda: draw)
        loads: list[float] = []

        async def load(loads: list[float] = loads, clock: Clock = clock) -> str:
            loads.append(clock.t)
            return "identity"

        await cache.get("token", load, lambda _v: 100.0)
        clock.t += after
        await cache.get("token", load, lambda _v: 100.0)
        reloaded.append(len(loads) == 2)
    assert expected == reloaded


async def test_reviews_past_the_cap_are_shed_not_queued() -> None:
    """With two reviews in flight and a cap of two, a third token is answered 503
    `ReviewBusy` at once (nothing asked); once those answer it is reviewed and cached."""
    tokens = {f"t{i}": auth.Identity(f"user-{i}") for i in range(3)}
    reviewer = CountingReviewer(tokens, set())
    reviewer.gate = asyncio.Event()
    a = auth.Authenticator(reviewer, max_reviews=2, clock=Clock())
    held = [asyncio.create_task(a.authenticate(f"Bearer t{i}")) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(errors.Unavailable) as refused:
        await a.authenticate("Bearer t2")
    asked_while_busy = reviewer.token_reviews
    reviewer.gate.set()
    await asyncio.gather(*held)
    third = await a.authenticate("Bearer t2")
    expected = ("ReviewBusy", 2, "user-2", 0)
    assert expected == (refused.value.code, asked_while_busy, third.username, a.reviewing)


ALICE = auth.Identity("alice", uid="u-1", groups=("researchers",))
LIST_RUNS = auth.Access("list", "tauruns", group="taugrid.dev", namespace="team-a")


@pytest.mark.parametrize(
    ("identity", "access", "same"),
    [
        pytest.param(ALICE, LIST_RUNS, True, id="the same question is the same answer"),
        pytest.param(ALICE, dataclasses.replace(LIST_RUNS, namespace="team-b"), False,
                     id="another namespace is another question"),
        pytest.param(ALICE, dataclasses.replace(LIST_RUNS, verb="create"), False,
                     id="another verb is another question"),
        pytest.param(ALICE, dataclasses.replace(LIST_RUNS, resource="taurunlogs"), False,
                     id="another resource is another question"),
        pytest.param(ALICE, dataclasses.replace(LIST_RUNS, subresource="status"), False,
                     id="another subresource is another question"),
        pytest.param(ALICE, dataclasses.replace(LIST_RUNS, name="train"), False,
                     id="another name is another question"),
        pytest.param(dataclasses.replace(ALICE, username="bob"), LIST_RUNS, False,
                     id="another user is another question"),
        pytest.param(dataclasses.replace(ALICE, groups=("researchers", "admins")), LIST_RUNS,
                     False, id="other groups are another question"),
    ],
)  # fmt: skip
def test_access_answers_are_kept_per_whole_question(
    identity: auth.Identity, access: auth.Access, same: bool
) -> None:
    """The cache key holds everything the SubjectAccessReview asks, nothing less."""
    assert same == (auth.access_key(identity, access) == auth.access_key(ALICE, LIST_RUNS))


@pytest.mark.parametrize(
    ("taken", "next_user", "limit"),
    [
        pytest.param(["alice", "alice"], "alice", "access_reviews_per_identity 2",
                     id="a caller at its own cap is refused naming it"),
        pytest.param(["alice", "bob", "carol"], "dave", "access_reviews_in_flight_max 3",
                     id="a replica at its cap refuses a newcomer naming it"),
    ],
)  # fmt: skip
def test_access_reviews_past_a_cap_are_429_naming_the_limit(
    taken: list[str], next_user: str, limit: str
) -> None:
    """Per username and per replica; nothing is counted for the refused call."""
    cap = auth.AccessCap(per_identity=2, total=3)
    for user in taken:
        cap.take(user)
    with pytest.raises(errors.TooManyRequests, match=limit):
        cap.take(next_user)
    assert len(taken) == cap.in_flight


def test_a_released_review_frees_its_slot() -> None:
    """Once answered, the caller may ask again; nothing is remembered of a caller at 0."""
    cap = auth.AccessCap(per_identity=1, total=3)
    cap.take("alice")
    cap.release("alice")
    cap.take("alice")
    cap.release("alice")
    assert (cap.in_flight, dict(cap.held)) == (0, {})


async def test_a_flood_of_new_namespaces_costs_at_most_the_cap_in_reviews() -> None:
    """Security review 3, finding 1: fifty calls at once, each naming a new namespace, ask
    the API server at most the per-identity cap; the rest are 429 at once; repeats of a
    cached question cost nothing, and the slots are free again afterwards."""
    reviewer = CountingReviewer({}, {("alice", "list")})
    reviewer.access_gate = asyncio.Event()
    a = auth.Authenticator(reviewer, access_per_identity=4, access_max=64, clock=Clock())
    calls = [
        asyncio.create_task(a.authorize(ALICE, dataclasses.replace(LIST_RUNS, namespace=f"ns-{i}")))
        for i in range(50)
    ]
    await asyncio.sleep(0)
    asked_at_once = reviewer.access_reviews
    reviewer.access_gate.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, errors.TooManyRequests)]
    for _ in range(10):
        await a.authorize(ALICE, dataclasses.replace(LIST_RUNS, namespace="ns-0"))
    expected = (4, 46, 4, 0)
    assert expected == (
        asked_at_once,
        len(refused),
        reviewer.access_reviews,
        a.access_reviews.in_flight,
    )


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        pytest.param(errors.TooManyRequests("over the cap", code="TooMany"),
                     auth.ReviewOutcome.SHED, id="a cap's 429 is shed"),
        pytest.param(errors.Unavailable("busy", code="ReviewBusy"), auth.ReviewOutcome.SHED,
                     id="too many token reviews in flight is shed"),
        pytest.param(auth.ReviewUnavailable("TokenReview failed: HTTP 500"),
                     auth.ReviewOutcome.FAILED, id="the API server refusing is failed"),
        pytest.param(TimeoutError("waited"), auth.ReviewOutcome.FAILED,
                     id="a review that timed out is failed"),
    ],
)  # fmt: skip
def test_a_review_that_raised_is_shed_or_failed(
    err: Exception, expected: auth.ReviewOutcome
) -> None:
    """Refused by our own limits (shed) is told apart from the API server not answering."""
    assert expected == auth.outcome_of(err)


async def test_every_review_is_told_by_kind_cache_and_outcome() -> None:
    """`taugrid_auth_reviews` is fed: a token reviewed then cached, a rejected token, an
    access allowed then cached, an access refused, and one shed by the cap."""
    seen: list[tuple[str, bool, str]] = []
    reviewer = CountingReviewer({"good": ALICE}, {("alice", "list")})
    a = auth.Authenticator(
        reviewer, access_per_identity=1, clock=Clock(),
        observe=lambda kind, cached, outcome: seen.append((kind, cached, outcome)),
    )  # fmt: skip
    who = await a.authenticate("Bearer good")
    await a.authenticate("Bearer good")
    with pytest.raises(errors.Unauthenticated):
        await a.authenticate("Bearer bad")
    await a.authorize(who, LIST_RUNS)
    await a.authorize(who, LIST_RUNS)
    with pytest.raises(errors.Forbidden):
        await a.authorize(who, dataclasses.replace(LIST_RUNS, verb="delete"))
    reviewer.access_gate = asyncio.Event()
    held = asyncio.create_task(a.authorize(who, dataclasses.replace(LIST_RUNS, namespace="x")))
    await asyncio.sleep(0)
    with pytest.raises(errors.TooManyRequests):
        await a.authorize(who, dataclasses.replace(LIST_RUNS, namespace="y"))
    reviewer.access_gate.set()
    await held
    expected = [
        ("token", False, "allowed"), ("token", True, "allowed"), ("token", False, "denied"),
        ("access", False, "allowed"), ("access", True, "allowed"), ("access", False, "denied"),
        ("access", False, "shed"), ("access", False, "allowed"),
    ]  # fmt: skip
    assert expected == seen
