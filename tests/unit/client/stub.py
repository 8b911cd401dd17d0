"""A loopback stand-in for the controller, for the `tau` client's tests: it records every
request and answers in the shapes the controller's handlers write (hand-made, from
controller/runs/schemas.py and controller/fleet/schemas.py; not captured output)."""

from __future__ import annotations

import http.server
import importlib.machinery
import json
import pathlib
import threading
import types
import urllib.parse
from typing import Any, NamedTuple

import yaml

TAU = pathlib.Path(__file__).resolve().parents[3] / "controller" / "assets" / "tau.py"


def tau_client() -> Any:
    """Load the `tau` script as a module, as a user runs it (`python3 tau.py`)."""
    loader = importlib.machinery.SourceFileLoader("tau_client", str(TAU))
    module = types.ModuleType(loader.name)
    loader.exec_module(module)
    return module


class Seen(NamedTuple):
    """One request as the controller received it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: bytes
    authorization: str | None


def run_json(name: str, namespace: str, **extra: Any) -> dict[str, Any]:
    """A run as `GET /v1/runs/{ns}/{name}` answers it (schemas.RunView), trimmed."""
    return {
        "name": name, "namespace": namespace, "kind": "job", "queue": "default",
        "phase": "Pending", "reason": "", "message": "", "attempt": 0, "queuePosition": None,
        "gpus": 0, "createdAt": None, "attempts": [], "checkpoints": [], "spec": {},
        **extra,
    }  # fmt: skip


class Controller(http.server.ThreadingHTTPServer):
    """Answers what the tests set in `routes` ((method, path) -> (status, body, headers);
    a callable body is called with the request) and, for `POST /v1/runs`, as the controller
    does: a dry run echoes the parsed file as the TauRun's spec, a submission creates the run
    in `?namespace=`, else the spec's namespace, else default."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, Any, dict[str, str]]] = {}
        self.seen: list[Seen] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()

    def posts(self, path: str = "/v1/runs") -> list[Seen]:
        return [s for s in self.seen if s.method == "POST" and s.path == path]


OPENAPI = {
    "paths": {
        "/v1/runs": {"post": {"parameters": [{"name": "namespace"}, {"name": "dryRun"}]}},
        "/v1/nodes/{name}/gpus": {"get": {}},
        "/v1/nodes/{name}/diag": {"post": {}},
        "/v1/nodes/{name}/agent/release": {"post": {}},
    }
}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Controller

    def _answer(self, method: str) -> None:
        parts = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen = Seen(
            method, parts.path, dict(urllib.parse.parse_qsl(parts.query)),
            self.headers.get("Content-Type") or "", body, self.headers.get("Authorization"),
        )  # fmt: skip
        self.server.seen.append(seen)
        status, answer, headers = self.server.routes.get((method, parts.path), self._default(seen))
        if callable(answer):
            answer = answer(seen)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _default(self, seen: Seen) -> tuple[int, Any, dict[str, str]]:
        if (seen.method, seen.path) == ("GET", "/openapi.json"):
            return 200, OPENAPI, {}
        if (seen.method, seen.path) == ("POST", "/v1/runs"):
            spec = yaml.safe_load(seen.body)
            namespace = seen.query.get("namespace") or spec.get("namespace") or "default"
            if seen.query.get("dryRun") == "true":
                run = {"metadata": {"name": spec["name"]}, "spec": spec}
                return 200, {"dryRun": True, "objects": [], "warnings": [], "run": run}, {}
            return 201, {**run_json(spec["name"], namespace), "warnings": []}, {}
        err = {"error": {"code": "NotFound", "message": f"no route {seen.path}"}}
        return 404, err, {}

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test's output quiet."""
