"""Rerun from evidence, against the local control plane: a new run with the old one's spec,
its image pinned to the digest that ran, a new name, and evidence pointing back."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from tests import support
from tests.integration.controller.runs.test_runs_api import read_job, tau
from tests.runskit import Env, job_spec

pytestmark = pytest.mark.cluster

DIGEST = "sha256:" + "c" * 64


async def rerun(env: Env, run: str, **body: str) -> tuple[int, dict[str, Any]]:
    async with env.http.post(f"{env.url}/v1/runs/{env.namespace}/{run}/rerun", json=body,
                             headers=env.headers()) as resp:  # fmt: skip
        return resp.status, await resp.json()


@pytest.mark.controller(run_pod_annotations={"kwok.taugrid.dev/run-for": "1s"})
async def test_a_rerun_runs_the_digest_that_ran_under_a_new_name(env: Env) -> None:
    """`<name>-r1`, then `-r2`, then a name of one's own; the image is the repository given
    with the digest the evidence recorded; the new run's evidence names the old run."""
    spec = job_spec("orig", image="python:3.12-slim", experiment={"name": "base"})
    assert (await env.submit(spec))[0] == 201
    await env.wait_phase("orig", "Succeeded")
    # KWOK's pods report no image ID; a kubelet's would be recorded here by the reconciler.
    await client.CustomObjectsApi(env.api).patch_namespaced_custom_object_status(
        "taugrid.dev", "v1alpha1", env.namespace, "tauruns", "orig",
        {"status": {"evidence": {"imageID": f"docker.io/library/python@{DIGEST}"}}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    status, first = await rerun(env, "orig")
    assert (status, first["name"]) == (201, "orig-r1"), first
    # No warning about the image's digest (the unpinned-image and no-digest warnings both
    # name the image's digest; a pre-flight "not checked" one names this test's namespace,
    # whose name holds the word too).
    digest_warnings = [w for w in first["warnings"] if "digest" in w and env.namespace not in w]
    assert not digest_warnings, first["warnings"]
    assert first["rerunOf"]["name"] == "orig"
    job = await read_job(env.api, env.namespace, "orig-r1-a1")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == f"python@{DIGEST}"
    assert (await env.run("orig-r1"))["experiment"] == {"name": "base", "tags": []}

    async def points_back() -> None:
        code, body = await env.get(f"/v1/runs/{env.namespace}/orig-r1/evidence")
        assert code == 200, body
        assert body.get("rerunOf", {}).get("imageID") == f"docker.io/library/python@{DIGEST}", body

    await support.eventually(points_back, what="the rerun's evidence to name the old run")
    assert (await rerun(env, "orig"))[1]["name"] == "orig-r2"
    code, out = await tau(env, env.token, "x", 1, "rerun", "orig", "--name", "mine")
    assert code == 0, out
    assert "run mine submitted to queue q" in out
    assert "(a rerun of orig)" in out
    status, body = await rerun(env, "orig", name="mine")
    assert (status, body["error"]["code"], body["error"]["field"]) == (409, "AlreadyExists", "name")
    status, body = await rerun(env, "nope")
    assert status == 404, body


async def test_a_rerun_without_a_digest_says_so(env: Env) -> None:
    """An old run whose evidence has no image ID is rerun with its image as given, and a
    warning that says it may not be the code that ran."""
    assert (await env.submit(job_spec("tagged", image="python:3.12-slim")))[0] == 201
    status, body = await rerun(env, "tagged")
    assert status == 201, body
    assert any("has no image digest" in w for w in body["warnings"]), body["warnings"]
