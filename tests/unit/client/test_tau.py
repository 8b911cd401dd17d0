"""The `tau` client: exit codes, its CA file, and how it reads API errors."""

from __future__ import annotations

import importlib.machinery
import pathlib
import subprocess
import types
from typing import Any

import pytest


def _tau_client() -> Any:
    """Load the `tau` script as a module, as a user runs it (`python3 tau.py`)."""
    path = pathlib.Path(__file__).resolve().parents[3] / "controller" / "assets" / "tau.py"
    loader = importlib.machinery.SourceFileLoader("tau_client", str(path))
    module = types.ModuleType(loader.name)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["list", "--url", "ftp://x"], 2, id="a non-http URL is a usage error"),
        pytest.param(["list", "--url", ""], 2, id="no URL is a usage error"),
        pytest.param(
            ["run", "--url", "http://127.0.0.1:9", "--image", "i"], 2,
            id="an image without a command is a usage error",
        ),
        pytest.param(
            ["status", "x", "--url", "http://127.0.0.1:9"], 7,
            id="an unreachable controller is exit 7",
        ),
    ],
)  # fmt: skip
def test_tau_exit_codes(argv: list[str], expected: int, capsys: pytest.CaptureFixture[str]) -> None:
    """The client's exit codes are the documented ones, with a message on stderr."""
    assert expected == _tau_client().main(argv)
    assert capsys.readouterr().err.startswith("tau: ")


def _self_signed(d: pathlib.Path) -> pathlib.Path:
    """A throwaway self-signed certificate (PEM) made with the openssl command."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=tau-test-ca", "-keyout", str(d / "ca.key"),
         "-out", str(d / "ca.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "ca.crt"


@pytest.mark.parametrize("how", ["env", "flag"], ids=["from TAU_CA_FILE", "from --ca-file"])
def test_tau_trusts_the_ca_file_it_is_given(
    how: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TAU_CA_FILE (or --ca-file) goes into the SSL context the client verifies the controller
    with; without either the client uses the system store (None)."""
    tau = _tau_client()
    ca = _self_signed(tmp_path)
    monkeypatch.delenv("TAU_CA_FILE", raising=False)
    plain = tau.parser().parse_args(["list", "--url", "https://c"])
    if how == "env":
        monkeypatch.setenv("TAU_CA_FILE", str(ca))
        args = tau.parser().parse_args(["list", "--url", "https://c"])
    else:
        args = tau.parser().parse_args(["list", "--url", "https://c", "--ca-file", str(ca)])
    context = tau.Client(args.url, "", ca_file=args.ca_file).context
    expected = (None, True)
    actual = (
        tau.Client(plain.url, "", ca_file=plain.ca_file).context,
        {"commonName": "tau-test-ca"}
        in [dict(field[0] for field in c["subject"]) for c in context.get_ca_certs()],
    )
    assert expected == actual


def test_tau_refuses_a_ca_file_it_cannot_load(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing CA file is a usage error naming the file, not an unreachable controller."""
    missing = tmp_path / "nope.crt"
    code = _tau_client().main(["list", "--url", "https://c", "--ca-file", str(missing)])
    expected = (2, True)
    assert expected == (code, str(missing) in capsys.readouterr().err)


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        pytest.param(
            422,
            b'{"error": {"code": "Invalid", "message": "is required", "field": "image"}}',
            3, "image: is required", id="a refused spec names the field",
        ),
        pytest.param(
            403, b'{"error": {"code": "Forbidden", "message": "u may not create"}}', 4,
            "u may not create", id="forbidden is exit 4",
        ),
        pytest.param(409, b"{}", 6, "HTTP 409: {}", id="a conflict without a body is exit 6"),
    ],
)  # fmt: skip
def test_tau_reads_api_errors(status: int, body: bytes, code: int, message: str) -> None:
    """API errors become the documented exit code and a message naming the field."""
    err = _tau_client().Client._error(status, body)
    assert (code, message) == (err.code, str(err))
