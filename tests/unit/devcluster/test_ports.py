"""Two dev clusters side by side: `TAUGRID_PORT_OFFSET` shifts every loopback port."""

from __future__ import annotations

import dataclasses

import pytest

from devcluster import cluster, stack


def test_the_offset_shifts_every_component_port_and_the_host_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each component, the dev controller and each agent move by the offset, no port stays."""
    monkeypatch.setenv("TAUGRID_PORT_OFFSET", "100")
    shifted = dataclasses.asdict(cluster.Ports.from_env())
    defaults = dataclasses.asdict(cluster.Ports())
    assert {name: port + 100 for name, port in defaults.items()} == shifted
    assert (
        stack.controller_port(),
        stack.agent_port(2),
    ) == (stack.CONTROLLER_PORT + 100, stack.AGENT_PORT_BASE + 102)
    assert f"http://127.0.0.1:{stack.CONTROLLER_PORT + 100}" == stack.controller_url()


def test_without_an_offset_the_ports_are_each_project_s_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unset or empty offset leaves the defaults, so the README's URLs hold."""
    monkeypatch.delenv("TAUGRID_PORT_OFFSET", raising=False)
    assert cluster.Ports() == cluster.Ports.from_env()
    monkeypatch.setenv("TAUGRID_PORT_OFFSET", "")
    assert cluster.Ports() == cluster.Ports.from_env()


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("-5", id="a negative offset is refused"),
        pytest.param("100\n", id="a trailing newline is refused"),
        pytest.param("40000", id="an offset past 20000 is refused"),
        pytest.param("1e3", id="a number that is not whole is refused"),
    ],
)
def test_a_bad_offset_fails_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    """A bad offset stops `up` with a message that names the variable, never a traceback."""
    monkeypatch.setenv("TAUGRID_PORT_OFFSET", raw)
    with pytest.raises(cluster.ClusterError, match="TAUGRID_PORT_OFFSET"):
        cluster.port_offset()
