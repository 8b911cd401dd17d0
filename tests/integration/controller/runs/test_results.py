"""Results against the local control plane: a run's pods report them with the run's token,
the controller keeps them on the TauRun in few writes, researchers read and compare them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.runs import context as runs_context
from tests import runskit, support
from tests.integration.controller.runs.test_runs_api import tau
from tests.runskit import Env, job_spec, make_token

pytestmark = pytest.mark.cluster

SHA = "sha256:" + "b" * 64


async def post(env: Env, token: str, run: str, body: Any) -> tuple[int, dict[str, Any]]:
    """POST a results report with a given token."""
    async with env.http.post(
        f"{env.url}/v1/runs/{env.namespace}/{run}/results", json=body,
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:  # fmt: skip
        return resp.status, await resp.json()


async def results(env: Env, run: str, **params: str) -> tuple[int, dict[str, Any]]:
    return await env.get(f"/v1/runs/{env.namespace}/{run}/results", **params)


async def test_a_burst_of_reports_lands_on_the_taurun_in_few_writes(env: Env) -> None:
    """Fifty reports sent at once are all kept (one point each), in far fewer status writes
    than reports; the TauRun's own status holds them."""
    assert (await env.submit(job_spec("burst")))[0] == 201
    token = await runskit.run_token(env.api, env.namespace, "burst")
    collector = env.controller.app[runs_context.RUNS].reconciler.collector
    before = collector.writes
    answers = await asyncio.gather(*(
        post(env, token, "burst", {"attempt": 1, "metrics": [
            {"name": "loss", "value": 1.0 / (step + 1), "step": step}]})
        for step in range(50)
    ))  # fmt: skip
    assert {status for status, _ in answers} == {202}, answers[:3]

    async def kept() -> dict[str, Any]:
        status, body = await results(env, "burst", metric="loss")
        assert status == 200, body
        assert body["metrics"], "no metric kept yet"  # an IndexError would end the wait
        assert len(body["metrics"][0]["points"]) == 50, len(body["metrics"][0]["points"])
        return body

    body = await support.eventually(kept, what="the burst on the TauRun")
    assert body["metrics"][0]["last"]["step"] == 49
    assert collector.writes - before <= 5, collector.writes - before
    raw = await env.controller.app[runs_context.RUNS].store.get_run(env.namespace, "burst")
    assert raw is not None
    assert len(raw["status"]["results"]["metrics"][0]["points"]) == 50


async def test_tau_result_inside_a_run_and_tau_results_outside(env: Env) -> None:
    """`tau result` (metrics at a step, an artifact with size and digest, a summary) from a
    run's environment; `tau results RUN` shows them and `--metric` the series."""
    assert (await env.submit(job_spec("ft")))[0] == 201
    token = await runskit.run_token(env.api, env.namespace, "ft")
    for argv in (
        ["result", "--metric", "loss=0.5", "--metric", "acc=0.7", "--step", "100"],
        ["result", "--metric", "loss=0.25", "--step", "200"],
        ["result", "--artifact", "s3://bucket/ft/model.pt", "--size", "1024", "--digest", SHA],
        ["result", "--summary", "converged at step 200"],
    ):
        code, out = await tau(env, token, "ft", 1, *argv)
        assert code == 0, out

    async def shown() -> str:
        code, out = await tau(env, env.token, "ft", 1, "results", "ft")
        assert code == 0, out
        assert "converged at step 200" in out, out
        assert "s3://bucket/ft/model.pt" in out, out
        return out

    out = await support.eventually(shown, what="tau results to show the report")
    assert "loss    0.25  200   2       0.25  0.5" in out, out
    code, out = await tau(env, env.token, "ft", 1, "results", "ft", "--metric", "loss")
    assert code == 0, out
    assert out.splitlines()[-2:] == [line for line in out.splitlines() if line[:3] in
                                     {"100", "200"}], out  # fmt: skip


async def test_results_are_refused_from_strangers_stale_attempts_and_bad_bodies(env: Env) -> None:
    """Another run's token is 403, as is a report for an attempt other than the pod's; a bad
    body 422 naming the field; a researcher without `get tauruns` cannot read them (403)."""
    for name in ("mine", "theirs"):
        assert (await env.submit(job_spec(name)))[0] == 201
    token = await runskit.run_token(env.api, env.namespace, "mine")
    status, body = await post(env, token, "theirs", {"attempt": 1, "summary": "x"})
    assert (status, body["error"]["code"]) == (403, "Forbidden"), body
    status, body = await post(env, token, "mine", {"attempt": 2, "summary": "x"})
    assert (status, body["error"]["field"]) == (403, "attempt"), body  # not its pod's attempt
    status, body = await post(env, token, "mine", {"attempt": 1, "metrics": [
        {"name": "loss", "value": "NaN", "step": 1}]})  # fmt: skip
    assert (status, body["error"]["field"]) == (422, "metrics[0].value"), body
    stranger = await make_token(env.api, env.namespace, "stranger", None)
    async with env.http.get(
        f"{env.url}/v1/runs/{env.namespace}/mine/results",
        headers={"Authorization": f"Bearer {stranger}"},
    ) as resp:  # fmt: skip
        assert resp.status == 403, await resp.text()


async def test_an_experiments_runs_compare_side_by_side(env: Env) -> None:
    """Runs sharing `experiment.name` are listed as one experiment and compared: each run's
    final metrics, and with `metric` each run's series to overlay."""
    for name, final in (("lr-a", 0.4), ("lr-b", 0.3)):
        spec = job_spec(name, experiment={"project": "llm", "name": "lr-sweep", "tags": ["s"]})
        assert (await env.submit(spec))[0] == 201
        token = await runskit.run_token(env.api, env.namespace, name)
        for step, value in ((10, 1.0), (20, final)):
            status, _ = await post(env, token, name, {"attempt": 1, "metrics": [
                {"name": "loss", "value": value, "step": step}]})  # fmt: skip
            assert status == 202

    async def compared() -> dict[str, Any]:
        status, body = await env.get("/v1/experiments/compare", namespace=env.namespace,
                                     name="lr-sweep", metric="loss")  # fmt: skip
        assert status == 200, body
        assert [len(r["points"]) for r in body["runs"]] == [2, 2], body
        return body

    body = await support.eventually(compared, what="both runs' results")
    assert {r["name"]: r["final"]["loss"]["value"] for r in body["runs"]} == {
        "lr-a": 0.4, "lr-b": 0.3,
    }  # fmt: skip
    status, listed = await env.get("/v1/experiments", namespace=env.namespace)
    assert status == 200
    assert [(e["name"], e["runs"], e["projects"]) for e in listed["items"]] == [
        ("lr-sweep", 2, ["llm"])
    ]
    code, out = await tau(env, env.token, "x", 1, "results", "--experiment", "lr-sweep")
    assert code == 0, out
    rows = [(r.split()[0], r.split()[2:]) for r in out.splitlines()[1:]]
    assert (out.split()[:3], rows) == (
        ["RUN", "PHASE", "LOSS"],
        [("lr-a", ["0.4", "@20"]), ("lr-b", ["0.3", "@20"])],
    ), out


@pytest.mark.controller(reports_per_s_per_run=0.01, reports_burst_per_run=3)
async def test_reports_past_the_runs_rate_are_429_and_read_no_taurun(env: Env) -> None:
    """Each report reads the TauRun from the API server (security review 3, finding 10): a
    run's caller past `reports_burst_per_run` is answered 429 `RateLimited` with Retry-After
    before anything is read, for results and checkpoints alike; another run's bucket is its
    own."""
    for run in ("chatty", "quiet"):
        assert (await env.submit(job_spec(run)))[0] == 201
    chatty = await runskit.run_token(env.api, env.namespace, "chatty")
    quiet = await runskit.run_token(env.api, env.namespace, "quiet")
    point = {"attempt": 1, "metrics": [{"name": "loss", "value": 0.5, "step": 1}]}
    answers = [await post(env, chatty, "chatty", point) for _ in range(3)]
    assert [status for status, _ in answers] == [202, 202, 202], answers
    async with env.http.post(
        f"{env.url}/v1/runs/{env.namespace}/chatty/results", json=point,
        headers={"Authorization": f"Bearer {chatty}"},
    ) as resp:  # fmt: skip
        refused = (resp.status, resp.headers.get("Retry-After"), (await resp.json())["error"])
    async with env.http.post(
        f"{env.url}/v1/runs/{env.namespace}/chatty/checkpoints",
        json={"attempt": 1, "step": 1, "path": "/ckpt/step-1"},
        headers={"Authorization": f"Bearer {chatty}"},
    ) as resp:  # fmt: skip
        checkpoint = resp.status
    assert (refused[0], refused[1], refused[2]["code"], checkpoint) == (
        429,
        "1",
        "RateLimited",
        429,
    )
    assert "chatty" in refused[2]["message"], refused
    assert (await post(env, quiet, "quiet", point))[0] == 202
