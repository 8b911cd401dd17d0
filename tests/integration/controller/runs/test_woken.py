"""The run reconciler woken by its caches, against the local control plane: a change to a
run's pods is reacted to at once, not at the next full pass."""

from __future__ import annotations

import pytest

from tests.runskit import Env, job_spec

pytestmark = pytest.mark.cluster


@pytest.mark.controller(run_pass_interval_s=3600.0,
                        run_pod_annotations={"kwok.taugrid.dev/run-for": "1s"})  # fmt: skip
async def test_a_run_follows_its_pod_without_waiting_for_the_interval(env: Env) -> None:
    """With an hour between full passes, a run whose pod starts and then succeeds still
    goes Running and then Succeeded within seconds: each change the caches see (its Job,
    Workload and pod) pokes a pass."""
    assert (await env.submit(job_spec("woken")))[0] == 201
    run = await env.wait_phase("woken", "Succeeded", timeout_s=60)
    assert run["phase"] == "Succeeded"
