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


# ---------------------------------------------------------------------- logs and actions
KWOK_LOGS = ("kwok.x-k8s.io", "v1alpha1")
HOSTILE_LOG = [
    "epoch 1 loss 0.9",
    "<img id=logged src=x onerror=document.title='pwned'>",
    "\x1b[31mred\x1b[0m \x1b]0;retitled\x07plain \x1b[2K\x1b[1Gprogress 100%",
]
"""A log with markup and terminal escapes: the page must show markup as text, escapes gone."""

LOGS = """(() => {
  const pre = document.getElementById("logs");
  const note = document.getElementById("logs-note");
  const error = document.getElementById("logs-error");
  return {
    shown: !pre.hidden, text: pre.textContent, state: pre.dataset.state || null,
    source: pre.dataset.source || null, lines: Number(pre.dataset.lines || 0),
    note: note.hidden ? null : note.textContent,
    error: error.hidden ? null : { status: error.dataset.status, text: error.textContent },
    injected: document.getElementById("logged") !== null, title: document.title,
  };
})()"""
"""The log view of the open run, as the page shows it."""

CONFIRM = """(() => {
  const d = document.getElementById("confirm");
  const e = document.getElementById("confirm-error");
  return { open: d.open, title: document.getElementById("confirm-title").textContent,
    error: e.hidden ? null : { status: e.dataset.status || null, text: e.textContent },
    status: document.getElementById("action-status").textContent };
})()"""
"""The confirmation dialog and the last action's outcome."""


async def _run_pod(w: World, run: str) -> str:
    """The name of the run's running pod."""

    async def probe() -> str:
        pods = await client.CoreV1Api(w.api).list_namespaced_pod(
            w.namespace, label_selector=f"taugrid.dev/run={run}"
        )
        running = [p.metadata.name for p in pods.items if p.status.phase == "Running"]
        assert running, "no running pod yet"
        return str(running[0])

    return await support.eventually(probe, what=f"a running pod of {run}")


@contextlib.asynccontextmanager
async def _served_log(
    w: World, dev: cluster.Cluster, run: str, *lines: str
) -> AsyncIterator[pathlib.Path]:
    """Make KWOK serve `lines` as the run pod's log, following the file (as a kubelet does);
    yield the file, so a test can append to it."""
    pod = await _run_pod(w, run)
    with cluster.pod_log_file(dev, w.namespace, pod, "main") as path:
        cluster.append_log(path, *lines)
        await client.CustomObjectsApi(w.api).create_namespaced_custom_object(
            *KWOK_LOGS, w.namespace, "logs", cluster.kwok_logs_object(w.namespace, pod, "main",
                                                                       path),
        )  # fmt: skip
        yield path


async def _log_served(w: World, run: str, line: str, source: str = "live", **params: str) -> None:
    """Poll the API (not the page) until the run's log has `line`: the page is then asked
    once, so it meets no "not yet" answers (KWOK picks the Logs object up asynchronously,
    the kept tail is written by the controller's own loop)."""

    async def probe() -> None:
        async with w.http.get(f"{w.url}/v1/runs/{w.namespace}/{run}/logs", params=params,
                              headers={"Authorization": f"Bearer {w.token}"}) as resp:  # fmt: skip
            text = await resp.text()
            served = resp.headers.get("X-TauGrid-Log-Source", "live")
            if resp.status != 200 or line not in text or served != source:
                raise support.NotYetError(f"{resp.status} ({served}): {text[-200:]}")

    await support.eventually(probe, what=f"{run}'s log to hold {line!r}")


async def _logs_show(page: browser.Page, *wanted: str, state: str) -> dict[str, Any]:
    """Poll the log view until every `wanted` line is shown and it is in `state`."""

    async def probe() -> dict[str, Any]:
        seen = dict(await page.evaluate(LOGS))
        assert seen["error"] is None, seen["error"]
        for line in wanted:
            assert line in seen["text"].split("\n"), seen
        assert seen["state"] == state, seen
        return seen

    return await support.eventually(probe, what=f"the log view to show {wanted}")


async def _signed_in_on_run(page: browser.Page, w: World, token: str) -> None:
    await page.goto(f"{w.url}/?namespace={w.namespace}")
    await _sign_in(page, token)
    key = f"{w.namespace}/{RUN}"

    async def listed() -> None:
        runs = (await _snapshot(page))["runs"]
        assert runs.get(key, {}).get("phase") == "Running", runs

    await support.eventually(listed, what=f"{key} running in the runs table")
    await _open(page, key)


async def test_a_runs_log_is_followed_live_shown_as_text_and_the_stream_ends_on_close(
    page: browser.Page, world: World, dev_cluster: cluster.Cluster
) -> None:
    """The open run's log appears under its detail, markup shown as text and terminal escapes
    stripped; a line the worker prints later arrives by itself (the stream follows); closing
    the run's detail aborts the stream."""
    async with _served_log(world, dev_cluster, RUN, *HOSTILE_LOG) as log_file:
        await _log_served(world, RUN, "epoch 1 loss 0.9")
        await _signed_in_on_run(page, world, world.token)
        await page.click("#logs-show")
        seen = await _logs_show(page, "epoch 1 loss 0.9", state="following")
        assert HOSTILE_LOG[1] in seen["text"].split("\n"), "the markup was not shown verbatim"
        assert "red plain progress 100%" in seen["text"].split("\n"), seen["text"]
        assert "\x1b" not in seen["text"]
        assert "\x07" not in seen["text"]
        assert (seen["injected"], seen["title"]) == (False, "TauGrid"), "log text became markup"
        assert seen["source"] == "live"
        cluster.append_log(log_file, "epoch 2 loss 0.5")
        await _logs_show(page, "epoch 1 loss 0.9", "epoch 2 loss 0.5", state="following")
        await page.click("#run-detail-close")
        after = dict(await page.evaluate(LOGS))
        assert after["state"] == "stopped", after
    assert page.problems() == []


async def test_cancel_from_the_page_ends_the_run_cancelled_and_its_kept_log_is_shown(
    page: browser.Page, world: World, dev_cluster: cluster.Cluster
) -> None:
    """Cancel asks first; confirmed, the run ends Cancelled and the button goes; its pod
    gone, the log view shows the tail the controller kept, marked as kept."""
    async with _served_log(world, dev_cluster, RUN, "step 1 of 3", "step 2 of 3"):
        await _log_served(world, RUN, "step 2 of 3")
        await _signed_in_on_run(page, world, world.token)
        await page.click("#cancel-run")
        asked = dict(await page.evaluate(CONFIRM))
        assert (asked["open"], asked["title"]) == (True, f"Cancel run {world.namespace}/{RUN}?")
        await page.click("#confirm-ok")

        async def cancelled() -> None:
            shown = await page.evaluate(
                "[document.getElementById('run-detail').dataset.phase,"
                " document.getElementById('cancel-run').hidden]"
            )
            assert shown == ["Cancelled", True], shown

        await support.eventually(cancelled, what="the run Cancelled on the page")
        done = dict(await page.evaluate(CONFIRM))
        assert (done["open"], done["status"]) == (False, f"Run {world.namespace}/{RUN} cancelled.")
        await _log_served(world, RUN, "step 2 of 3", source="kept", attempt="1")
        await page.click("#logs-show")
        seen = await _logs_show(page, "step 1 of 3", "step 2 of 3", state="ended")
        assert seen["source"] == "kept", seen
        assert "The tail the controller kept of pod" in (seen["note"] or ""), seen
    assert page.problems() == []


async def _confirm_with_reason(page: browser.Page, reason: str) -> None:
    await page.type_into("#confirm-reason", reason)
    await page.click("#confirm-ok")


async def test_on_call_quarantines_and_releases_a_node_from_the_page_with_a_reason(
    page: browser.Page, world: World
) -> None:
    """Quarantine asks for a reason and refuses none; with one, the node shows Manual and
    cordoned; Release (with a reason) returns it to none and uncordoned."""
    node = world.nodes[0]
    await page.goto(f"{world.url}/?namespace={world.namespace}")
    await _sign_in(page, world.token)
    await _shows_fleet_and_run(page, world)
    await page.click(f'[data-node-action="quarantine"][data-action-node="{node}"]')
    await page.click("#confirm-ok")
    empty = dict(await page.evaluate(CONFIRM))
    assert empty["open"] is True
    assert empty["error"] == {"status": None, "text": "Give a reason: it is kept with the change."}
    await _confirm_with_reason(page, "web test: suspect NVLink")

    async def state(quarantine: str, cordoned: str) -> None:
        seen = (await _snapshot(page))["nodes"][node]
        assert (seen["quarantine"], seen["cordoned"]) == (quarantine, cordoned), seen

    await support.eventually(lambda: state("Manual", "true"), what=f"{node} quarantined")
    assert (await page.evaluate(CONFIRM))["status"] == f"Node {node} quarantined."
    await page.click(f'[data-node-action="release"][data-action-node="{node}"]')
    await _confirm_with_reason(page, "web test: NVLink fine")
    await support.eventually(lambda: state("none", "false"), what=f"{node} released")
    assert page.problems() == []


async def test_an_on_call_action_with_a_researcher_token_says_it_lacks_the_role(
    page: browser.Page, world: World
) -> None:
    """A researcher's token cannot read the fleet, yet the on-call buttons are offered (the
    API decides): turning dry run on is refused with a 403 shown in words in the dialog, and
    the fleet is unchanged."""
    await page.goto(f"{world.url}/?namespace={world.namespace}")
    await _sign_in(page, world.researcher)

    async def refused_fleet() -> None:
        assert "fleet-error" in (await _snapshot(page))["errors"]

    await support.eventually(refused_fleet, what="the fleet refused to a researcher")

    async def asking() -> None:
        # The page's refresh may redraw the panel under the first click (seen once in CI):
        # click until the dialog is open, as a person would.
        if not (await page.evaluate(CONFIRM))["open"]:
            await page.click("#dry-run-on")
        assert (await page.evaluate(CONFIRM))["open"] is True

    await support.eventually(asking, what="the dry-run dialog open")
    await page.click("#confirm-ok")

    async def refused() -> dict[str, Any]:
        seen = dict(await page.evaluate(CONFIRM))
        assert seen["error"] is not None, seen
        return seen

    seen = await support.eventually(refused, what="the refusal in the dialog")
    assert seen["open"] is True
    assert seen["error"]["status"] == "403"
    assert seen["error"]["text"].startswith("Refused (403): your token lacks the on-call role")
    await page.click("#confirm-back")
    assert (await page.evaluate(CONFIRM))["open"] is False
    oncall = {"Authorization": f"Bearer {world.token}"}
    async with world.http.get(f"{world.url}/v1/fleet", headers=oncall) as resp:
        assert resp.status == 200
        assert (await resp.json())["dryRun"] is False
    refusals = re.compile(r"status of 403 .*/v1/(fleet|nodes)\b")
    assert [p for p in page.problems() if not refusals.search(p)] == []
