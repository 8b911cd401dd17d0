"""The examples: the tau.yaml files validate, and `train_with_checkpoints.py` keeps the
checkpoint contract of docs/researcher.md against a fake of the controller's checkpoint API.

The fake is a tiny `http.server` in this process, speaking the two calls a run's pods make
(`POST …/checkpoints`, `GET …/checkpoints/latest`) with the controller's rules: the run's
bearer token, attempt fencing (409 for an attempt older than the current one), 404 before the
first report. The script runs as its own process, as in a pod, so SIGTERM is real.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import cluster, node, stack
from shared import spec as specs

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
SCRIPT = EXAMPLES / "train_with_checkpoints.py"
TOKEN = "tau-run-token-for-demo"
NAMESPACE = "team-a"
RUN = "llama-ft"
CHECKPOINTS = f"/v1/runs/{NAMESPACE}/{RUN}/checkpoints"
RESULTS = f"/v1/runs/{NAMESPACE}/{RUN}/results"
DEADLINE_S = 30.0


@dataclasses.dataclass
class FakeController:
    """What the fake saw and how it answers; handlers run on server threads."""

    current_attempt: int = 1
    fail_posts: int = 0
    """Answer this many POSTs with 503 first (a leader failover)."""
    reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    latest_asked: int = 0
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The result reports (`POST …/results`), answered 202 as the controller does."""
    token: str = TOKEN
    rotate: pathlib.Path | None = None
    """After the first report, write a new token into this file and accept only that one
    (the kubelet rotating a pod's projected token)."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def snapshot(self) -> list[dict[str, Any]]:
        """Return the reports accepted so far."""
        with self.lock:
            return list(self.reports)


def _handler(fake: FakeController) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, code: str, message: str) -> None:
            self._send(status, {"error": {"code": code, "message": message, "field": ""}})

        def _authorised(self) -> bool:
            with fake.lock:
                expected = fake.token
            if self.headers.get("Authorization") == f"Bearer {expected}":
                return True
            self._error(403, "Forbidden", "this token does not belong to the run")
            return False

        def do_GET(self) -> None:
            if self.path != CHECKPOINTS + "/latest":
                self._error(404, "NotFound", self.path)
            elif self._authorised():
                with fake.lock:
                    fake.latest_asked += 1
                    latest = fake.reports[-1] if fake.reports else None
                if latest is None:
                    self._error(404, "NoCheckpoint", f"run {RUN!r} has reported no checkpoint")
                else:
                    self._send(200, latest)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == RESULTS:
                if self._authorised():
                    with fake.lock:
                        fake.results.append(body)
                    self._send(202, {"accepted": True})
                return
            if self.path != CHECKPOINTS:
                self._error(404, "NotFound", self.path)
                return
            if not self._authorised():
                return
            with fake.lock:
                if fake.fail_posts > 0:
                    fake.fail_posts -= 1
                    self._error(503, "NoLeader", "no leader right now")
                    return
                if body["attempt"] < fake.current_attempt:
                    message = f"attempt {body['attempt']} is over"
                    self._error(409, "StaleAttempt", message)
                    return
                entry = {**body, "reportedAt": "2026-05-01T12:00:00Z"}
                fake.reports.append(entry)
                if fake.rotate is not None:
                    fake.token = "rotated-" + TOKEN
                    fake.rotate.write_text(fake.token + "\n")
                    fake.rotate = None
            self._send(201, entry)

    return Handler


@pytest.fixture
def controller() -> Iterator[tuple[str, FakeController]]:
    """A fake checkpoint API on a free loopback port, and its state."""
    fake = FakeController()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _env(url: str, ckpt_dir: pathlib.Path, **extra: str) -> dict[str, str]:
    """The env TauGrid gives a run's pods, as the reconciler renders it."""
    file = ckpt_dir.parent / "taugrid-checkpoint" / "latest"
    file.parent.mkdir(parents=True, exist_ok=True)
    if not file.exists():
        file.write_text("")
    token = ckpt_dir.parent / "taugrid-run" / "token"
    token.parent.mkdir(parents=True, exist_ok=True)
    if not token.exists():
        token.write_text(TOKEN + "\n")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "TAU_RUN": RUN,
        "TAU_NAMESPACE": NAMESPACE,
        "TAU_ATTEMPT": "1",
        "TAU_WORKERS": "1",
        "TAU_URL": url,
        "TAU_TOKEN_FILE": str(token),
        "TAU_CHECKPOINT_DIR": str(ckpt_dir),
        "TAU_CHECKPOINT_FILE": str(file),
        "TAU_RESUME_FROM": "",
        "TAU_FAILURE_REASON": "",
    }
    env.update(extra)
    return env


def _train(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--step-seconds", "0", "--backoff-seconds", "0.01", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


def _steps(reports: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in reports]


def _state(path: str | pathlib.Path) -> dict[str, Any]:
    data = json.loads(pathlib.Path(path).read_text())
    assert isinstance(data, dict)
    return data


# ---------------------------------------------------------------------- the yaml examples
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_tau_yaml_is_valid(path: pathlib.Path) -> None:
    """Each example tau.yaml passes the same validation as `POST /v1/runs`."""
    parsed = specs.parse_spec(path.read_bytes())
    assert parsed.spec.name


def test_the_examples_point_at_the_checkpoint_script() -> None:
    """The README and the pytorch example send readers to the script that keeps the
    contract, and the pytorch example gives its run a checkpoint directory."""
    assert SCRIPT.name in (EXAMPLES / "README.md").read_text()
    assert SCRIPT.name in (EXAMPLES / "pytorch.yaml").read_text()
    pytorch = specs.parse_spec((EXAMPLES / "pytorch.yaml").read_bytes()).spec
    assert pytorch.checkpoint is not None


# ---------------------------------------------------------------------- the script
def test_a_fresh_run_saves_then_reports_each_checkpoint(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """Every `--save-every` steps and at the end, a checkpoint is written and then reported
    with the run's attempt; each report names a file that holds that step."""
    url, fake = controller
    done = _train(_env(url, tmp_path / "ckpt"), "--steps", "5", "--save-every", "2")
    assert done.returncode == 0, done.stderr
    assert _steps(fake.snapshot()) == [2, 4, 5]
    assert {r["attempt"] for r in fake.snapshot()} == {1}
    assert [_state(r["path"])["step"] for r in fake.snapshot()] == [2, 4, 5]
    assert "fresh start" in done.stderr


def test_each_checkpoint_and_the_end_report_the_loss_as_a_result(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """`tau results` of the quickstart's run shows something: the loss at each reported
    checkpoint, for the run's attempt, and a summary at the end."""
    url, fake = controller
    done = _train(_env(url, tmp_path / "ckpt"), "--steps", "5", "--save-every", "2")
    assert done.returncode == 0, done.stderr
    with fake.lock:
        results = list(fake.results)
    assert [r["metrics"][0]["step"] for r in results] == [2, 4, 5, 5]
    assert {r["attempt"] for r in results} == {1}
    assert {r["metrics"][0]["name"] for r in results} == {"loss"}
    assert results[-1]["summary"].startswith("trained to step 5; final loss ")


@pytest.mark.parametrize(
    "source",
    ["file", "api", "resume_from", "newest of several"],
    ids=[
        "the checkpoint file names it",
        "only the API knows it yet (the file lags)",
        "only TAU_RESUME_FROM names it",
        "the file is older than the API: the newest wins",
    ],
)
def test_a_start_resumes_from_the_newest_checkpoint(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path, source: str
) -> None:
    """At start the script continues from the newest checkpoint any source names, and ends
    exactly where an uninterrupted run ends."""
    url, fake = controller
    ckpt = tmp_path / "ckpt"
    first = _train(_env(url, ckpt), "--steps", "4", "--save-every", "2")
    assert first.returncode == 0, first.stderr
    step2, step4 = (r["path"] for r in fake.snapshot())
    env = _env(url, ckpt, TAU_ATTEMPT="2")
    file = pathlib.Path(env["TAU_CHECKPOINT_FILE"])
    if source != "api":
        fake.reports.clear()
    if source == "file":
        file.write_text(step4 + "\n")
    elif source == "resume_from":
        env["TAU_RESUME_FROM"] = step4
    elif source == "newest of several":
        file.write_text(step2)
        env["TAU_RESUME_FROM"] = step2
        fake.reports[:] = [{"attempt": 1, "step": 4, "path": step4}]
    fake.current_attempt = 2

    resumed = _train(env, "--steps", "8", "--save-every", "2")

    assert resumed.returncode == 0, resumed.stderr
    assert "attempt 2: resuming at step 4" in resumed.stderr
    new = [r for r in fake.snapshot() if r["attempt"] == 2]
    assert _steps(new) == [6, 8]
    alone = _env("", tmp_path / "straight")  # no controller: saved, not reported
    straight = _train(alone, "--steps", "8", "--save-every", "8")
    assert straight.returncode == 0, straight.stderr
    assert "not reported" in straight.stderr
    assert _state(new[-1]["path"]) == _state(tmp_path / "straight" / "step-00000008.json")


def test_sigterm_saves_reports_and_exits_so_the_next_start_resumes(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """On SIGTERM the script finishes its step, saves and reports that step, and exits 143
    (not 0, which a Job would count as success); the next start resumes right there."""
    url, fake = controller
    env = _env(url, tmp_path / "ckpt")
    args = ["--steps", "100000", "--save-every", "3", "--step-seconds", "0.01"]
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not fake.snapshot() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.snapshot(), "no checkpoint was reported before the deadline"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=DEADLINE_S)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    steps = _steps(fake.snapshot())
    assert steps == sorted(set(steps))
    last = fake.snapshot()[-1]
    assert _state(last["path"])["step"] == last["step"]
    saved = sorted(p.name for p in (tmp_path / "ckpt").glob("step-*.json"))
    assert saved[-1] == f"step-{last['step']:08d}.json"
    assert f"stopped at step {last['step']} on SIGTERM" in stderr

    readmitted = _train(env, "--steps", str(last["step"] + 1), "--save-every", "1000")

    assert readmitted.returncode == 0, readmitted.stderr
    assert f"resuming at step {last['step']}" in readmitted.stderr
    assert _steps(fake.snapshot())[-1] == last["step"] + 1


def test_a_report_from_a_superseded_attempt_stops_the_run(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """A 409 says a newer attempt exists: the old one stops instead of training on."""
    url, fake = controller
    fake.current_attempt = 2
    done = _train(_env(url, tmp_path / "ckpt"), "--steps", "10", "--save-every", "2")
    assert done.returncode == 4, done.stderr
    assert fake.snapshot() == []
    assert "a newer attempt of this run exists" in done.stderr
    assert "StaleAttempt" in done.stderr


def test_reports_ride_out_a_leader_failover(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """A 503 (no leader for a moment) is retried with backoff; the report lands."""
    url, fake = controller
    fake.fail_posts = 2
    done = _train(_env(url, tmp_path / "ckpt"), "--steps", "2", "--save-every", "2")
    assert done.returncode == 0, done.stderr
    assert _steps(fake.snapshot()) == [2]


def test_the_pods_token_file_is_read_again_at_each_report(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """The kubelet rotates a pod's projected token: after the first report the file holds a
    new one and only that is accepted; the second report carries it."""
    url, fake = controller
    env = _env(url, tmp_path / "ckpt")
    fake.rotate = pathlib.Path(env["TAU_TOKEN_FILE"])
    done = _train(env, "--steps", "4", "--save-every", "2")
    assert done.returncode == 0, done.stderr
    assert _steps(fake.snapshot()) == [2, 4]


def test_a_refused_token_fails_loudly(
    controller: tuple[str, FakeController], tmp_path: pathlib.Path
) -> None:
    """A 403 will not pass on a retry: the script stops and says why."""
    url, fake = controller
    env = _env(url, tmp_path / "ckpt", TAU_TOKEN="someone-elses")
    done = _train(env, "--steps", "4", "--save-every", "2")
    assert done.returncode == 3, done.stderr
    assert "HTTP 403" in done.stderr
    assert fake.snapshot() == []


def test_without_a_checkpoint_dir_it_says_what_to_add(tmp_path: pathlib.Path) -> None:
    """A run without `checkpoint` in its tau.yaml gets no TAU_CHECKPOINT_DIR; the script
    names the field to add instead of training with nowhere to save."""
    env = _env("http://127.0.0.1:9", tmp_path / "ckpt")
    del env["TAU_CHECKPOINT_DIR"]
    done = _train(env, "--steps", "1")
    assert done.returncode == 2
    assert "checkpoint: {dir:" in done.stderr


def test_the_real_node_example_runs_the_script_in_the_run_image_on_the_real_node() -> None:
    """examples/real-node.yaml, the README quickstart's run, names the real node's queue, the
    run image under the name `up` gives it there, a claim `up` creates, and the script."""
    parsed = specs.parse_spec((EXAMPLES / "real-node.yaml").read_bytes()).spec
    assert parsed.queue == stack.REAL_NODE_QUEUE
    assert f"docker.io/{parsed.image}" == node.RUN_IMAGE_ALIAS
    assert parsed.checkpoint is not None
    assert parsed.checkpoint.volume in cluster.EXAMPLE_CLAIMS
    assert SCRIPT.name in " ".join(parsed.command)
