"""`tau logs` across workers and attempts, and `tau results --download`."""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.client import stub

RUN = "/v1/runs/default/r"


@pytest.fixture
def controller(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> Iterator[stub.Controller]:
    """A loopback controller; no TAU_* variables, an empty config dir."""
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_TOKEN_FILE", "TAU_NAMESPACE", "TAU_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    server = stub.Controller()
    try:
        yield server
    finally:
        server.close()


def _log_of(seen: stub.Seen) -> bytes:
    """Each worker's and attempt's log says which it is, over two lines."""
    w, a = seen.query.get("worker"), seen.query.get("attempt")
    return f"a{a} w{w} one\na{a} w{w} two".encode()


def _plain() -> dict[str, str]:
    return {"Content-Type": "text/plain"}


# ---------------------------------------------------------------- pure parts
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90", 90, id="a bare number is seconds"),
        pytest.param("30s", 30, id="seconds"),
        pytest.param("10m", 600, id="minutes"),
        pytest.param("2h", 7200, id="hours"),
        pytest.param("1h30m", 5400, id="hours and minutes"),
        pytest.param("1d", 86400, id="a day"),
    ],
)  # fmt: skip
def test_durations_read_as_people_write_them(text: str, seconds: int) -> None:
    """`--since` takes what `kubectl logs --since` takes."""
    assert seconds == stub.tau_client().duration(text)


@pytest.mark.parametrize(
    "text",
    [pytest.param("", id="empty"), pytest.param("ten", id="words"),
     pytest.param("0s", id="zero"), pytest.param("5w", id="weeks")],
)  # fmt: skip
def test_a_bad_duration_is_refused(text: str) -> None:
    """argparse turns the refusal into a usage error naming --since."""
    tau = stub.tau_client()
    with pytest.raises(tau.argparse.ArgumentTypeError):
        tau.duration(text)


@pytest.mark.parametrize(
    ("run", "followed", "expected"),
    [
        pytest.param({"attempt": 2, "phase": "Running"}, 1, ("next", 2),
                     id="a newer attempt: follow the next one"),
        pytest.param({"attempt": 3, "phase": "Running"}, 1, ("next", 2),
                     id="two newer: the one in between first"),
        pytest.param({"attempt": 1, "phase": "Succeeded"}, 1, ("done", 0),
                     id="ended with no newer attempt: done"),
        pytest.param({"attempt": 2, "phase": "Failed"}, 1, ("next", 2),
                     id="ended after a newer attempt: that one first"),
        pytest.param({"attempt": 1, "phase": "Resuming"}, 1, ("wait", 0),
                     id="between attempts: wait"),
        pytest.param({"attempt": 0, "phase": "Queued"}, 0, ("wait", 0),
                     id="not started: wait"),
    ],
)  # fmt: skip
def test_follow_goes_on_to_the_next_attempt(
    run: dict[str, Any], followed: int, expected: tuple[str, int]
) -> None:
    """What `logs -f` does once an attempt's log ends."""
    assert expected == stub.tau_client().after_attempt(run, followed)


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        pytest.param({"kind": "job", "spec": {}}, 1, id="a job of one"),
        pytest.param({"kind": "pytorch", "spec": {"workers": 4}}, 4, id="pytorch: its workers"),
        pytest.param({"kind": "ray", "spec": {"workers": 2}}, 3, id="ray: the head too"),
    ],
)  # fmt: skip
def test_worker_count(run: dict[str, Any], expected: int) -> None:
    """Workers as `logs?worker=` numbers them."""
    assert expected == stub.tau_client().worker_count(run)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([b"a\nb\n"], b"[w1] a\n[w1] b\n", id="whole lines"),
        pytest.param([b"a", b"b\nc"], b"[w1] ab\n[w1] c\n",
                     id="a line split across chunks stays one, the last gets its newline"),
    ],
)  # fmt: skip
def test_lines_are_prefixed_whole(chunks: list[bytes], expected: bytes) -> None:
    """Two workers' output never mixes inside a line."""
    assert expected == b"".join(stub.tau_client().prefixed(chunks, b"[w1] "))


# ---------------------------------------------------------------- tau logs
def test_all_workers_prints_every_worker_prefixed(
    controller: stub.Controller, capfd: pytest.CaptureFixture[str]
) -> None:
    """--all-workers reads the run's worker count and prints each worker's lines, prefixed."""
    controller.routes[("GET", RUN)] = (200, stub.run_json("r", "default", attempt=1, kind="pytorch",
                                                         spec={"workers": 2}), {})  # fmt: skip
    controller.routes[("GET", RUN + "/logs")] = (200, _log_of, _plain())
    code = stub.tau_client().main(["--url", controller.url, "logs", "r", "--all-workers"])
    expected = (0, "[w0] aNone w0 one\n[w0] aNone w0 two\n[w1] aNone w1 one\n[w1] aNone w1 two\n")
    assert expected == (code, capfd.readouterr().out)


def test_since_is_sent_in_seconds(controller: stub.Controller) -> None:
    """--since 10m asks the controller for sinceSeconds=600."""
    controller.routes[("GET", RUN + "/logs")] = (200, b"x\n", _plain())
    stub.tau_client().main(["--url", controller.url, "logs", "r", "--since", "10m"])
    expected = "600"
    assert expected == controller.seen[-1].query.get("sinceSeconds")


def test_follow_goes_on_across_attempts_until_the_run_ends(
    controller: stub.Controller, capfd: pytest.CaptureFixture[str]
) -> None:
    """-f prints attempt 1's log, then attempt 2's once the run resumes, and ends with it."""
    states = [
        stub.run_json("r", "default", attempt=1, phase="Running"),
        stub.run_json("r", "default", attempt=1, phase="Resuming"),
        stub.run_json("r", "default", attempt=2, phase="Running"),
        stub.run_json("r", "default", attempt=2, phase="Succeeded"),
    ]
    controller.routes[("GET", RUN)] = (200, lambda _: states.pop(0) if len(states) > 1
                                       else states[0], {})  # fmt: skip
    controller.routes[("GET", RUN + "/logs")] = (200, _log_of, _plain())
    tau = stub.tau_client()
    tau.FOLLOW_POLL_S = 0.0
    code = tau.main(["--url", controller.url, "logs", "-f", "r"])
    out, err = capfd.readouterr()
    expected = (0, "a1 w0 one\na1 w0 twoa2 w0 one\na2 w0 two", True)
    assert expected == (code, out, "goes on with attempt 2" in err)


# ---------------------------------------------------------------- tau results --download
@pytest.mark.parametrize(
    ("artifacts", "expected"),
    [
        pytest.param([{"uri": "https://h/x/model.pt"}], [("model.pt", "")],
                     id="an https artifact is saved under its last path segment"),
        pytest.param([{"uri": "https://h/a/m.pt"}, {"uri": "https://h/b/m.pt"}],
                     [("m.pt", ""), ("m-2.pt", "")], id="two of one name stay apart"),
        pytest.param([{"uri": "https://h/..%2F..%2Fetc%2Fpasswd"}], [("passwd", "")],
                     id="an encoded path never leaves the directory"),
        pytest.param([{"uri": "https://h/"}], [("artifact-1", "")],
                     id="no name: a numbered one"),
        pytest.param([{"uri": "s3://b/m.pt"}], [("", "fetch it with aws s3 cp s3://b/m.pt out/")],
                     id="s3 is not fetched: the hint names the tool"),
        pytest.param([{"uri": "/ckpt/step-900"}], [("", "a path inside the run's volume")],
                     id="a path on a volume says so"),
    ],
)  # fmt: skip
def test_artifact_plan(artifacts: list[dict[str, Any]], expected: list[tuple[str, str]]) -> None:
    """What --download does with each artifact URI, and the file name it uses."""
    plan = stub.tau_client().artifact_plan(artifacts, "out")
    actual = [(pathlib.Path(dest).name if dest else "", hint[: len(want)])
              for (_, dest, hint), (_, want) in zip(plan, expected, strict=True)]  # fmt: skip
    assert expected == actual


def _results(controller: stub.Controller, artifacts: list[dict[str, Any]]) -> None:
    answer = {"name": "r", "namespace": "default", "phase": "Succeeded", "attempt": 1,
              "metrics": [], "artifacts": artifacts, "summary": ""}  # fmt: skip
    controller.routes[("GET", RUN + "/results")] = (200, answer, {})


def test_download_fetches_http_artifacts_without_the_token(
    controller: stub.Controller, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file lands in DIR with its digest checked; the artifact's server never sees the
    tau token (a URI is whatever the run reported); s3:// gets a hint on stderr."""
    store = stub.Controller()
    try:
        data = b"weights" * 1000
        store.routes[("GET", "/bucket/model.pt")] = (200, data, {"Content-Type": "x/y"})
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _results(controller, [{"uri": f"{store.url}/bucket/model.pt", "digest": digest},
                              {"uri": "s3://b/big.ckpt"}])  # fmt: skip
        code = stub.tau_client().main(["--url", controller.url, "--token", "secret", "results",
                                       "r", "--download", str(tmp_path / "out")])  # fmt: skip
        auth = [s.authorization for s in store.seen]
    finally:
        store.close()
    err = capsys.readouterr().err
    expected = (0, data, [None], True)
    actual = (code, (tmp_path / "out" / "model.pt").read_bytes(), auth, "aws s3 cp" in err)
    assert expected == actual


def test_download_keeps_nothing_whose_digest_differs(
    controller: stub.Controller, tmp_path: pathlib.Path
) -> None:
    """A file that is not what the run reported is not kept (exit 7)."""
    store = stub.Controller()
    try:
        store.routes[("GET", "/m.pt")] = (200, b"tampered", {"Content-Type": "x/y"})
        _results(controller, [{"uri": f"{store.url}/m.pt", "digest": "sha256:" + "0" * 64}])
        code = stub.tau_client().main(["--url", controller.url, "results", "r",
                                       "--download", str(tmp_path)])  # fmt: skip
    finally:
        store.close()
    expected: tuple[int, list[str]] = (7, [])
    assert expected == (code, sorted(p.name for p in tmp_path.iterdir()))
