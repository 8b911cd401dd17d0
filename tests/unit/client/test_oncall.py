"""The on-call verbs: each calls the fleet API's path with its body (controller/fleet/api.py)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.client import stub

NODE = {
    "name": "gpu-1", "state": "Failed", "reason": "XidFallenOffBus", "message": "GPU 3 lost",
    "lastHeartbeat": "2026-01-01T00:00:00.123Z", "bootId": "b", "agentUrl": "", "managed": True,
    "unschedulable": True, "cordonedByUs": True, "tainted": True, "gpuCapacity": 8,
    "quarantine": {"mode": "Quarantined", "by": "taugrid", "at": "2026-01-01T00:00:01Z",
                   "reason": "XidFallenOffBus", "clearsWith": "NewBootId", "evictAfter": None},
    "inCluster": True, "fencedGpus": 0, "devices": [], "problems": [], "condition": None,
    "gpus": [{"index": 3, "uuid": "GPU-3", "verdict": "Failed", "action": "RebootNode",
              "reasons": [{"code": "XidFallenOffBus", "latched": True}]}],
    "history": [{"at": "2026-01-01T00:00:01Z", "action": "Quarantine", "by": "taugrid",
                 "reason": "XidFallenOffBus", "message": ""}],
}  # fmt: skip
"""A node as GET /v1/nodes/{name} answers (fleet/schemas.py NodeDetail), hand-made."""
FLEET = {
    "leader": "controller-0", "dryRun": False,
    "breaker": {"open": True, "openedAt": "2026-01-01T00:00:00Z", "message": "4 of 10 nodes bad",
                "resetAt": None, "resetBy": "", "fleetHealthySince": None},
    "nodes": 10, "quarantined": 1, "maxQuarantined": 2, "states": {"Failed": 1, "Healthy": 9},
    "devices": {"gpuMode": "device-plugin"},
}  # fmt: skip
"""GET /v1/fleet's answer (fleet/schemas.py FleetView), hand-made."""


@pytest.fixture
def controller(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> Iterator[stub.Controller]:
    """A loopback controller answering the fleet API."""
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_TOKEN_FILE", "TAU_NAMESPACE", "TAU_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    server = stub.Controller()
    server.routes[("GET", "/v1/nodes")] = (200, {"items": [NODE]}, {})
    server.routes[("GET", "/v1/nodes/gpu-1")] = (200, NODE, {})
    server.routes[("GET", "/v1/nodes/gpu-1/gpus")] = (200, {"gpus": []}, {})
    server.routes[("POST", "/v1/nodes/gpu-1/diag")] = (202, {"started": True, "level": 2}, {})
    server.routes[("POST", "/v1/nodes/gpu-1/agent/release")] = (
        200, {"released": [{"gpuUuid": "GPU-3", "code": "RowRemapFailure"}]}, {},
    )  # fmt: skip
    server.routes[("POST", "/v1/nodes/gpu-1/quarantine")] = (200, NODE, {})
    server.routes[("DELETE", "/v1/nodes/gpu-1/quarantine")] = (
        200,
        {**NODE, "quarantine": None},
        {},
    )
    for method, path in (("GET", "/v1/fleet"), ("POST", "/v1/fleet/breaker/reset"),
                         ("PUT", "/v1/fleet/mode")):  # fmt: skip
        server.routes[(method, path)] = (200, FLEET, {})
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["nodes"], ("GET", "/v1/nodes", {}, None), id="tau nodes lists the nodes"),
        pytest.param(["nodes", "--state", "Failed"],
                     ("GET", "/v1/nodes", {"state": "Failed"}, None),
                     id="tau nodes --state filters on the server"),
        pytest.param(["node", "gpu-1"], ("GET", "/v1/nodes/gpu-1", {}, None),
                     id="tau node NAME reads one node"),
        pytest.param(["node", "gpu-1", "--agent"], ("GET", "/v1/nodes/gpu-1/gpus", {}, None),
                     id="tau node --agent reads the agent's view through the controller"),
        pytest.param(["quarantine", "gpu-1", "--reason", "bad fan"],
                     ("POST", "/v1/nodes/gpu-1/quarantine", {}, {"reason": "bad fan"}),
                     id="tau quarantine posts the reason"),
        pytest.param(["release", "gpu-1", "--reason", "fan replaced"],
                     ("DELETE", "/v1/nodes/gpu-1/quarantine", {}, {"reason": "fan replaced"}),
                     id="tau release deletes the quarantine with the reason"),
        pytest.param(["fleet"], ("GET", "/v1/fleet", {}, None), id="tau fleet reads the fleet"),
        pytest.param(["breaker-reset", "--reason", "driver rolled back"],
                     ("POST", "/v1/fleet/breaker/reset", {}, {"reason": "driver rolled back"}),
                     id="tau breaker-reset posts the reset with the reason"),
        pytest.param(["diag", "gpu-1", "--level", "2"],
                     ("POST", "/v1/nodes/gpu-1/diag", {"level": "2"}, None),
                     id="tau diag asks the controller to start the agent's diagnostic"),
        pytest.param(["diag", "gpu-1"], ("POST", "/v1/nodes/gpu-1/diag", {"level": "1"}, None),
                     id="tau diag runs level 1 by default"),
        pytest.param(["release-latch", "gpu-1"],
                     ("POST", "/v1/nodes/gpu-1/agent/release", {}, None),
                     id="tau release-latch releases Inspect faults through the controller"),
        pytest.param(["release-latch", "gpu-1", "--gpu", "3", "--code", "RowRemapFailure",
                      "--force"],
                     ("POST", "/v1/nodes/gpu-1/agent/release",
                      {"gpu": "3", "code": "RowRemapFailure", "force": "true"}, None),
                     id="tau release-latch passes the GPU, the code and force"),
        pytest.param(["dry-run", "on"], ("PUT", "/v1/fleet/mode", {}, {"dryRun": True}),
                     id="tau dry-run on puts dryRun true"),
        pytest.param(["dry-run", "off"], ("PUT", "/v1/fleet/mode", {}, {"dryRun": False}),
                     id="tau dry-run off puts dryRun false"),
    ],
)  # fmt: skip
def test_each_on_call_verb_calls_its_path_with_its_body(
    argv: list[str], expected: tuple[str, str, dict[str, str], Any], controller: stub.Controller
) -> None:
    """The paths and bodies of controller/fleet/api.py, exactly."""
    code = stub.tau_client().main(["--url", controller.url, *argv])
    last = controller.seen[-1]
    actual = (last.method, last.path, last.query, json.loads(last.body) if last.body else None)
    assert (0, expected) == (code, actual)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        pytest.param(["nodes"], ("gpu-1", "Failed", "XidFallenOffBus", "Quarantined by taugrid"),
                     id="tau nodes prints state, reason and quarantine"),
        pytest.param(["node", "gpu-1"], ("GPU-3", "RebootNode", "(latched)", "NewBootId"),
                     id="tau node prints the GPUs, latched faults and what clears it"),
        pytest.param(["fleet"], ("OPEN: 4 of 10 nodes bad", "1 of at most 2"),
                     id="tau fleet says the breaker is open and why"),
        pytest.param(["release", "gpu-1", "--reason", "r"], ("not quarantined",),
                     id="tau release says the node is free"),
        pytest.param(["diag", "gpu-1", "--level", "2"], ("level 2 diagnostic started",
                                                         "tau node gpu-1 --agent"),
                     id="tau diag says where the result will be"),
        pytest.param(["release-latch", "gpu-1"], ("released RowRemapFailure on GPU-3",
                                                  "tau release gpu-1"),
                     id="tau release-latch names what it released and the next step"),
    ],
)  # fmt: skip
def test_on_call_answers_read_at_3_am(
    argv: list[str], needles: tuple[str, ...], controller: stub.Controller,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The printed answer carries what on-call decides on."""
    stub.tau_client().main(["--url", controller.url, *argv])
    out = capsys.readouterr().out
    missing: list[str] = []
    assert missing == [n for n in needles if n not in out]


def test_quarantine_without_a_reason_is_refused(
    controller: stub.Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API requires a reason; tau asks for it before calling."""
    with pytest.raises(SystemExit) as exit_:
        stub.tau_client().main(["--url", controller.url, "quarantine", "gpu-1"])
    expected: tuple[Any, bool, list[stub.Seen]] = (2, True, [])
    assert expected == (exit_.value.code, "--reason" in capsys.readouterr().err, controller.seen)


def test_breaker_reset_without_a_reason_is_refused(
    controller: stub.Controller, capsys: pytest.CaptureFixture[str]
) -> None:
    """tau asks for the reason the breaker may close before calling."""
    with pytest.raises(SystemExit) as exit_:
        stub.tau_client().main(["--url", controller.url, "breaker-reset"])
    expected: tuple[Any, bool, list[stub.Seen]] = (2, True, [])
    assert expected == (exit_.value.code, "--reason" in capsys.readouterr().err, controller.seen)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["diag", "gpu-1"], id="tau diag"),
        pytest.param(["release-latch", "gpu-1"], id="tau release-latch"),
    ],
)
def test_agent_actions_on_an_older_controller_say_so_and_call_nothing(
    argv: list[str], controller: stub.Controller, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Where the controller does not offer the call (no path in its OpenAPI), tau says so
    and posts nothing."""
    monkeypatch.setitem(stub.OPENAPI, "paths", {})
    code = stub.tau_client().main(["--url", controller.url, *argv])
    posted = [s for s in controller.seen if s.method == "POST"]
    expected: tuple[int, bool, list[stub.Seen]] = (7, True, [])
    assert expected == (code, "upgrade it" in capsys.readouterr().err, posted)


def test_node_agent_on_an_older_controller_says_so(
    controller: stub.Controller, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the controller does not relay the agent (no path in its OpenAPI), tau says so."""
    monkeypatch.setitem(stub.OPENAPI, "paths", {})
    code = stub.tau_client().main(["--url", controller.url, "node", "gpu-1", "--agent"])
    expected = (7, True)
    assert expected == (code, "does not relay" in capsys.readouterr().err)
