"""Who learns what from the agent's HTTP API (security review 3, findings 3 and 13).

Pod names (which tenant holds which GPU) go only to an authorised caller: `/v1/gpus` to the
on-call right, `/metrics` to a scrape allowed `get nodes/metrics`. Reviews are cached by token
hash and rate-limited per source before any is sent, so a flood of unknown tokens at one node
is answered 429 and the count of reviews stays bounded. The authenticator is a counting table,
so every assertion is on counts and documents, never on clocks.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from aiohttp import test_utils

from agent import app as agent_app
from agent import auth
from tests.unit.agent import test_metrics, test_reporting


class CountingTable:
    """A test `Authenticator`: which tokens hold which rights; every review is counted."""

    def __init__(self) -> None:
        self.rights = {"on-call": {("patch", "")}, "prometheus": {("get", "metrics")}}
        self.reviews: list[tuple[str, str, str]] = []

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> auth.Identity:
        """Allow a token its rights, refuse a known token others (403), unknown tokens 401."""
        self.reviews.append((token, verb, subresource))
        rights = self.rights.get(token)
        if rights is None:
            raise auth.AuthError(401, "token rejected by TokenReview")
        if (verb, subresource) not in rights:
            raise auth.AuthError(403, f"{token} may not {verb} nodes/{subresource} {node}")
        return auth.Identity(user=token)


async def client_for(
    tmp_path: pathlib.Path, table: CountingTable, **overrides: Any
) -> test_utils.TestClient[Any, Any]:
    """A test client of an agent whose view holds `team-a/train-0` on GPU 0."""
    cfg = test_reporting.config(tmp_path, test_reporting.closed_port_url(), **overrides)
    mon = test_reporting.StubMonitor(cfg)
    mon.view = test_metrics.view()
    application = agent_app.make_app(cfg, authenticator=table, monitor=mon)
    return test_utils.TestClient(test_utils.TestServer(application))


def bearer(token: str | None) -> dict[str, str]:
    """The Authorization header for `token`; none for None."""
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        pytest.param(None, False, id="without a token GPUs are listed with no pods"),
        pytest.param("stranger", False, id="an unknown token sees no pods"),
        pytest.param("prometheus", False, id="a token without the on-call right sees no pods"),
        pytest.param("on-call", True, id="an on-call token sees who holds each GPU"),
    ],
)
async def test_gpus_name_pods_only_to_on_call(
    tmp_path: pathlib.Path, token: str | None, shown: bool
) -> None:
    """`GET /v1/gpus` answers 200 to all; `pods` is filled only for the on-call right."""
    table = CountingTable()
    async with await client_for(tmp_path, table) as client:
        resp = await client.get("/v1/gpus", headers=bearer(token))
        assert resp.status == 200
        doc = await resp.json()
    pods = [p for g in doc["gpus"] for p in g["pods"]]
    assert (bool(pods), doc["podAttribution"]["podsShown"]) == (shown, shown)
    assert len(doc["gpus"]) == 2
    if token is None:
        assert table.reviews == []  # no token, no review


@pytest.mark.parametrize(
    ("token", "pod_labels", "shown"),
    [
        pytest.param(None, True, False, id="an unauthenticated scrape gets no pod labels"),
        pytest.param("stranger", True, False, id="an unknown token's scrape gets no pod labels"),
        pytest.param("on-call", True, False, id="a token without nodes/metrics gets none"),
        pytest.param("prometheus", True, True, id="a scrape allowed nodes/metrics gets them"),
        pytest.param("prometheus", False, False, id="the setting off drops them for everyone"),
    ],
)
async def test_metrics_carry_pod_labels_only_for_an_authorised_scrape(
    tmp_path: pathlib.Path, token: str | None, pod_labels: bool, shown: bool
) -> None:
    """`/metrics` always answers; `namespace`/`pod` labels need `get nodes/metrics`."""
    table = CountingTable()
    async with await client_for(tmp_path, table, pod_labels=pod_labels) as client:
        resp = await client.get("/metrics", headers=bearer(token))
        assert resp.status == 200
        text = await resp.text()
    assert 'taugrid_gpu_verdict{gpu="0"' in text
    assert ('namespace="team-a"' in text, 'pod="train-0"' in text) == (shown, shown)


async def test_a_burst_of_unknown_tokens_gets_429s_and_bounded_reviews(
    tmp_path: pathlib.Path,
) -> None:
    """200 diag calls with 200 different unknown tokens from one address: `auth_burst`
    reviews are sent, the rest are answered 429 with Retry-After, and no review is sent for
    them (the rate is so slow that no token refills during the test)."""
    table = CountingTable()
    async with await client_for(tmp_path, table, auth_burst=5, auth_rate_per_s=1e-6) as client:
        statuses = []
        for i in range(200):
            resp = await client.post("/v1/diag?level=1", headers=bearer(f"unknown-{i}"))
            statuses.append(resp.status)
            if resp.status == 429:
                assert resp.headers["Retry-After"] == "1"
    assert (statuses.count(401), statuses.count(429)) == (5, 195)
    assert len(table.reviews) == 5


async def test_a_known_token_is_served_from_the_cache_while_its_source_is_limited(
    tmp_path: pathlib.Path,
) -> None:
    """Once reviewed, the on-call token is answered from the cache by its hash: repeated
    calls send no more reviews and are not limited, even after the source's bucket is empty."""
    table = CountingTable()
    async with await client_for(tmp_path, table, auth_burst=2, auth_rate_per_s=1e-6) as client:
        for _ in range(20):
            doc = await (await client.get("/v1/gpus", headers=bearer("on-call"))).json()
            assert doc["podAttribution"]["podsShown"] is True
        refused = await client.post("/v1/diag?level=1", headers=bearer("stranger"))
        assert refused.status == 401  # the second and last review the bucket allows
        limited = await client.post("/v1/diag?level=1", headers=bearer("stranger-2"))
        assert limited.status == 429
        again = await client.post("/v1/diag?level=1", headers=bearer("stranger"))
        assert again.status == 401  # a cached refusal, not a new review
        doc = await (await client.get("/v1/gpus", headers=bearer("on-call"))).json()
    assert doc["podAttribution"]["podsShown"] is True
    assert len(table.reviews) == 2


def test_the_limiter_refills_at_its_rate() -> None:
    """A bucket holds `burst`, refills `rate_per_s` a second, and is per source."""
    limiter = auth.RateLimiter(rate_per_s=2.0, burst=3)
    first = [limiter.allow("10.0.0.1", 0.0) for _ in range(4)]
    other = limiter.allow("10.0.0.2", 0.0)
    later = [limiter.allow("10.0.0.1", 1.0) for _ in range(3)]
    assert (first, other, later) == ([True, True, True, False], True, [True, True, False])
