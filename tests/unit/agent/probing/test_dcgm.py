"""Parsing every dcgmi JSON layout 3.0-4.x (fixtures: tests/fixtures/dcgm/README.md), and a
fake dcgmi executable behind the runner."""

from __future__ import annotations

import asyncio
import datetime as dt
import pathlib

import pytest

from agent import readings
from agent.probing import dcgm

FIXTURES = pathlib.Path(__file__).parents[3] / "fixtures" / "dcgm"
T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
P, F, S, W = (
    readings.DiagStatus.PASS,
    readings.DiagStatus.FAIL,
    readings.DiagStatus.SKIP,
    readings.DiagStatus.WARN,
)


def parse(fixture: str, gpus: tuple[int, ...] = (0, 1)) -> readings.DiagResult:
    """Parse one fixture as a diagnostic of `gpus`."""
    text = (FIXTURES / fixture).read_text()
    return dcgm.parse_diag(text, level=1, started_at=T0, finished_at=T0, gpu_indices=gpus)


@pytest.mark.parametrize(
    ("fixture", "gpus", "layout", "version", "overall", "statuses"),
    [
        pytest.param("diag3.2_vc_r3_pass.json", (0,), "3.0-3.2", "", P, {0: P},
                     id="a captured 3.x level-3 pass passes its GPU"),
        pytest.param("diag3.2_vc_deployment_fail.json", (0,), "3.0-3.2", "", F, {0: P},
                     id="a captured 3.x deployment failure fails the run, not the GPU's tests"),
        pytest.param("diag_gcm_deployment_fail.json", (0, 1), "3.x", "", F, {0: F, 1: F},
                     id="gpus that ran only the deployment checks take their outcome"),
        pytest.param("diag3.3.1_deployment_fail.json", (0, 1), "3.3", "3.3.1", F, {0: P, 1: P},
                     id="3.3.1 deployment errors are read from result-level fields"),
        pytest.param("diag3.3.9_deployment_fail.json", (0, 3, 5), "3.3", "3.3.9", F,
                     {0: P, 3: P, 5: P},
                     id="3.3.9 deployment errors are not pinned on GPU 0"),
        pytest.param("diag3_fail.json", (0, 1), "3.3", "3.3.5", F, {0: P, 1: F},
                     id="a 3.3 per-GPU failure fails only its GPU"),
        pytest.param("diag4_pass.json", (0, 1), "4.x", "4.6.0", P, {0: P, 1: P},
                     id="a 4.x pass passes every GPU it names"),
        pytest.param("diag4_fail.json", (0, 1), "4.x", "4.6.0", F, {0: P, 1: F},
                     id="a 4.x entity failure fails only that entity"),
        pytest.param("diag4_summary_only_fail.json", (0, 1), "4.x", "4.6.0", F, {0: P, 1: P},
                     id="a 4.x failure only in test_summary fails the run, not a GPU"),
        pytest.param("diag4_iterations_fail.json", (0, 1), "4.x", "4.6.0", F, {0: P, 1: F},
                     id="with iterations the last run and Overall Result count"),
    ],
)  # fmt: skip
def test_parse_diag_layouts(  # noqa: PLR0917 - parametrized
    fixture: str,
    gpus: tuple[int, ...],
    layout: str,
    version: str,
    overall: readings.DiagStatus,
    statuses: dict[int, readings.DiagStatus],
) -> None:
    """Every layout gives the per-GPU outcome, the overall result and the DCGM version."""
    result = parse(fixture, gpus)
    assert (layout, version, overall) == (result.layout, result.dcgm_version, result.overall)
    assert statuses == {g.gpu_index: g.status for g in result.gpus}
    assert result.error == ""


def summary(findings: tuple[readings.DiagFinding, ...]) -> list[tuple[str, str, int | None]]:
    """(test, status, severity) of each finding."""
    return [(f.test, str(f.status), f.severity) for f in findings]


@pytest.mark.parametrize(
    ("fixture", "gpus", "node", "message"),
    [
        pytest.param("diag3.2_vc_r3_pass.json", (0,), [], "",
                     id="a pass has no node finding"),
        pytest.param("diag3.2_vc_deployment_fail.json", (0,),
                     [("CUDA Main Library", "Fail", None)], "Cannot open library libcuda.so",
                     id="3.0-3.2 warnings are one string, kept whole"),
        pytest.param("diag_gcm_deployment_fail.json", (0, 1),
                     [("Persistence Mode", "Fail", None), ("Environment Variables", "Warn", None)],
                     "", id="failed and warned deployment checks without a message"),
        pytest.param("diag3.3.1_deployment_fail.json", (0, 1),
                     [("Persistence Mode", "Fail", 5)], "Persistence mode for GPU 5 is disabled",
                     id="3.3.1 keeps every deployment error and its severity"),
        pytest.param("diag3.3.9_deployment_fail.json", (0, 3, 5),
                     [("Persistence Mode", "Fail", 5), ("Page Retirement/Row Remap", "Fail", 6)],
                     "GPU 5 had uncorrectable memory errors and row remapping failed",
                     id="3.3.9 deployment messages under DCGM's own warnings key are kept"),
        pytest.param("diag4_fail.json", (0, 1), [], "",
                     id="a 4.x error that an entity shows is not repeated from test_summary"),
        pytest.param("diag4_summary_only_fail.json", (0, 1), [("memory", "Fail", 1)],
                     "Unable to initialize CUDA library",
                     id="a 4.x error of no entity is a node finding"),
    ],
)  # fmt: skip
def test_findings_not_tied_to_a_gpu_are_node_findings(
    fixture: str, gpus: tuple[int, ...], node: list[tuple[str, str, int | None]], message: str
) -> None:
    """What names no GPU goes to `node_findings` with its message and severity intact."""
    result = parse(fixture, gpus)
    assert node == summary(result.node_findings)
    assert message in " ".join(f.message for f in result.node_findings)


def test_a_3_3_per_gpu_failure_keeps_its_error_fields() -> None:
    """The warning objects of 3.3 and 4.x give message, error id, category and severity."""
    (failed,) = [f for g in parse("diag3_fail.json").gpus for f in g.findings if f.status is F]
    expected = ("GPU Memory", "A pending retired page has been detected in GPU 1.", 6, 10, 6)
    assert expected == (failed.test, failed.message, failed.error_id, failed.category,
                        failed.severity)  # fmt: skip


def test_a_runtime_error_is_the_error_of_the_run() -> None:
    """4.x prints the version and the runtime error in the body; no GPU verdict comes of it."""
    result = parse("diag4_runtime_error.json")
    assert (result.dcgm_version, result.overall, result.gpus) == ("4.6.0", F, ())
    assert "unable to establish a connection" in result.error


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("not json", "invalid JSON", id="garbage is refused as invalid JSON"),
        pytest.param('{"x": 1}', "DCGM Diagnostic",
                     id="an unknown layout names the keys it wanted"),
        pytest.param('{"DCGM Diagnostic": {}}', "test_categories",
                     id="a body without tests names test_categories"),
        pytest.param("[1, 2]", "object at the top level", id="a list is refused"),
        pytest.param('{"iterations": [1]}', "iterations", id="iterations without objects"),
    ],
)  # fmt: skip
def test_parse_diag_errors_name_the_problem(text: str, field: str) -> None:
    """Unreadable output raises DcgmError naming what is missing."""
    with pytest.raises(dcgm.DcgmError, match=field):
        dcgm.parse_diag(text, level=1, started_at=T0, finished_at=T0)


def test_a_captured_healthy_node_lists_no_gpu() -> None:
    """The real healthy output has only the overall value."""
    check = dcgm.parse_health((FIXTURES / "health_pass.json").read_text(), at=T0)
    assert (check.overall, check.gpus, check.others) == ("Healthy", (), ())


def test_health_incidents_are_joined_back_from_their_overflow_pieces() -> None:
    """One incident per system, its 54-character pieces joined with a space."""
    check = dcgm.parse_health((FIXTURES / "health_fail.json").read_text(), at=T0)
    (gpu,) = check.gpus
    expected = (
        "Memory system: GPU 1 had 2 uncorrectable remapped rows, and a row remapping failure; "
        "reset the GPU and contact support"
    )
    assert (gpu.gpu_index, gpu.value) == (1, "Failure")
    assert expected == gpu.incidents[0]
    assert len(gpu.incidents) == 2


def test_a_switch_failure_is_a_node_health_failure() -> None:
    """Entities that are not GPUs are reported apart, never as GPU 0."""
    check = dcgm.parse_health((FIXTURES / "health_switch_fail.json").read_text(), at=T0)
    assert check.gpus == ()
    (switch,) = check.others
    assert (switch.entity, switch.value) == ("Switch 0", "Failure")
    assert "Port 12 encountered an uncorrectable error" in switch.incidents[0]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("Healthy", "Healthy", id="healthy"),
        pytest.param("Warning", "Warning", id="warning"),
        pytest.param("Failure", "Failure", id="failure"),
        pytest.param("Internal error", "Unknown", id="an internal error is unknown, not healthy"),
    ],
)
def test_health_values(value: str, expected: readings.HealthValue) -> None:
    """DCGM's four health strings."""
    text = '{"body": {"Overall Health": {"value": "%s"}}}' % value  # noqa: UP031 - JSON braces
    assert expected == dcgm.parse_health(text, at=T0).overall


@pytest.fixture
def fake_dcgmi(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Point the environment at the fake dcgmi's fixtures; return its argv log."""
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_DCGMI_LOG", str(log))
    monkeypatch.setenv("FAKE_DCGMI_DIAG", str(FIXTURES / "diag4_fail.json"))
    monkeypatch.setenv("FAKE_DCGMI_HEALTH", str(FIXTURES / "health_fail.json"))
    return log


def argv(log: pathlib.Path) -> list[str]:
    """The fake dcgmi's calls, one argv per line."""
    return log.read_text().splitlines()


def client(timeout_s: float = 30.0) -> dcgm.Dcgm:
    """A Dcgm runner on the fake executable."""
    return dcgm.Dcgm(
        str(FIXTURES / "fake_dcgmi.py"),
        "10.0.0.9:5555",
        command_timeout_s=timeout_s,
        diag_timeout_s=lambda _level: timeout_s,
    )


async def test_watches_are_set_before_health_is_read(fake_dcgmi: pathlib.Path) -> None:
    """Arming sets `health -s a` on the configured hostengine; reads use `health -c -j`."""
    runner = client()
    assert await runner.arm() == (True, "health watches set")
    check = await runner.health()
    assert check.overall == "Failure"
    lines = argv(fake_dcgmi)
    assert lines == ["health -s a --host 10.0.0.9:5555", "health -c -j --host 10.0.0.9:5555"]


async def test_one_diagnostic_at_a_time(
    fake_dcgmi: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second diagnostic while one runs is refused as busy."""
    monkeypatch.setenv("FAKE_DCGMI_SLEEP_S", "1")
    runner = client()
    first = asyncio.create_task(runner.diag(1, (0, 1)))
    deadline = asyncio.get_running_loop().time() + 30
    while not runner.diag_running and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    with pytest.raises(dcgm.DiagBusyError):
        await runner.diag(1)
    result = await first
    assert result.overall is F
    assert "diag -r 1 -j --host 10.0.0.9:5555" in argv(fake_dcgmi)


async def test_a_diagnostic_past_its_timeout_is_killed_and_reported(
    fake_dcgmi: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-level timeout ends the run and the result carries the error, not a GPU verdict."""
    monkeypatch.setenv("FAKE_DCGMI_SLEEP_S", "30")
    result = await client(timeout_s=0.5).diag(2)
    assert "timed out" in result.error
    assert result.gpus == ()


async def test_absent_dcgmi_is_reported_not_raised() -> None:
    """Without dcgmi the runner says so and stays unavailable."""
    runner = dcgm.Dcgm(
        "/nonexistent/dcgmi", "localhost", command_timeout_s=1, diag_timeout_s=lambda _: 1
    )
    ok, detail = await runner.arm()
    assert not ok
    assert "dcgmi is not installed" in detail
    assert "not found" in runner.missing


@pytest.mark.parametrize(
    ("setup", "problem"),
    [
        pytest.param("down", "unable to establish a connection",
                     id="a host engine that does not answer"),
        pytest.param("restarted", "Health watches not enabled",
                     id="a host engine that restarted and forgot the watches"),
    ],
)  # fmt: skip
async def test_a_health_read_that_is_not_json_is_an_error_naming_dcgmis_words(
    fake_dcgmi: pathlib.Path,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
    problem: str,
) -> None:
    """dcgmi's plain-text errors (nonzero exit) raise DcgmError with its own text."""
    monkeypatch.setenv("FAKE_DCGMI_STATE", str(tmp_path / "engine"))
    if setup == "down":
        monkeypatch.setenv("FAKE_DCGMI_DOWN", str(tmp_path / "down"))
        (tmp_path / "down").touch()
    with pytest.raises(dcgm.DcgmError, match=problem):
        await client().health()
