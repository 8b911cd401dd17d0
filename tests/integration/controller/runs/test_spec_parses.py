"""Submissions parse under a cap, per caller and per replica (security review 3, finding 10):
a body of up to 1 MiB of YAML holds a worker thread while it parses, so a caller sending
many at once is answered 429 past the cap instead of queueing parses behind each other."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shared import spec as specs
from tests import support
from tests.runskit import Env, job_spec

pytestmark = pytest.mark.cluster


@pytest.mark.controller(spec_parses_per_identity=1, spec_parses_max=4)
async def test_a_callers_parses_past_the_cap_are_429_and_the_held_one_completes(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first submission's parse is held; the caller's second is 429 `TooMany` naming
    the limit, with Retry-After, and nothing of it is created; once the first parse goes on,
    it is created, and the caller may submit again."""
    gate = threading.Event()
    entered = threading.Event()
    real = specs.parse_spec

    def held(raw: bytes, content_type: str) -> Any:
        if b"held" in raw:
            entered.set()
            gate.wait(60)
        return real(raw, content_type)

    monkeypatch.setattr(specs, "parse_spec", held)
    first = asyncio.create_task(env.submit(job_spec("held")))
    try:

        async def parsing() -> None:
            assert entered.is_set(), "the first parse has not started"

        await support.eventually(parsing, what="the first parse to start")
        async with env.http.post(
            f"{env.url}/v1/runs", json=job_spec("second"), headers=env.headers(),
            params={"namespace": env.namespace},
        ) as resp:  # fmt: skip
            refused = (resp.status, resp.headers.get("Retry-After"), (await resp.json())["error"])
    finally:
        gate.set()
    created = await first
    again = await env.submit(job_spec("third"))
    second = await env.get(f"/v1/runs/{env.namespace}/second")
    assert (refused[0], refused[1], refused[2]["code"]) == (429, "1", "TooMany"), refused
    assert "submissions being parsed" in refused[2]["message"], refused
    assert (created[0], again[0], second[0]) == (201, 201, 404), (created, again, second)
