"""`tau login`, the config file, and errors that say what to do."""

from __future__ import annotations

import http.server
import io
import pathlib
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.client import stub

TOKEN = "s3cret-token-value"


@pytest.fixture
def controller() -> Iterator[stub.Controller]:
    """A loopback controller that records what the client sends."""
    server = stub.Controller()
    server.routes[("GET", "/v1/runs")] = (200, {"items": []}, {})
    server.routes[("GET", "/v1/runs/default/x")] = (200, stub.run_json("x", "default"), {})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """No TAU_* variables; the config dir under tmp_path."""
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_TOKEN_FILE", "TAU_NAMESPACE", "TAU_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def _login(monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = TOKEN + "\n") -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return int(stub.tau_client().main(["login", *argv]))


def _ca(d: pathlib.Path, *, cn: str = "tau-test-ca") -> tuple[pathlib.Path, pathlib.Path]:
    """A throwaway self-signed certificate and key (PEM), made with the openssl command."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", f"/CN={cn}", "-keyout", str(d / "ca.key"),
         "-out", str(d / "ca.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "ca.pem", d / "ca.key"


def test_login_keeps_url_ca_and_token_readable_by_you_alone(
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`--token -` reads the token from stdin; the file is 0600 in a 0700 directory, holds
    the URL, a copy of the CA and the token, and the token is printed nowhere."""
    ca, _ = _ca(home)
    code = _login(monkeypatch, "--url", controller.url, "--ca-file", str(ca), "--token", "-",
                  "-n", "team-a")  # fmt: skip
    out = capsys.readouterr()
    config = home / "config" / "tau" / "config"
    values = stub.tau_client().read_config(config)
    expected = (0, 0o600, 0o700, False, controller.url, TOKEN, "team-a", ca.read_bytes())
    actual = (
        code, stat.S_IMODE(config.stat().st_mode), stat.S_IMODE(config.parent.stat().st_mode),
        TOKEN in out.out + out.err, values["url"], values["token"], values["namespace"],
        pathlib.Path(values["ca-file"]).read_bytes(),
    )  # fmt: skip
    assert expected == actual


def test_after_login_tau_needs_no_environment(
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next command finds URL and token in the config file."""
    _login(monkeypatch, "--url", controller.url, "--token", "-")
    code = stub.tau_client().main(["status", "x"])
    expected = (0, "/v1/runs/default/x", f"Bearer {TOKEN}")
    assert expected == (code, controller.seen[-1].path, controller.seen[-1].authorization)


def test_the_config_token_never_goes_to_another_url(
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TAU_URL overrides the config's URL; the token kept for the config's URL stays home."""
    _login(monkeypatch, "--url", controller.url, "--token", "-")
    other = stub.Controller()
    try:
        monkeypatch.setenv("TAU_URL", other.url)
        stub.tau_client().main(["status", "x"])
        seen = [(s.path, s.authorization) for s in other.seen]
    finally:
        other.close()
    expected = [("/v1/runs/default/x", None)]
    assert expected == seen


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param({}, {}, ("https://c:443", "kept", "/ca.pem"),
                     id="the config file alone gives all three"),
        pytest.param({"url": "https://c/"}, {}, ("https://c/", "kept", "/ca.pem"),
                     id="the same origin in another spelling keeps the config's token"),
        pytest.param({"url": "https://other"}, {}, ("https://other", "", ""),
                     id="another URL gets neither the config's token nor its CA"),
        pytest.param({"url": "http://c:443"}, {}, ("http://c:443", "", ""),
                     id="another scheme is another origin"),
        pytest.param({"token": "flag"}, {}, ("https://c:443", "flag", "/ca.pem"),
                     id="a given token wins over the config's"),
        pytest.param({"ca_file": "/mine.pem"}, {}, ("https://c:443", "kept", "/mine.pem"),
                     id="a given CA wins over the config's"),
    ],
)  # fmt: skip
def test_settings_come_from_flags_env_then_the_config(
    args: dict[str, str], env: dict[str, str], expected: tuple[str, str, str]
) -> None:
    """Flags and the environment win; the config's token and CA go only with its URL."""
    tau = stub.tau_client()
    namespace = tau.parser().parse_args(["status"])
    for key in ("url", "token", "token_file", "ca_file"):
        setattr(namespace, key, args.get(key, ""))
    config = {"url": "https://c:443", "token": "kept", "ca-file": "/ca.pem"}
    got = tau.settings_of(namespace, env, config)
    assert expected == (got.url, got.token, got.ca_file)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        pytest.param(401, 4, id="a refused token saves nothing"),
        pytest.param(None, 7, id="an unreachable controller saves nothing"),
    ],
)  # fmt: skip
def test_login_saves_nothing_that_does_not_work(  # noqa: PLR0917 - parametrized
    status: int | None, code: int, controller: stub.Controller, home: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A URL that does not answer or a token it refuses is said, and nothing is kept."""
    url = controller.url if status else "http://127.0.0.1:9"
    refusal = {"error": {"code": "Unauthorized", "message": "token expired"}}
    controller.routes[("GET", "/v1/runs")] = (401, refusal, {})
    ca, _ = _ca(home)
    got = _login(monkeypatch, "--url", url, "--token", "-", "--ca-file", str(ca))
    err = capsys.readouterr().err
    kept = sorted(p.name for p in (home / "config").rglob("*"))
    expected: tuple[int, list[str], bool] = (code, [], True)
    assert expected == (got, kept, "nothing" in err)


def test_login_no_check_saves_anyway(home: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-check keeps the settings without calling the controller."""
    code = _login(monkeypatch, "--url", "https://c.example", "--token", "-", "--no-check")
    expected = (0, True)
    assert expected == (code, (home / "config" / "tau" / "config").exists())


def test_login_replaces_a_broken_config(
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file tau cannot read is the one `tau login` writes anew."""
    path = home / "config" / "tau" / "config"
    path.parent.mkdir(parents=True)
    path.write_text("url = no section header\n")
    code = _login(monkeypatch, "--url", controller.url, "--token", "-")
    expected = (0, controller.url)
    assert expected == (code, stub.tau_client().read_config(path).get("url"))


def test_an_unreadable_config_is_named(
    home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config file tau cannot parse is a usage error naming it, not silently ignored."""
    path = home / "config" / "tau" / "config"
    path.parent.mkdir(parents=True)
    path.write_text("url = no section header\n")
    code = stub.tau_client().main(["status", "x"])
    expected = (2, True)
    assert expected == (code, str(path) in capsys.readouterr().err)


# ---------------------------------------------------------------- errors that say what to do
@pytest.mark.parametrize(
    ("token", "needles"),
    [
        pytest.param("t", ("refused your token", "--duration", "tau login"),
                     id="an expired token: how to get a new one and keep it"),
        pytest.param("", ("no token was sent", "tau login"),
                     id="no token: how to give one"),
    ],
)  # fmt: skip
def test_a_401_says_how_to_get_a_token(
    token: str, needles: tuple[str, ...], controller: stub.Controller, home: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Exit 4, with the controller's message and what to do about it."""
    body = {"error": {"code": "Unauthorized", "message": "missing bearer token"}}
    controller.routes[("GET", "/v1/runs/default/x")] = (401, body, {})
    code = stub.tau_client().main(["--url", controller.url, "--token", token, "status", "x"])
    err = capsys.readouterr().err
    expected = (4, True)
    assert expected == (code, all(n in err for n in needles))


class _Tls(http.server.ThreadingHTTPServer):
    """A loopback HTTPS listener with a self-signed certificate for `cn`."""

    def __init__(self, cert: pathlib.Path, key: pathlib.Path) -> None:
        super().__init__(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """The client hangs up mid-handshake on purpose: quiet."""


@pytest.mark.parametrize(
    ("trust", "needle"),
    [
        pytest.param(False, "--ca-file", id="an untrusted certificate: pass the CA"),
        pytest.param(True, "not for this host name", id="a certificate for another name"),
    ],
)  # fmt: skip
def test_a_tls_failure_says_what_to_trust(
    trust: bool, needle: str, tmp_path: pathlib.Path, home: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Exit 7 with the TLS error and the fix: the CA file, or the right host name."""
    cert, key = _ca(tmp_path, cn="controller.example")
    server = _Tls(cert, key)
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        extra = ["--ca-file", str(cert)] if trust else []
        code = stub.tau_client().main(["--url", url, *extra, "status", "x"])
    finally:
        server.shutdown()
        server.server_close()
        server.thread.join()
    expected = (7, True)
    assert expected == (code, needle in capsys.readouterr().err)


def test_an_unreachable_controller_says_what_to_check(
    home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 7, naming the address and how to reach it from outside the cluster."""
    code = stub.tau_client().main(["--url", "http://127.0.0.1:9", "status", "x"])
    err = capsys.readouterr().err
    expected = (7, True, True)
    assert expected == (code, "TAU_URL" in err, "port-forward" in err)


def test_a_403_says_it_is_rbac_not_the_token(
    controller: stub.Controller, home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 4 with the controller's message, and that the role is what is missing."""
    body = {"error": {"code": "Forbidden", "message": "u may not get nodes"}}
    controller.routes[("GET", "/v1/nodes")] = (403, body, {})
    code = stub.tau_client().main(["--url", controller.url, "--token", "t", "nodes"])
    err = capsys.readouterr().err
    expected = (4, True, True)
    assert expected == (code, "u may not get nodes" in err, "RBAC" in err)
