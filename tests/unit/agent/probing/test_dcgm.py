"""Parsing dcgmi JSON (3.x and 4.x layouts, synthesized fixtures) and running a fake dcgmi."""

from __future__ import annotations

import asyncio
import datetime as dt
import pathlib

import pytest

from agent import readings
from agent.probing import dcgm

FIXTURES = pathlib.Path(__file__).parents[3] / "fixtures" / "dcgm"
T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
P, F, S = readings.DiagStatus.PASS, readings.DiagStatus.FAIL, readings.DiagStatus.SKIP


@pytest.mark.parametrize(
    ("fixture", "overall", "statuses", "severity"),
    [
        pytest.param("diag4_pass.json", P, {0: P, 1: P}, None,
                     id="a passing 4.x diagnostic passes every GPU it names"),
        pytest.param("diag4_fail.json", F, {0: P, 1: F}, 6,
                     id="a failing 4.x diagnostic fails only the GPU its result names"),
        pytest.param("diag3_fail.json", F, {0: P, 1: F}, None,
                     id="a failing 3.x diagnostic is read from gpu_id results"),
    ],
)  # fmt: skip
def test_parse_diag_layouts(
    fixture: str,
    overall: readings.DiagStatus,
    statuses: dict[int, readings.DiagStatus],
    severity: int | None,
) -> None:
    """Both JSON layouts give the same per-GPU outcome."""
    result = dcgm.parse_diag(
        (FIXTURES / fixture).read_text(),
        level=1,
        started_at=T0,
        finished_at=T0,
        gpu_indices=(0, 1),
    )
    assert result.overall == overall
    assert {g.gpu_index: g.status for g in result.gpus} == statuses
    failed = [f for g in result.gpus for f in g.findings if f.status is F]
    if overall is F:
        assert failed
        assert failed[0].severity == severity


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("not json", "invalid JSON", id="garbage is refused as invalid JSON"),
        pytest.param('{"x": 1}', "DCGM Diagnostic",
                     id="an unknown layout names the keys it wanted"),
        pytest.param('{"DCGM Diagnostic": {}}', "test_categories",
                     id="a body without tests names test_categories"),
    ],
)  # fmt: skip
def test_parse_diag_errors_name_the_problem(text: str, field: str) -> None:
    """Unreadable output raises DcgmError naming what is missing."""
    with pytest.raises(dcgm.DcgmError, match=field):
        dcgm.parse_diag(text, level=1, started_at=T0, finished_at=T0)


def test_parse_health() -> None:
    """A health failure is attributed to its GPU with each incident's text."""
    check = dcgm.parse_health((FIXTURES / "health_fail.json").read_text(), at=T0)
    assert check.overall == "Failure"
    by_gpu = {g.gpu_index: g for g in check.gpus}
    assert by_gpu[0].value == "Healthy"
    assert by_gpu[1].value == "Failure"
    assert any("double-bit" in i for i in by_gpu[1].incidents)


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
    """Start sets `health -s a` on the configured hostengine; reads use `health -c -j`."""
    runner = client()
    status = await runner.start()
    assert status.available
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
    status = await runner.start()
    assert not status.available
    assert "not found" in status.detail
