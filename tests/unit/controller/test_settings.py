"""The controller's settings refuse a leader address that could send a peer token astray."""

from __future__ import annotations

import pathlib
import ssl

import pydantic
import pytest

from controller import serving, settings
from controller.settings import ControllerSettings
from devcluster import pki


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        pytest.param({}, "", id="no leader address is allowed (no forwarding)"),
        pytest.param({"leader_url": "https://taugrid-controller-leader.ns.svc:8080",
                      "tls_ca_file": "/ca.crt"}, "", id="the leader Service over https is allowed"),
        pytest.param({"leader_url": "http://127.0.0.1:8080"}, "",
                     id="plain http on loopback is allowed (the dev cluster)"),
        pytest.param({"leader_url": "https://leader.ns.svc:8080"}, "needs tls_ca_file",
                     id="https without the CA to verify it by is refused"),
        pytest.param({"leader_url": "http://leader.ns.svc:8080"}, "plain http only on loopback",
                     id="plain http to another host is refused"),
        pytest.param({"leader_url": "http://leader.ns.svc:8080", "allow_insecure_http": True},
                     "", id="plain http behind a TLS mesh is allowed when asked for"),
        pytest.param({"leader_url": "http://127.0.0.1:8080/latest/meta-data"},
                     "without a path", id="a path is refused"),
        pytest.param({"leader_url": "http://127.0.0.1:8080?x="}, "a query",
                     id="a query is refused"),
        pytest.param({"leader_url": "http://u:p@127.0.0.1:8080"}, "credentials",
                     id="credentials in the URL are refused"),
        pytest.param({"leader_url": "file:///etc/passwd"}, "http(s)://",
                     id="another scheme is refused"),
    ],
)  # fmt: skip
def test_the_leader_address_is_an_origin_verified_as_it_should_be(
    values: dict[str, object], problem: str
) -> None:
    """`leader_url` is checked when the settings are read, so a replica never starts with
    an address that would hand its peer token to a stranger."""
    try:
        ControllerSettings(**values)  # type: ignore[arg-type]
        message = ""
    except pydantic.ValidationError as err:
        message = str(err)
    expected = (bool(problem), True)
    assert expected == (bool(message), problem in message)


def test_the_leader_is_verified_by_the_charts_ca_alone(tmp_path: pathlib.Path) -> None:
    """The client context for the leader trusts exactly the configured CA, none of the
    system store, and checks the host name."""
    certs = pki.ensure(tmp_path)
    context = serving.peer_ssl_context(ControllerSettings(tls_ca_file=str(certs / "ca.crt")))
    expected = (1, True, ssl.CERT_REQUIRED)
    assert expected == (len(context.get_ca_certs()), context.check_hostname, context.verify_mode)


@pytest.mark.parametrize(
    ("values", "refused"),
    [
        pytest.param({}, False, id="the defaults leave room for the largest heartbeat"),
        pytest.param({"peer_max_body_bytes": (1 << 20) + 65536}, False,
                     id="exactly one largest heartbeat and its envelope is enough"),
        pytest.param({"peer_max_body_bytes": 1 << 20}, True,
                     id="a batch limit no larger than a heartbeat is refused"),
        pytest.param({"max_body_bytes": 16 << 20}, True,
                     id="a heartbeat limit above the batch limit is refused"),
    ],
)  # fmt: skip
def test_a_relayed_batch_always_has_room_for_one_heartbeat(
    values: dict[str, object], refused: bool
) -> None:
    """`peer_max_body_bytes` must hold the largest heartbeat the controller takes, or a
    follower could never relay it."""
    try:
        ControllerSettings(**values)  # type: ignore[arg-type]
        message = ""
    except pydantic.ValidationError as err:
        message = str(err)
    expected = (refused, refused)
    assert expected == (bool(message), "peer_max_body_bytes" in message)


def test_every_setting_is_declared_in_one_section_and_read_from_its_old_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sections split the fields without overlap or loss, the env names stay
    `TAUGRID_CONTROLLER_<FIELD>`, and each domain's section carries the values read."""
    sections = (
        settings.ApiSettings, settings.KubeSettings, settings.FleetSettings,
        settings.DeviceSettings, settings.AdmissionSettings, settings.RunsSettings,
    )  # fmt: skip
    declared = [name for section in sections for name in section.model_fields]
    assert sorted(declared) == sorted(settings.ControllerSettings.model_fields)
    assert len(declared) == len(set(declared))
    monkeypatch.setenv("TAUGRID_CONTROLLER_DRY_RUN", "true")
    monkeypatch.setenv("TAUGRID_CONTROLLER_RUN_PASS_INTERVAL_S", "7")
    monkeypatch.setenv("TAUGRID_CONTROLLER_GPU_MODE", "dra")
    monkeypatch.setenv("TAUGRID_CONTROLLER_ADMISSION_CHECK", "my-check")
    process = settings.ControllerSettings()
    got = (process.fleet.dry_run, process.runs.run_pass_interval_s, process.devices.gpu_mode,
           process.admission.admission_check)  # fmt: skip
    assert got == (True, 7.0, "dra", "my-check")
    assert type(process.fleet) is settings.FleetSettings
