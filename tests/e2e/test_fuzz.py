"""Schemathesis over `/openapi.json` against a real controller on the dev cluster
(DESIGN.md section 4): no 5xx, no answer outside its declared schema or status, and the
controller keeps answering `/healthz` throughout.

The run is bounded and reproducible: one seed, a time budget, and chosen phases:
- `coverage`: schemathesis' deterministic boundary and negative values for every
  parameter and body (it ignores `max-examples`, so its size is the document's);
- `fuzzing`: random cases until the time budget is spent.
`examples` has nothing to run (the document carries no examples) and `stateful` nothing to
follow (no links), so both stay off.

Each operation gets the credential it needs (a researcher of namespace A, the run's own
token for its checkpoints and results, an on-call engineer, the node's agent); submissions
are dry runs and reruns name a run that does not exist, so fuzzing creates no Jobs;
heartbeats name the agent's own node and a current `sentAt`, so they reach the ingest path.
A second, tokenless pass sends no credential and generates no security parameters: every
operation must say 401 (or serve, when public). Object-level
authorization between two researchers is the hostile corpus' deterministic matrix
(tests/integration/controller/test_hostile.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import pathlib
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import openapi
from devcluster import cluster
from tests import worldkit

pytestmark = pytest.mark.cluster

SEED = 1401
MAX_TIME_S = 90
"""The authenticated pass' budget: coverage first, then fuzzing until it is spent."""
TOKENLESS_MAX_TIME_S = 20
REQUEST_TIMEOUT_S = 20
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "ignored_auth",
    "unsupported_method",
)
REJECTIONS = [400, 401, 403, 404, 405, 409, 413, 415, 422, 429]
"""What a refusal of invalid data may be (schemathesis' default, with 413)."""
CREDENTIALS = {
    "researcher_a": (
        "createRun", "listRuns", "getRun", "cancelRun", "getRunLogs", "getRunEvidence",
        "resumeRun", "rerunRun", "listQueues", "listExperiments", "compareRuns",
    ),
    "run_token": (
        "reportCheckpoint", "listCheckpoints", "getLatestCheckpoint", "reportResults",
        "getResults",
    ),
    "oncall": (
        "listNodes", "getNode", "quarantineNode", "releaseNode", "getFleet", "resetBreaker",
        "setFleetMode", "getNodeAgentGpus", "runNodeDiagnostic", "releaseNodeAgentLatch",
    ),
    "agent": ("postHeartbeat",),
    "peer": ("postPeerHeartbeats",),
}  # fmt: skip
"""Which credential each authenticated operation is fuzzed with."""
GATEWAY = ("getNodeAgentGpus", "runNodeDiagnostic", "releaseNodeAgentLatch")
"""Calls the controller relays to a node's agent. The world's agents are scripted, with no
pod IP to call, so past validation and authorisation these answer their documented 502
`AgentUnreachable` (or 504): those two statuses are the expected answers here, a 500 is not."""


@pytest_asyncio.fixture(scope="module")
async def w(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> AsyncIterator[worldkit.World]:
    async with worldkit.world(k8s, dev_cluster, bin_dir, "fuzz") as world:
        yield world


def _toml(value: Any) -> str:
    """A TOML value (strings, numbers, booleans, lists and inline tables are all we need)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    msg = f"cannot write {value!r} as TOML"
    raise TypeError(msg)


def _config(w: worldkit.World, cache: pathlib.Path, *, tokenless: bool) -> str:
    """schemathesis.toml: the budget, and per operation its credential and pinned values.
    Nothing is kept between runs (no example database, the cache in the test's own
    directory), so a run depends on the seed alone, not on what an earlier one found."""
    lines = [
        f"seed = {SEED}",
        f"request-timeout = {REQUEST_TIMEOUT_S}",
        "workers = 1",
        "",
        "[cache]",
        f"directory = {_toml(str(cache))}",
        "",
        "[generation]",
        "with-security-parameters = false",
        'database = "none"',
        "",
        # A body over the 1 MiB limit is refused with 413 before it is read: a rejection too
        # (the schema allows 1024 arguments of 64 KiB each, the body limit does not).
        "[checks.negative_data_rejection]",
        f"expected-statuses = {_toml(REJECTIONS)}",
        "",
    ]
    if tokenless:
        return "\n".join(lines)
    pinned: dict[str, dict[str, Any]] = {
        "createRun": {"query.dryRun": True, "query.namespace": w.ns_a},
        "listRuns": {"namespace": w.ns_a},
        "listQueues": {"namespace": w.ns_a},
        "reportCheckpoint": {"path.namespace": w.ns_a, "path.name": w.run},
        "listCheckpoints": {"path.namespace": w.ns_a, "path.name": w.run},
        "getLatestCheckpoint": {"path.namespace": w.ns_a, "path.name": w.run},
        "reportResults": {"path.namespace": w.ns_a, "path.name": w.run},
        "getResults": {"path.namespace": w.ns_a, "path.name": w.run},
        # A rerun creates a run (and its Job) and has no dry run: fuzz it against a run
        # that does not exist, so it answers, validates and refuses, but creates nothing.
        "rerunRun": {"path.namespace": w.ns_a, "path.name": "no-such-run"},
        "listExperiments": {"namespace": w.ns_a},
        "compareRuns": {"namespace": w.ns_a},
        "postHeartbeat": {
            "body.nodeName": w.node,
            "body.sentAt": dt.datetime.now(dt.UTC).isoformat(),
        },
    }
    for credential, operations in CREDENTIALS.items():
        token = getattr(w, credential)
        for operation in operations:
            lines += [
                "[[operations]]",
                f"include-operation-id = {_toml(operation)}",
                f"headers = {_toml({'Authorization': f'Bearer {token}'})}",
            ]
            if operation in pinned:
                lines.append(f"parameters = {_toml(pinned[operation])}")
            if operation in GATEWAY:
                statuses = ["2xx", "3xx", "4xx", "502", "504"]
                lines.append(
                    "checks = { not_a_server_error = { expected-statuses = "
                    f"{_toml(statuses)} }} }}"
                )
            lines.append("")
    return "\n".join(lines)


async def _schemathesis(
    w: worldkit.World, config: pathlib.Path, report: pathlib.Path, *args: str
) -> tuple[int, str, float]:
    """Run the schemathesis CLI against the world's controller; rc, output, seconds."""
    command = [
        str(pathlib.Path(sys.executable).parent / "schemathesis"),
        "--config-file", str(config), "--no-color",
        "run", f"{w.url}/openapi.json", "--url", w.url,
        "--report", "junit", "--report-junit-path", str(report), *args,
    ]  # fmt: skip
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return int(proc.returncode or 0), out.decode(errors="replace"), time.monotonic() - started


@contextlib.asynccontextmanager
async def _watching_health(w: worldkit.World) -> AsyncIterator[list[str]]:
    """Ask /healthz every half second while the block runs; yield the failures seen."""
    failures: list[str] = []
    asked = [0]

    async def watch() -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                asked[0] += 1
                try:
                    async with http.get(
                        f"{w.url}/healthz", timeout=aiohttp.ClientTimeout(total=5)
                    ) as resp:
                        if resp.status != 200:
                            failures.append(f"/healthz answered {resp.status}")
                except (aiohttp.ClientError, TimeoutError) as err:
                    failures.append(f"/healthz did not answer: {err!r}")
                await asyncio.sleep(0.5)

    task = asyncio.create_task(watch())
    try:
        yield failures
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if asked[0] < 2:
            failures.append("/healthz was asked fewer than twice")


async def test_every_authenticated_operation_has_a_credential(w: worldkit.World) -> None:
    """A new operation cannot escape fuzzing for want of a token: each bearer operation of
    the document is in CREDENTIALS, and nothing else is."""
    doc = openapi.document(w.controller.app)
    bearer = {
        op["operationId"]
        for item in doc["paths"].values()
        for op in item.values()
        if op["security"]
    }
    assert bearer == {op for ops in CREDENTIALS.values() for op in ops}


async def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    w: worldkit.World, tmp_path: pathlib.Path
) -> None:
    """The authenticated pass (coverage, then fuzzing until MAX_TIME_S) and the tokenless
    pass both end clean, and /healthz answers throughout."""
    results = {}
    async with _watching_health(w) as health:
        for name, tokenless, phases, budget in (
            ("authenticated", False, "coverage,fuzzing", MAX_TIME_S),
            ("tokenless", True, "fuzzing", TOKENLESS_MAX_TIME_S),
        ):
            config = tmp_path / f"{name}.toml"
            config.write_text(_config(w, tmp_path / "cache", tokenless=tokenless), "utf-8")
            checks = ",".join(c for c in CHECKS if not (tokenless and c == "ignored_auth"))
            rc, out, seconds = await _schemathesis(
                w, config, tmp_path / f"{name}.xml",
                "--phases", phases, "--max-time", str(budget), "--checks", checks,
            )  # fmt: skip
            print(f"schemathesis {name}: rc={rc} in {seconds:.0f}s\n{out if rc else out[-3000:]}")
            results[name] = rc
    expected = {"results": {"authenticated": 0, "tokenless": 0}, "health": []}
    assert expected == {"results": results, "health": health}
    assert await w.healthy()
