"""The `tau` client: exit codes, its CA file, and how it reads API errors."""

from __future__ import annotations

import datetime
import http.server
import importlib.machinery
import json
import os
import pathlib
import subprocess
import sys
import threading
import types
import urllib.parse
from collections.abc import Iterator
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


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], {"TAU_TOKEN_FILE": "{file}"}, "pod-token",
                     id="a run pod's token file is read when no token is given"),
        pytest.param([], {"TAU_TOKEN": "given", "TAU_TOKEN_FILE": "{file}"}, "given",
                     id="TAU_TOKEN wins over the file"),
        pytest.param(["--token-file", "{file}"], {}, "pod-token",
                     id="--token-file names the file"),
        pytest.param([], {}, "", id="neither: no token"),
    ],
)  # fmt: skip
def test_the_token_comes_from_the_flag_the_env_or_the_file(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run pod's projected token is a file the kubelet rotates; tau reads it at start."""
    file = tmp_path / "token"
    file.write_text("pod-token\n")
    for name in ("TAU_TOKEN", "TAU_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(file=file))
    tau = _tau_client()
    args = tau.parser().parse_args(["list", *(a.format(file=file) for a in argv)])
    assert expected == tau.token_of(args)


def test_an_unreadable_token_file_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the file, before any call."""
    missing = tmp_path / "nope"
    code = _tau_client().main(["list", "--url", "http://127.0.0.1:9", "--token-file", str(missing)])
    expected = (2, True)
    assert expected == (code, str(missing) in capsys.readouterr().err)


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


# ---------------------------------------------------------------------- exact output
NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
CREATED = (NOW - datetime.timedelta(days=10, hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
RUN = {
    "name": "mnist", "namespace": "default", "kind": "job", "queue": "default",
    "phase": "Failed", "reason": "AppError", "message": "attempt 1 failed", "attempt": 1,
    "queuePosition": None, "gpus": 1, "createdAt": CREATED, "startTime": "2026-01-01T00:00:00Z",
    "endTime": "2026-01-01T00:01:00Z",
    "attempts": [{"number": 1, "phase": "Failed", "nodes": ["gpu-node-0"], "exitCodes": [1],
                  "failureClass": "AppError", "message": "pod mnist-a1-x exited with code 1",
                  "startTime": "2026-01-01T00:00:00Z", "endTime": ""}],
    "checkpoints": [],
}  # fmt: skip
ANSWERS: dict[str, Any] = {
    "/v1/queues": {"namespace": "default", "items": [
        {"name": "default", "clusterQueue": "taugrid-dev", "admittedWorkloads": 1,
         "pendingWorkloads": 1,
         "resources": [{"flavor": "h100", "resource": "nvidia.com/gpu", "quota": "32",
                        "used": "8"}],
         "waiting": [{"name": "big", "gpus": 16, "queuePosition": 0,
                      "message": "waiting for quota"}]}]},
    "/v1/runs/default/mnist": RUN,
    "/v1/runs": {"items": [{**RUN, "message": ""}]},
    "/v1/runs/default/mnist/results": {
        "name": "mnist", "namespace": "default", "phase": "Succeeded", "attempt": 1,
        "experiment": None, "summary": "", "artifacts": [], "artifactsDropped": 0,
        "metrics": [{"name": "loss", "thinned": 0, "points": [
            {"step": 100, "value": 0.5, "time": "2026-01-01T00:00:00Z"},
            {"step": 200, "value": 0.25, "time": "2026-01-01T00:01:00Z"}],
            "last": {"step": 200, "value": 0.25, "time": "2026-01-01T00:01:00Z"}}]},
    "/openapi.json": {"paths": {"/v1/runs": {"post": {"parameters": [
        {"name": "namespace", "in": "query"}, {"name": "dryRun", "in": "query"}]}}}},
}  # fmt: skip
"""What the controller answers, in the shapes its handlers write."""
DRY_RUN = {
    "dryRun": True,
    "run": {"apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
            "metadata": {"name": "mnist", "namespace": "default"},
            "spec": {"name": "mnist", "queue": "default"}},
    "objects": [{"kind": "Secret", "metadata": {"name": "mnist-token"}},
                {"kind": "ConfigMap", "metadata": {"name": "mnist-checkpoint"}},
                {"kind": "Job", "metadata": {"name": "mnist-a1"}}],
    "warnings": ["image 'python:3.12' is not pinned by digest"],
}  # fmt: skip
"""`POST /v1/runs?dryRun=true` as documented by the server side (controller/runs/schemas.py
`DryRun` of the branch that implements it): the TauRun and the objects it would create."""


class _Answers(http.server.BaseHTTPRequestHandler):
    posts: list[str] = []  # noqa: RUF012  (a record the tests read back)
    dry_run = True

    def _send(self, answer: Any) -> None:
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/openapi.json" and not self.dry_run:
            self._send({"paths": {"/v1/runs": {"post": {}}}})
            return
        self._send(ANSWERS[path])

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts.append(self.path)
        self._send(DRY_RUN)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


class _OldController(_Answers):
    dry_run = False


def _serve(handler: type[_Answers]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture(scope="module")
def answering() -> Iterator[str]:
    """A loopback HTTP server that answers as the controller does, for the client's output."""
    yield from _serve(_Answers)


@pytest.fixture(scope="module")
def answering_old() -> Iterator[str]:
    """The same, as a controller without `dryRun` on POST /v1/runs answers."""
    yield from _serve(_OldController)


TAU = pathlib.Path(__file__).resolve().parents[3] / "controller" / "assets" / "tau.py"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["queues"], (
            "QUEUE    CLUSTER QUEUE  GPUS USED/QUOTA  ADMITTED  PENDING\n"
            "default  taugrid-dev    8/32 (h100)      1         1\n"
            "\n"
            "QUEUE    WAITING RUN  GPUS  POSITION  WHY\n"
            "default  big          16    1         waiting for quota\n"
        ), id="tau queues ends each table row with a newline"),
        pytest.param(["status", "mnist"], (
            "Name:      mnist\nNamespace: default\nKind:      job\n"
            "Phase:     Failed (AppError)\nQueue:     default\nGPUs:      1\nAttempt:   1\n"
            "Message:   attempt 1 failed\nCreated:   " + CREATED + "\n"
            "Started:   2026-01-01T00:00:00Z\nEnded:     2026-01-01T00:01:00Z\n"
            "\n"
            "ATTEMPT  PHASE   NODES       EXIT  FAILURE   RESUMED FROM  STARTED"
            "               ENDED\n"
            "1        Failed  gpu-node-0  1     AppError  -             2026-01-01T00:00:00Z  -\n"
            "  attempt 1: pod mnist-a1-x exited with code 1\n"
        ), id="tau status RUN ends its attempts table with a newline"),
        pytest.param(["status"], (
            "NAME   PHASE   QUEUE    GPUS  ATTEMPT  POSITION  AGE  MESSAGE\n"
            "mnist  Failed  default  1     1        -         10d  -\n"
        ), id="tau status lists runs, the last row ending with a newline"),
        pytest.param(["results", "mnist"], (
            "Run:     mnist (Succeeded, attempt 1)\n"
            "\n"
            "METRIC  LAST  STEP  POINTS  MIN   MAX\n"
            "loss    0.25  200   2       0.25  0.5\n"
        ), id="tau results prints the metrics table"),
        pytest.param(["results", "mnist", "--metric", "loss"], (
            "Run:     mnist (Succeeded, attempt 1)\n"
            "\n"
            "STEP  LOSS  TIME\n"
            "100   0.5   2026-01-01T00:00:00Z\n"
            "200   0.25  2026-01-01T00:01:00Z\n"
        ), id="tau results --metric prints the series"),
    ],
)  # fmt: skip
def test_tau_prints_exactly_this(argv: list[str], expected: str, answering: str) -> None:
    """The client's output, byte for byte, as a researcher's terminal gets it: every line
    ends with a newline, so what follows (a warning, the prompt) starts on a line of its own."""
    done = subprocess.run(
        [sys.executable, str(TAU), *argv], capture_output=True, text=True, check=False,
        env={"TAU_URL": answering, "TAU_TOKEN": "t", "PATH": os.environ["PATH"],
             "XDG_CONFIG_HOME": "/nonexistent"},
    )  # fmt: skip
    assert (0, "", expected) == (done.returncode, done.stderr, done.stdout)


def _tau(url: str, *argv: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TAU), *argv], capture_output=True, text=True, check=False, cwd=cwd,
        env={"TAU_URL": url, "TAU_TOKEN": "t", "PATH": os.environ["PATH"],
             "XDG_CONFIG_HOME": "/nonexistent"},
    )  # fmt: skip


def test_tau_validate_prints_what_would_be_created(answering: str, tmp_path: pathlib.Path) -> None:
    """`tau validate` posts the file with dryRun=true and prints the TauRun and its objects;
    the server's warnings go to stderr."""
    (tmp_path / "tau.yaml").write_text("name: mnist\nimage: python:3.12\ncommand: [python]\n")
    done = _tau(answering, "validate", "tau.yaml", cwd=tmp_path)
    expected = (
        0,
        "warning: image 'python:3.12' is not pinned by digest\n",
        (
            "tau.yaml is valid: run mnist in namespace default, queue default\n"
            "submitting it would create:\n"
            "KIND       NAME\n"
            "TauRun     mnist\n"
            "Secret     mnist-token\n"
            "ConfigMap  mnist-checkpoint\n"
            "Job        mnist-a1\n"
        ),
    )
    assert expected == (done.returncode, done.stderr, done.stdout)
    assert _Answers.posts[-1] == "/v1/runs?dryRun=true"


def test_tau_validate_never_posts_to_a_controller_without_dry_run(
    answering_old: str, tmp_path: pathlib.Path
) -> None:
    """A controller that does not document dryRun would create the run: nothing is sent."""
    (tmp_path / "tau.yaml").write_text("name: mnist\n")
    before = len(_OldController.posts)
    done = _tau(answering_old, "validate", "tau.yaml", cwd=tmp_path)
    assert (7, before) == (done.returncode, len(_OldController.posts))
    assert "cannot validate without submitting" in done.stderr


# ---------------------------------------------------------------- the token stays home
class _Recorder(http.server.ThreadingHTTPServer):
    """A loopback HTTP server that remembers the path and Authorization header of every
    request and answers each path from `routes`: (status, extra headers); a `Location`
    header redirects."""

    def __init__(self, routes: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str | None]] = []
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    server: _Recorder

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.seen.append((path, self.headers.get("Authorization")))
        status, headers = self.server.routes.get(path, (200, {}))
        body = b'{"items": []}' if status == 200 else b""
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test's output quiet."""


@pytest.fixture
def servers() -> Iterator[tuple[_Recorder, _Recorder]]:
    """Two loopback servers on different ports: two origins."""
    other = _Recorder({})
    home = _Recorder({})
    try:
        yield home, other
    finally:
        home.close()
        other.close()


def test_tau_does_not_follow_a_redirect_to_another_origin_with_the_token(
    servers: tuple[_Recorder, _Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    """A 302 to another origin ends the command (exit 7, naming it); the other origin never
    sees a request, so it never sees the token."""
    home, other = servers
    home.routes["/v1/runs"] = (302, {"Location": f"{other.url}/steal"})
    code = _tau_client().main(["list", "--url", home.url, "--token", "secret-token"])
    expected: tuple[int, list[Any], bool] = (7, [], True)
    actual = (code, other.seen, "another origin" in capsys.readouterr().err)
    assert expected == actual


def test_tau_follows_a_redirect_within_the_origin_with_the_token(
    servers: tuple[_Recorder, _Recorder],
) -> None:
    """A redirect to another path of the same origin is followed, with the token."""
    home, _ = servers
    home.routes["/v1/runs"] = (307, {"Location": "/v1/runs/"})
    code = _tau_client().main(["list", "--url", home.url, "--token", "secret-token"])
    expected = (0, [("/v1/runs", "Bearer secret-token"), ("/v1/runs/", "Bearer secret-token")])
    assert expected == (code, home.seen)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param("https://c.example/x", "https://c.example:443/y", True,
                     id="the default port is the same origin"),
        pytest.param("https://c.example/x", "http://c.example/x", False,
                     id="https to http is another origin"),
        pytest.param("https://c.example/x", "https://evil.example/x", False,
                     id="another host is another origin"),
        pytest.param("http://127.0.0.1:8080/", "http://127.0.0.1:8081/", False,
                     id="another port is another origin"),
        pytest.param("https://C.Example/", "https://c.example/", True,
                     id="host names compare without case"),
    ],
)  # fmt: skip
def test_tau_compares_origins_by_scheme_host_and_port(a: str, b: str, same: bool) -> None:
    """The origin of a URL is its scheme, host and port, as browsers compare them."""
    tau = _tau_client()
    assert same == (tau.origin(a) == tau.origin(b))


@pytest.mark.parametrize(
    ("url", "token", "warned"),
    [
        pytest.param("http://10.1.2.3:8080", "t", True,
                     id="a token over plain http to another host is warned about"),
        pytest.param("http://127.0.0.1:8080", "t", False, id="loopback http is not"),
        pytest.param("http://localhost:8080", "t", False, id="localhost is not"),
        pytest.param("http://[::1]:8080", "t", False, id="IPv6 loopback is not"),
        pytest.param("https://10.1.2.3:8080", "t", False, id="https is not"),
        pytest.param("http://10.1.2.3:8080", "", False, id="no token, nothing to warn about"),
    ],
)  # fmt: skip
def test_tau_warns_before_sending_a_token_over_plain_http_to_another_host(
    url: str, token: str, warned: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning comes when the client is made, before anything is sent."""
    _tau_client().Client(url, token)
    assert warned == ("warning: sending your token over plain http://" in capsys.readouterr().err)


def test_tau_results_prints_no_terminal_escape_sequences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Review 3, finding 10: a summary, metric name or artifact URI that a run reported with
    escape sequences (as an older controller stored them) is printed without its control
    characters; tab and newline stay."""
    tau = _tau_client()
    body = {"name": "r", "phase": "Succeeded", "attempt": 1,
            "summary": "loss \x1b[2J\x1b]0;pwned\x07fell\n\tdone\x9b",
            "metrics": [{"name": "lo\x1bss", "points": [{"step": 1, "value": 0.5}],
                         "last": {"step": 1, "value": 0.5}}],
            "artifacts": [{"uri": "s3://b/m\x1b[31m.pt", "attempt": 1}]}  # fmt: skip
    tau._print_results(body, None)
    out = capsys.readouterr().out
    expected: tuple[list[str], bool] = ([], True)
    actual = ([c for c in out if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0],
              "Summary: loss [2J]0;pwnedfell\n\tdone" in out)  # fmt: skip
    assert expected == actual
