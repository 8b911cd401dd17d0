#!/usr/bin/env python3
"""A training loop that keeps TauGrid's checkpoint contract (docs/researcher.md).

It stands in for your `train.py`: the "model" is a few numbers and a step takes
`--step-seconds`, but the checkpoint handling is what a real run needs on TauGrid:

1. At every start, find the newest checkpoint and continue from it. Three sources name one:
   the API (`GET …/checkpoints/latest`, current at once), the file `$TAU_CHECKPOINT_FILE`
   (current within about a minute, and readable while the controller is unreachable) and
   `$TAU_RESUME_FROM` (fixed when the attempt was created). A start is not always a new
   attempt: Kueue may preempt a run and later readmit the same attempt with the same env.
2. Save a checkpoint to `$TAU_CHECKPOINT_DIR` every `--save-every` steps, atomically
   (write, fsync, rename), and only then report it (`POST …/checkpoints` with the pod's
   own token from `$TAU_TOKEN_FILE`, read at each report as the kubelet rotates it,
   naming `$TAU_ATTEMPT`).
3. On SIGTERM (a drained node, a preemption, a cancel), finish the step, save, report and
   exit with 143 within the pod's grace period (60 s by default). Not 0: a pod of a Job
   that exits 0 counts as a success, and the run would end Succeeded half-trained.
4. A report answered 409 means a newer attempt exists: this one is over, so stop.
5. Beside each checkpoint report, and at the end with a summary, report the loss as a result
   (`POST …/results`, best effort) for `tau results`.

Standard library only (Python 3.8 or newer), so it runs in any image; `tau checkpoint
--step N --path P` does the same reporting from a shell. With several workers only rank 0
(`RANK`, else `NODE_RANK`) writes and reports. `TAU_CA_FILE`, when set, is the CA bundle
to verify an HTTPS `TAU_URL` with.

    python train_with_checkpoints.py --steps 1000 --save-every 100
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

EXIT_SIGTERM = 128 + signal.SIGTERM
"""What a process killed by SIGTERM reports; the controller reads it as "stopped", not done."""
EXIT_USAGE = 2
EXIT_REFUSED = 3
"""The controller refused a report for a reason other than fencing (token, run, body)."""
EXIT_SUPERSEDED = 4
"""A newer attempt of the run exists: this attempt's work no longer counts."""


def log(message: str) -> None:
    """Print one line to stderr, which `tau logs` shows."""
    print(f"[train] {message}", file=sys.stderr, flush=True)


class RefusedError(Exception):
    """The controller answered with a 4xx other than 409: retrying will not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class SupersededError(Exception):
    """The controller answered 409: a newer attempt of this run exists."""


class UnreachableError(Exception):
    """No answer worth having after every retry (no connection, or 5xx each time)."""


class Controller:
    """The few calls of TauGrid's HTTP API a run's own pods make, with the run's token."""

    def __init__(self, env: dict[str, str], *, retries: int, backoff_s: float) -> None:
        self.url = env.get("TAU_URL", "").rstrip("/")
        self._token = env.get("TAU_TOKEN", "")
        self.token_file = env.get("TAU_TOKEN_FILE", "")
        namespace = env.get("TAU_NAMESPACE") or "default"
        self.run = env.get("TAU_RUN", "")
        run_path = f"/v1/runs/{namespace}/{urllib.parse.quote(self.run, safe='')}"
        self.path = run_path + "/checkpoints"
        self.results_path = run_path + "/results"
        self.retries = retries
        self.backoff_s = backoff_s
        ca_file = env.get("TAU_CA_FILE", "")
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None

    @property
    def enabled(self) -> bool:
        """Return whether the run can reach the controller at all (outside TauGrid: no)."""
        return bool(self.url and (self._token or self.token_file) and self.run)

    @property
    def token(self) -> str:
        """TAU_TOKEN, else the pod's projected token, read at each call: the kubelet
        rotates the file long before a long run ends."""
        if self._token or not self.token_file:
            return self._token
        try:
            return pathlib.Path(self.token_file).read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not self.url.startswith(("http://", "https://")):
            msg = f"TAU_URL must start with http:// or https://, not {self.url!r}"
            raise RefusedError(0, msg)
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310  (scheme checked above)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10, context=self.context) as response:  # noqa: S310
            return json.loads(response.read() or b"{}")

    def _with_retries(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, retries: int
    ) -> Any:
        """Retry what may pass on a second try: no connection, a 5xx (a leader failover
        answers 503 for a few seconds); give up at once on an answer that will not change."""
        delay = self.backoff_s
        for attempt in range(retries + 1):
            try:
                return self._call(method, path, body)
            except urllib.error.HTTPError as err:
                detail = _error_message(err)
                if err.code == 409:
                    raise SupersededError(detail) from None
                if err.code < 500:
                    raise RefusedError(err.code, detail) from None
                problem = f"HTTP {err.code}: {detail}"
            except (urllib.error.URLError, OSError) as err:
                problem = str(getattr(err, "reason", err))
            if attempt < retries:
                time.sleep(delay)
                delay *= 2
        msg = f"{method} {path} failed {retries + 1} times, last: {problem}"
        raise UnreachableError(msg)

    def report(self, attempt: int, step: int, path: str) -> None:
        """Report a checkpoint that is safely on disk."""
        report = {"attempt": attempt, "step": step, "path": path}
        self._with_retries("POST", self.path, report, retries=self.retries)

    def report_results(self, attempt: int, step: int, loss: float, summary: str = "") -> None:
        """Report the loss at this step (and a summary) for `tau results`: best effort, one
        retry, never a reason to stop training; a 409 is left to the next checkpoint report."""
        report: dict[str, Any] = {
            "attempt": attempt,
            "metrics": [{"name": "loss", "value": loss, "step": step}],
        }
        if summary:
            report["summary"] = summary
        try:
            self._with_retries("POST", self.results_path, report, retries=1)
        except (RefusedError, SupersededError, UnreachableError) as err:
            log(f"results at step {step} not reported: {err}")

    def latest(self) -> str | None:
        """Return the path of the newest reported checkpoint; None when there is none or the
        controller cannot say now (the file and TAU_RESUME_FROM still can): one retry only,
        so an unreachable controller delays the start by seconds, not minutes."""
        try:
            body = self._with_retries("GET", self.path + "/latest", retries=1)
        except RefusedError as err:
            if err.status != 404:  # 404: nothing reported yet
                log(f"cannot ask for the latest checkpoint: {err}")
            return None
        except (UnreachableError, SupersededError) as err:
            log(f"cannot ask for the latest checkpoint: {err}")
            return None
        path = body.get("path") if isinstance(body, dict) else None
        return path if isinstance(path, str) and path else None


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read() or b"{}")
    except ValueError:
        return err.reason if isinstance(err.reason, str) else str(err.code)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"{error.get('code', '')}: {error['message']}".lstrip(": ")
    return str(err.reason)


# ---------------------------------------------------------------- checkpoints on disk
def save(directory: pathlib.Path, state: dict[str, Any]) -> pathlib.Path:
    """Write the state as `step-<N>.json`, atomically: a pod killed mid-write leaves the
    previous checkpoint intact, never a torn one under the name a report points at."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{state['step']:08d}.json"
    partial = final.with_name(final.name + ".partial")
    with partial.open("w") as out:
        json.dump(state, out)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(final)
    return final


def load(path: str) -> dict[str, Any] | None:
    """Read a checkpoint; None when the path is gone or unreadable (say why)."""
    try:
        state = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as err:
        log(f"checkpoint {path} is unusable: {err}")
        return None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        log(f"checkpoint {path} has no step")
        return None
    return state


def newest(env: dict[str, str], controller: Controller) -> tuple[str, dict[str, Any]] | None:
    """Return the newest checkpoint any source names, as (path, state), or None."""
    candidates: list[tuple[str, str]] = []
    if controller.enabled:
        latest = controller.latest()
        if latest:
            candidates.append(("the API", latest))
    file_name = env.get("TAU_CHECKPOINT_FILE", "")
    if file_name:
        try:
            named = pathlib.Path(file_name).read_text().strip()
        except OSError:
            named = ""
        if named:
            candidates.append((file_name, named))
    if env.get("TAU_RESUME_FROM"):
        candidates.append(("TAU_RESUME_FROM", env["TAU_RESUME_FROM"]))
    best: tuple[str, dict[str, Any]] | None = None
    for source, path in candidates:
        state = load(path)
        if state is not None and (best is None or state["step"] > best[1]["step"]):
            best = (path, state)
            log(f"{source} names {path} (step {state['step']})")
    return best


# ---------------------------------------------------------------- the "model"
def fresh_state() -> dict[str, Any]:
    """Return the untrained model."""
    return {"step": 0, "weights": [1.0, -2.0, 0.5], "loss": None}


def train_step(state: dict[str, Any]) -> dict[str, Any]:
    """Return the state one step later (deterministic, so a resumed run ends where an
    uninterrupted one would)."""
    weights = [round(w * 0.9 + 0.01, 12) for w in state["weights"]]
    loss = round(sum(w * w for w in weights), 12)
    return {"step": state["step"] + 1, "weights": weights, "loss": loss}


# ---------------------------------------------------------------- main
class Stop:
    """Set by SIGTERM; the loop checks it between steps."""

    requested = False

    @classmethod
    def on_signal(cls, signum: int, frame: object) -> None:
        """Note the request; saving happens in the loop, never inside the handler."""
        del frame
        cls.requested = True
        log(f"got signal {signum}: will save and exit after this step")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(
        description="A training loop that keeps TauGrid's checkpoint contract."
    )
    parser.add_argument("--steps", type=int, default=1000, help="train until this step")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint interval")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="simulated work")
    parser.add_argument("--retries", type=int, default=5, help="report retries on 5xx")
    parser.add_argument("--backoff-seconds", type=float, default=1.0, help="first retry delay")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train to `--steps`, checkpointing and reporting; resume from the newest checkpoint."""
    args = parse_args(argv)
    env = dict(os.environ)
    if not env.get("TAU_CHECKPOINT_DIR"):
        log(
            "TAU_CHECKPOINT_DIR is not set: add `checkpoint: {dir: /ckpt, volume: ...}` to tau.yaml"
        )
        return EXIT_USAGE
    directory = pathlib.Path(env["TAU_CHECKPOINT_DIR"])
    attempt = int(env.get("TAU_ATTEMPT") or "1")
    rank = int(env.get("RANK") or env.get("NODE_RANK") or "0")
    controller = Controller(env, retries=args.retries, backoff_s=args.backoff_seconds)
    if not controller.enabled:
        log("TAU_URL, TAU_TOKEN(_FILE) or TAU_RUN is not set: checkpoints are saved, not reported")
    signal.signal(signal.SIGTERM, Stop.on_signal)

    found = newest(env, controller)
    state = found[1] if found else fresh_state()
    log(f"attempt {attempt}: " + (f"resuming at step {state['step']}" if found else "fresh start"))

    saved = state["step"]

    def checkpoint() -> None:
        nonlocal saved
        saved = state["step"]
        if rank != 0:
            return  # one writer: the others' state is the same after an all-reduce
        path = save(directory, state)
        if controller.enabled:
            try:
                controller.report(attempt, state["step"], str(path))
            except UnreachableError as err:
                # The file is on disk and the next report names a newer one; keep training.
                log(f"checkpoint {path} saved but not reported: {err}")
                return
            if state["loss"] is not None:
                controller.report_results(attempt, state["step"], state["loss"])
        log(f"checkpoint at step {state['step']}: {path}")

    try:
        while state["step"] < args.steps and not Stop.requested:
            time.sleep(args.step_seconds)  # the forward and backward pass
            state = train_step(state)
            if state["step"] % args.save_every == 0 or state["step"] >= args.steps:
                checkpoint()
        if state["step"] != saved:
            checkpoint()  # stopped between two checkpoints: save what the last step made
    except SupersededError as err:
        log(f"a newer attempt of this run exists, stopping: {err}")
        return EXIT_SUPERSEDED
    except RefusedError as err:
        log(f"the controller refused a checkpoint report: {err}")
        return EXIT_REFUSED
    if state["step"] < args.steps:
        log(f"stopped at step {state['step']} on SIGTERM; the next start resumes from here")
        return EXIT_SIGTERM
    log(f"done at step {state['step']}, loss {state['loss']}")
    if controller.enabled and rank == 0 and state["loss"] is not None:
        summary = f"trained to step {state['step']}; final loss {state['loss']}"
        controller.report_results(attempt, state["step"], state["loss"], summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
