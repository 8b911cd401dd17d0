"""The web page at the controller's `/`, in a headless Chromium, against a controller on the dev
cluster: its own fake GPU nodes and heartbeating agents, its own queue and a run in it.

The page is driven as a person would use it: the token typed into its form, a run opened with
the mouse. What it shows is read back from the DOM's data attributes and text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from shared import health, heartbeat
from tests import browser, kueue, support
from tests import controllerkit as kit
from tests import runskit as runs_kit

pytestmark = pytest.mark.cluster

RUN = "train"
HOSTILE_XID_79 = heartbeat.Reason(
    code="XidFallenOffBus",
    verdict=health.Verdict.FAILED,
    action=health.Action.REBOOT_NODE,
    message="Xid 79: GPU has fallen off the bus <img id=injected src=x>",
    xid=79,
    latched=True,
    clears_when="a new boot ID",
)
"""Xid 79 as an agent reports it, with markup in the message: the page must show it as text."""

SNAPSHOT = """(() => {
  const byId = (id) => document.getElementById(id);
  const all = (root, sel) => [...root.querySelectorAll(sel)];
  return {
    signInShown: !byId("token-panel").hidden,
    dashboardShown: !byId("dashboard").hidden,
    refreshedAt: byId("last-refresh").dataset.refreshedAt || null,
    breaker: byId("fleet-summary").dataset.breaker || null,
    nodes: Object.fromEntries(all(document, "#nodes-body tr[data-node]").map((r) => [
      r.dataset.node, {
        verdict: r.dataset.verdict, quarantine: r.dataset.quarantine,
        cordoned: r.dataset.cordoned,
        gpus: all(r, "[data-gpu]").map((g) => g.dataset.verdict),
        faults: all(r, "[data-fault]").map((f) => f.textContent),
      }])),
    queues: all(document, "#queues-body tr[data-queue]").map((r) => r.dataset.queue),
    runs: Object.fromEntries(all(document, "#runs-body tr[data-run]").map((r) => [
      r.dataset.run, { phase: r.dataset.phase, text: r.textContent }])),
    errors: Object.fromEntries(all(document, "main .error").filter((e) => !e.hidden)
      .map((e) => [e.id, { status: e.dataset.status || null, text: e.textContent }])),
    injected: byId("injected") !== null,
  };
})()"""
"""What the page shows, as JSON: read from data attributes and text, as the markup promises."""


@dataclasses.dataclass
class World:
    """One test's controller, fleet and tokens."""

    url: str
    namespace: str
    nodes: list[str]
    agents: list[kit.Agent]
    token: str
    """May read nodes and the fleet, and submit and read runs in the namespace."""
    researcher: str
    """May submit and read runs in the namespace, not read nodes."""
    http: aiohttp.ClientSession
    api: client.ApiClient


async def _oncall_researcher_token(api: client.ApiClient, namespace: str) -> str:
    """The on-call token of `controllerkit.admin_token`, also bound to the researcher Role."""
    token = await kit.admin_token(api, namespace)
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "oncall-runs"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "researcher"},
            "subjects": [{"kind": "ServiceAccount", "name": "oncall", "namespace": namespace}],
        },
    )  # fmt: skip
    return token


@pytest_asyncio.fixture
async def world(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path, namespace: str
) -> AsyncIterator[World]:
    """Two fake GPU nodes with agents heartbeating to a controller that manages only them, a
    queue whose pods land on the second node, and a run submitted to it."""
    nodes = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 2,
        prefix=f"w-{namespace}"[:50].rstrip("-") + "-",
        labels={"taugrid.dev/test-fleet": namespace},
    )  # fmt: skip
    try:
        await kueue.create_queues(
            k8s, namespace, gpus=8, node_labels={"kubernetes.io/hostname": nodes[1]}
        )
        researcher = await runs_kit.make_token(
            k8s, namespace, "researcher", runs_kit.RESEARCHER_RULES
        )
        token = await _oncall_researcher_token(k8s, namespace)
        agents = [kit.Agent(n, await kit.agent_token(k8s, namespace, n)) for n in nodes]
        async with kit.running(
            dev_cluster, namespace, agents,
            run_pass_interval_s=0.5,
            run_pod_annotations={"kwok.taugrid.dev/run-for": "600s"},
            run_manager=f"test/{namespace}",
        ) as (ctl, http, _loops):  # fmt: skip
            w = World(ctl.url, namespace, nodes, agents, token, researcher, http, k8s)
            await _submit(w)
            yield w
    finally:
        await kueue.delete_queues(k8s, namespace)
        await kit.delete_test_rbac(k8s, namespace)
        core = client.CoreV1Api(k8s)
        for n in nodes:
            with contextlib.suppress(client.ApiException):
                await core.delete_node(n)


async def _submit(w: World) -> None:
    async with w.http.post(
        f"{w.url}/v1/runs",
        json=runs_kit.job_spec(RUN),
        params={"namespace": w.namespace},
        headers={"Authorization": f"Bearer {w.researcher}"},
    ) as resp:
        assert resp.status == 201, await resp.text()


@pytest_asyncio.fixture
async def page(tmp_path: pathlib.Path) -> AsyncIterator[browser.Page]:
    """A fresh headless Chromium tab; Chromium's process group is killed afterwards."""
    if not browser.available():
        msg = f"{browser.CHROMIUM} is missing: scripts/test installs it (browser_prereq)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    async with browser.launch(tmp_path) as tab:
        yield tab


async def _snapshot(page: browser.Page) -> dict[str, Any]:
    return dict(await page.evaluate(SNAPSHOT))


async def _sign_in(page: browser.Page, token: str) -> None:
    await page.type_into("#token-input", token)
    await page.press_enter()


async def _shows_fleet_and_run(page: browser.Page, w: World) -> dict[str, Any]:
    """Poll until both nodes are healthy with 8 healthy GPUs each, the run is running and the
    queue is listed (each panel refreshes on its own: one can lag the others)."""
    run = f"{w.namespace}/{RUN}"

    async def probe() -> dict[str, Any]:
        seen = await _snapshot(page)
        assert not seen["errors"], seen["errors"]
        for n in w.nodes:
            node = seen["nodes"].get(n)
            assert node is not None, f"{n} not shown: {seen['nodes']}"
            assert node["verdict"] == "Healthy", node
            assert node["gpus"] == ["Healthy"] * 8, node
        assert run in seen["runs"], seen["runs"]
        assert seen["runs"][run]["phase"] == "Running", seen["runs"][run]
        assert seen["queues"] == ["q"], seen["queues"]
        return seen

    return await support.eventually(probe, what="the page to show the fleet and the run")


async def test_the_page_shows_fleet_and_runs_live_and_the_quarantine_of_a_failed_node(
    page: browser.Page, world: World
) -> None:
    """Sign in through the form; the fleet, the queue and the running run appear; the token
    survives a reload; a run opens with its attempt and evidence; an Xid 79 on one node turns
    it Failed and quarantined on the page, its agent's text shown as text; nothing threw."""
    async with world.http.get(f"{world.url}/") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'sha256-" in csp, csp
    assert "unsafe" not in csp, csp
    await page.goto(f"{world.url}/?namespace={world.namespace}")
    first = await _snapshot(page)
    assert (first["signInShown"], first["dashboardShown"]) == (True, False)
    await _sign_in(page, world.token)
    seen = await _shows_fleet_and_run(page, world)
    assert seen["queues"] == ["q"]
    assert seen["breaker"] == "closed"
    assert seen["refreshedAt"]

    await page.reload()
    assert (await _snapshot(page))["signInShown"] is False, "the reload asked for the token again"
    await _shows_fleet_and_run(page, world)

    await _open_run(page, world)
    await _fault_quarantines(page, world)
    assert page.problems() == []


async def _open(page: browser.Page, key: str) -> None:
    """Click run `key`'s name until its detail is the one shown: the table redraws as runs
    change phase, so a click can land on the row that just moved under the pointer (a user
    would click again too)."""

    async def opened() -> None:
        shown = await page.evaluate("document.getElementById('run-detail').dataset.run || null")
        if shown != key:
            await page.click(f'[data-open-run="{key}"]')
            raise support.NotYetError(f"the detail shows {shown!r}, not {key!r}")

    await support.eventually(opened, what=f"run {key}'s detail")


async def _open_run(page: browser.Page, w: World) -> None:
    """Click the run: its detail names attempt 1's Job; the evidence names the run."""
    key = f"{w.namespace}/{RUN}"
    await _open(page, key)

    async def detail() -> str:
        shown = await page.evaluate(
            "(() => { const d = document.getElementById('run-detail');"
            " const a = d.querySelector('[data-attempt=\"1\"]');"
            " return {hidden: d.hidden, run: d.dataset.run, attempt: a && a.textContent}; })()"
        )
        assert shown["hidden"] is False, shown
        assert shown["run"] == key, shown
        assert shown["attempt"] is not None, shown
        return str(shown["attempt"])

    attempt = await support.eventually(detail, what="the run's detail")
    assert f"{RUN}-a1" in attempt
    await page.click("#evidence-button")

    async def evidence() -> str:
        text = await page.evaluate(
            "(() => { const p = document.getElementById('evidence');"
            " return p.hidden ? null : p.textContent; })()"
        )
        assert text, "no evidence shown yet"
        return str(text)

    shown = await support.eventually(evidence, what="the run's evidence")
    assert re.search(rf'"name": "{RUN}"', shown), shown


async def _fault_quarantines(page: browser.Page, w: World) -> None:
    """Make the first node's agent report Xid 79 on GPU 2 until the page shows it quarantined."""
    bad, good = w.nodes
    w.agents[0].fail(2, HOSTILE_XID_79)

    async def quarantined() -> dict[str, Any]:
        seen = await _snapshot(page)
        node = seen["nodes"].get(bad)
        assert node is not None, seen["nodes"]
        assert node["verdict"] == "Failed", node
        assert node["quarantine"] == "Automatic", node
        assert node["cordoned"] == "true", node
        return seen

    seen = await support.eventually(quarantined, what=f"{bad} quarantined on the page")
    node = seen["nodes"][bad]
    assert node["gpus"][2] == "Failed"
    assert [v for i, v in enumerate(node["gpus"]) if i != 2] == ["Healthy"] * 7
    (fault,) = node["faults"]
    assert "XidFallenOffBus" in fault
    assert "<img id=injected src=x>" in fault, "the agent's text was not shown verbatim"
    assert "latched until a new boot ID" in fault
    assert seen["injected"] is False, "an agent's text became markup"
    assert seen["nodes"][good]["verdict"] == "Healthy"
    assert seen["nodes"][good]["quarantine"] == "none"


async def test_a_token_that_may_not_read_nodes_still_sees_its_runs(
    page: browser.Page, world: World
) -> None:
    """A researcher token: the fleet panel says in words that it may not read nodes (403),
    the runs and a run's detail still show; forgetting the token clears the page and the
    session's copy; the page, detail open, fits a phone's width."""
    await page.goto(f"{world.url}/?namespace={world.namespace}")
    await _sign_in(page, world.token)
    await _shows_fleet_and_run(page, world)
    await page.click("#forget-token")
    after = await _snapshot(page)
    assert (after["signInShown"], after["nodes"], after["runs"]) == (True, {}, {})
    assert await page.evaluate("sessionStorage.getItem('taugrid.token')") is None

    await _sign_in(page, world.researcher)
    run = f"{world.namespace}/{RUN}"

    async def refused_but_runs_shown() -> dict[str, Any]:
        seen = await _snapshot(page)
        assert run in seen["runs"], seen
        assert "fleet-error" in seen["errors"], seen["errors"]
        return seen

    seen = await support.eventually(refused_but_runs_shown, what="runs shown, nodes refused")
    assert seen["errors"]["fleet-error"]["status"] == "403"
    assert "may not read the fleet's nodes" in seen["errors"]["fleet-error"]["text"]
    assert seen["nodes"] == {}
    assert set(seen["errors"]) == {"fleet-error"}
    await _open_run(page, world)

    await page.set_viewport(360, 740)

    async def fits() -> None:
        width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page is {width[0]} px wide in a {width[1]} px window"

    await support.eventually(fits, what="the page to fit 360 px")
    refusals = re.compile(r"status of 403 .*/v1/(fleet|nodes)\b")
    assert [p for p in page.problems() if not refusals.search(p)] == []


async def _report(w: World, run: str, body: dict[str, Any]) -> None:
    """Report results as the run's pod does, with its own projected token."""
    token = await runs_kit.run_token(w.api, w.namespace, run)

    async def accepted() -> None:  # a 503 (the lease changing hands) is retried, as pods do
        async with w.http.post(f"{w.url}/v1/runs/{w.namespace}/{run}/results", json=body,
                               headers={"Authorization": f"Bearer {token}"}) as resp:  # fmt: skip
            if resp.status == 503:
                raise support.NotYetError(await resp.text())
            assert resp.status == 202, await resp.text()

    await support.eventually(accepted, what=f"{run}'s report accepted")


CHARTS = """(() => {
  const all = (root, sel) => [...root.querySelectorAll(sel)];
  const exp = document.getElementById("experiment-chart");
  return {
    metrics: Object.fromEntries(all(document, "#metrics figure[data-metric]").map((f) => [
      f.dataset.metric, { points: Number(f.dataset.points),
        line: f.querySelector("svg polyline") !== null,
        caption: f.querySelector("figcaption").textContent }])),
    artifacts: all(document, "#artifacts-body tr[data-artifact]").map((r) => r.dataset.artifact),
    summary: document.getElementById("results-summary").textContent,
    experiment: exp.dataset.experiment || null,
    overlaid: Object.fromEntries(all(exp, "polyline[data-series]").map((p) => [
      p.dataset.series, Number(p.dataset.points)])),
    legend: all(exp, ".legend li[data-run]").map((li) => li.dataset.run),
  };
})()"""
"""The run detail's results and the experiment's overlay, as the page draws them."""


async def test_a_runs_results_are_charted_and_its_experiments_runs_overlaid(
    page: browser.Page, world: World
) -> None:
    """Two runs of one experiment report a loss curve, one an artifact and a summary: its
    detail draws the loss as an inline SVG line over its steps beside the artifact, and the
    experiment's chart overlays both runs' curves; nothing the runs sent became markup."""
    for name in ("sweep-a", "sweep-b"):
        spec = runs_kit.job_spec(name, experiment={"name": "sweep", "project": "web"})
        async with world.http.post(f"{world.url}/v1/runs", json=spec,
                                   params={"namespace": world.namespace},
                                   headers={"Authorization": f"Bearer {world.researcher}"},
                                   ) as resp:  # fmt: skip
            assert resp.status == 201, await resp.text()
    for name, scale in (("sweep-a", 1.0), ("sweep-b", 0.5)):
        await _report(world, name, {"attempt": 1, "metrics": [
            {"name": "loss", "value": scale / (step + 1), "step": step * 10} for step in range(12)
        ]})  # fmt: skip
    await _report(world, "sweep-a", {"attempt": 1, "summary": "<b>done</b>", "artifacts": [
        {"uri": "s3://bucket/sweep-a/model.pt", "size": 12}]})  # fmt: skip
    await page.goto(f"{world.url}/?namespace={world.namespace}")
    await _sign_in(page, world.token)
    key = f"{world.namespace}/sweep-a"

    async def listed() -> None:
        assert key in (await _snapshot(page))["runs"], "sweep-a not listed yet"

    await support.eventually(listed, what="sweep-a in the runs table")
    await _open(page, key)

    async def drawn() -> dict[str, Any]:
        seen = dict(await page.evaluate(CHARTS))
        assert seen["metrics"].get("loss", {}).get("points") == 12, seen
        assert seen["overlaid"] == {"sweep-a": 12, "sweep-b": 12}, seen
        return seen

    seen = await support.eventually(drawn, what="the loss chart and the experiment's overlay")
    assert seen["metrics"]["loss"]["line"] is True
    assert seen["metrics"]["loss"]["caption"].startswith("loss: 0.08333 at step 110")
    assert seen["artifacts"] == ["s3://bucket/sweep-a/model.pt"]
    assert seen["summary"] == "<b>done</b>"
    assert (seen["experiment"], seen["legend"]) == ("sweep", ["sweep-a", "sweep-b"])
    assert await page.evaluate("document.querySelector('#results-summary b')") is None
    assert page.problems() == []
