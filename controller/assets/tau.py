#!/usr/bin/env python3
"""tau: submit and follow TauGrid runs. One file, Python 3.8+, standard library only.

    tau run tau.yaml                              submit a run described by a tau.yaml
    tau validate tau.yaml                         check it as a submission would, create nothing
    tau schema                                    the JSON Schema of tau.yaml
    tau run --gpus 4 --image IMG -- python t.py   submit without a file
    tau status [RUN]                              one run in detail, or all your runs
    tau list [--phase P] [--queue Q] [-A]         runs as a table
    tau logs [-f] RUN [--attempt N] [--worker K]  a worker's log (-f: keep following)
    tau cancel RUN                                stop a run and free its GPUs
    tau queues                                    your queues: quota, usage, who waits
    tau evidence RUN                              what ran where, to reproduce it
    tau resume RUN [--checkpoint P]               start a failed or cancelled run again
    tau rerun RUN [--name NEW]                    a new run from RUN's evidence (image by digest)
    tau checkpoint --step N --path P              (inside a run) report a saved checkpoint
    tau checkpoint latest [--path-only]           (inside a run) the newest checkpoint
    tau result --metric loss=0.12 --step 900      (inside a run) report metrics at a step
    tau result --artifact s3://b/m.pt [--size N --digest sha256:D] [--summary TEXT]
    tau results RUN [--metric loss]               a run's metrics, artifacts and summary
    tau results RUN1 RUN2 | --experiment NAME     runs' final metrics side by side
    tau experiments                               your experiments and their runs

Inside a run's pods TAU_URL, TAU_TOKEN_FILE (the pod's own token, which works only for its
run and attempt), TAU_NAMESPACE, TAU_RUN and TAU_ATTEMPT are set, so `tau checkpoint` and
`tau result` need only what they report.

Settings come from flags or the environment: --url / TAU_URL (the controller),
--token / TAU_TOKEN (any token your Kubernetes API server accepts, e.g. from
`kubectl create token`), --token-file / TAU_TOKEN_FILE (read at each start; used when no
token is given), -n / TAU_NAMESPACE (default: the spec's namespace, else default),
--ca-file / TAU_CA_FILE (PEM bundle of the CA that issued the controller's certificate,
trusted besides the system store; set in run pods when the controller has a CA).

Exit codes, for scripts:
    0  done (for `status RUN --wait`: the run succeeded)
    1  the run failed or was cancelled (`status RUN --wait`)
    2  wrong usage of tau itself
    3  the spec was refused (the message names the field)
    4  not allowed: no or a bad token (401), or RBAC says no (403)
    5  no such run or namespace
    6  conflict: a run of that name exists, or it already ended
    7  the controller could not be reached or failed
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import pathlib
import secrets
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INVALID = 0, 1, 2, 3
EXIT_FORBIDDEN, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_UNAVAILABLE = 4, 5, 6, 7
TERMINAL = ("Succeeded", "Failed", "Cancelled")


class TauError(Exception):
    """An answer that ends the command: message for people, code for scripts."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _exit_code(status: int) -> int:
    if status in (400, 413, 415, 422):
        return EXIT_INVALID
    if status in (401, 403):
        return EXIT_FORBIDDEN
    if status == 404:
        return EXIT_NOT_FOUND
    if status == 409:
        return EXIT_CONFLICT
    return EXIT_UNAVAILABLE


def ssl_context(ca_file: str) -> ssl.SSLContext | None:
    """Trust `ca_file` (PEM) for the controller's certificate, besides the system store (so
    a TAU_URL behind a publicly trusted proxy still works); None (the system store alone)
    when empty. A missing or unreadable file is a usage error, not an unreachable controller."""
    if not ca_file:
        return None
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise TauError(f"cannot load the CA file {ca_file}: {err}", EXIT_USAGE) from None
    return context


def origin(url: str) -> tuple[str, str, int | None]:
    """The origin of a URL: scheme, host and port (the default port made explicit)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only within the controller's origin (scheme, host, port).

    urllib copies every header added with `add_header`, Authorization included, into the
    redirected request; a redirect to another origin (another host, or https to http) would
    hand the token to it. So such a redirect ends the command instead.
    """

    def redirect_request(  # noqa: PLR0917  (urllib calls it with these six, positionally)
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(target) != origin(req.full_url):
            raise TauError(
                f"the controller answered HTTP {code} redirecting to another origin ({target});"
                " tau does not follow it, so your token stays with the controller. If that is"
                " the right address, set TAU_URL to it.",
                EXIT_UNAVAILABLE,
            )
        return super().redirect_request(req, fp, code, msg, headers, target)


class Client:
    """The controller's HTTP API."""

    def __init__(self, url: str, token: str, timeout: float = 30.0, ca_file: str = "") -> None:
        if not url:
            raise TauError("no controller URL: set TAU_URL or pass --url", EXIT_USAGE)
        if not url.startswith(("http://", "https://")):
            raise TauError(
                f"the controller URL must start with http:// or https://: {url}", EXIT_USAGE
            )
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl_context(ca_file)
        handlers: list[urllib.request.BaseHandler] = [SameOriginRedirects()]
        if self.context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        self.opener = urllib.request.build_opener(*handlers)
        scheme, host, _ = origin(self.url)
        if token and scheme == "http" and not is_loopback(host):
            print(
                f"warning: sending your token over plain http:// to {host}: anyone on the way"
                " can read it and act as you. Use the controller's https:// URL.",
                file=sys.stderr,
            )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        query: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> Any:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        req = urllib.request.Request(url, data=body, method=method)  # noqa: S310  (scheme checked in __init__)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            resp = self.opener.open(req, timeout=None if stream else self.timeout)
        except urllib.error.HTTPError as err:
            raise self._error(err.code, err.read()) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise TauError(f"cannot reach {self.url}: {reason}", EXIT_UNAVAILABLE) from None
        if stream:
            return resp
        with resp:
            data = resp.read()
            return resp.status, (json.loads(data) if data else {})

    @staticmethod
    def _error(status: int, raw: bytes) -> TauError:
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            return TauError(
                f"HTTP {status}: {raw[:200].decode(errors='replace')}", _exit_code(status)
            )
        lines = [err.get("message") or f"HTTP {status}"]
        problems = body.get("problems") or []
        if len(problems) > 1:
            lines = ["the spec has problems:"] + [
                f"  {p.get('field') or '(document)'}: {p.get('message')}" for p in problems
            ]
        elif err.get("field") and not lines[0].startswith(err["field"]):
            lines[0] = f"{err['field']}: {lines[0]}"
        return TauError("\n".join(lines), _exit_code(status))


# ---------------------------------------------------------------- formatting
def _age(stamp: str | None) -> str:
    if not stamp:
        return "-"
    try:
        then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc
        )
    except ValueError:
        return stamp
    now = datetime.datetime.now(datetime.timezone.utc)
    seconds = int((now - then).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    rows = [[("-" if c is None or c == "" else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [headers, *rows]:
        cells = [c.ljust(widths[i]) for i, c in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _position(run: dict[str, Any]) -> str:
    pos = run.get("queuePosition")
    if pos is None:
        return "-"
    return f"{pos + 1}" if isinstance(pos, int) else str(pos)


def _print_runs(runs: list[dict[str, Any]], all_namespaces: bool) -> None:
    headers = ["NAME", "PHASE", "QUEUE", "GPUS", "ATTEMPT", "POSITION", "AGE", "MESSAGE"]
    rows = []
    for r in runs:
        row = [
            r["name"],
            r["phase"],
            r["queue"],
            r.get("gpus", 0),
            r.get("attempt") or "-",
            _position(r),
            _age(r.get("createdAt")),
            r.get("message") or "",
        ]
        rows.append(([r["namespace"]] if all_namespaces else []) + row)
    if all_namespaces:
        headers = ["NAMESPACE", *headers]
    print(_table(headers, rows) if rows else "no runs")


def _print_run(run: dict[str, Any]) -> None:
    pairs = [
        ("Name", run["name"]),
        ("Namespace", run["namespace"]),
        ("Kind", run.get("kind")),
        ("Phase", run["phase"] + (f" ({run['reason']})" if run.get("reason") else "")),
        ("Queue", run["queue"]),
        ("GPUs", run.get("gpus")),
        ("Attempt", run.get("attempt") or "-"),
    ]
    if run.get("queuePosition") is not None:
        ahead = run["queuePosition"]
        words = "next in line" if ahead == 0 else f"{ahead} ahead of it"
        in_lq = run.get("queuePositionInLocalQueue")
        extra = f", {in_lq} ahead in queue {run['queue']}" if in_lq is not None else ""
        source = run.get("queuePositionSource")
        where = f"{ahead + 1} in the cluster queue ({words}{extra}; source: {source})"
        pairs.append(("Position", where))
    if run.get("message"):
        pairs.append(("Message", run["message"]))
    pairs += [
        ("Created", run.get("createdAt")),
        ("Started", run.get("startTime")),
        ("Ended", run.get("endTime")),
    ]
    width = max(len(k) for k, _ in pairs) + 1
    for key, value in pairs:
        print(f"{key + ':':<{width}} {value if value not in (None, '') else '-'}")
    attempts = run.get("attempts") or []
    if attempts:
        print()
        rows = [
            [
                a.get("number"),
                a.get("phase"),
                ",".join(a.get("nodes") or []),
                ",".join(str(c) for c in a.get("exitCodes") or []),
                a.get("failureClass"),
                a.get("resumeFrom") or "-",
                a.get("startTime"),
                a.get("endTime") or "",
            ]
            for a in attempts
        ]
        headers = [
            "ATTEMPT",
            "PHASE",
            "NODES",
            "EXIT",
            "FAILURE",
            "RESUMED FROM",
            "STARTED",
            "ENDED",
        ]
        print(_table(headers, rows))
        for a in attempts:
            if a.get("failureClass") and a.get("message"):
                print(f"  attempt {a.get('number')}: {a['message']}")
    checkpoints = run.get("checkpoints") or []
    if checkpoints:
        last = checkpoints[-1]
        print(
            f"\nLatest checkpoint: {last.get('path')} (step {last.get('step')},"
            f" attempt {last.get('attempt')})"
        )


# ---------------------------------------------------------------- commands
def _namespace_query(args: argparse.Namespace) -> dict[str, Any]:
    return {"namespace": args.namespace} if args.namespace else {}


def cmd_run(client: Client, args: argparse.Namespace) -> int:
    if args.file and (args.image or args.command):
        raise TauError("give either a tau.yaml or --image with a command, not both", EXIT_USAGE)
    if args.file:
        body, content_type = _spec_body(args.file)
    else:
        if not args.image or not args.command:
            raise TauError("give a tau.yaml, or --image IMAGE -- command ...", EXIT_USAGE)
        spec = {
            "name": args.name or "run-" + secrets.token_hex(3),
            "image": args.image,
            "command": args.command,
            "resources": {"gpus": args.gpus},
            "workers": args.workers,
            "kind": args.kind,
        }
        if args.queue:
            spec["queue"] = args.queue
        body = json.dumps(spec).encode()
        content_type = "application/json"
    headers = {"Content-Type": content_type, "Idempotency-Key": secrets.token_hex(16)}
    query = _namespace_query(args)
    try:
        _, run = client.request("POST", "/v1/runs", body, headers=headers, query=query)
    except TauError as err:
        if err.code != EXIT_UNAVAILABLE or "cannot reach" not in str(err):
            raise
        time.sleep(1.0)  # the same Idempotency-Key makes the retry safe
        _, run = client.request("POST", "/v1/runs", body, headers=headers, query=query)
    if args.json:
        print(json.dumps(run, indent=2))
        return EXIT_OK
    for warning in run.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"run {run['name']} submitted to queue {run['queue']} in namespace"
        f" {run['namespace']}: {run['phase']}"
    )
    if run.get("message"):
        print(run["message"])
    print(f"follow it with: tau status {run['name']}  |  tau logs -f {run['name']}")
    return EXIT_OK


def _get_run(client: Client, args: argparse.Namespace, name: str) -> dict[str, Any]:
    ns = args.namespace or "default"
    _, run = client.request("GET", f"/v1/runs/{ns}/{urllib.parse.quote(name)}")
    return dict(run)


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    if not args.run:
        return cmd_list(client, args)
    run = _get_run(client, args, args.run)
    while args.wait and run["phase"] not in TERMINAL:
        time.sleep(2.0)
        run = _get_run(client, args, args.run)
    if args.json:
        print(json.dumps(run, indent=2))
    else:
        _print_run(run)
    if args.wait:
        return EXIT_OK if run["phase"] == "Succeeded" else EXIT_RUN_FAILED
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    query = (
        {} if getattr(args, "all_namespaces", False) else {"namespace": args.namespace or "default"}
    )
    query.update({"phase": getattr(args, "phase", None), "queue": getattr(args, "queue", None)})
    _, body = client.request("GET", "/v1/runs", query=query)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        _print_runs(body.get("items") or [], getattr(args, "all_namespaces", False))
    return EXIT_OK


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    query = {
        "follow": "true" if args.follow else None,
        "attempt": args.attempt,
        "worker": args.worker,
        "tail": args.tail,
        "kept": "true" if args.kept else None,
    }
    resp = client.request(
        "GET", f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}/logs", query=query, stream=True
    )
    if resp.headers.get("X-TauGrid-Log-Source") == "kept":
        how = "complete" if resp.headers.get("X-TauGrid-Log-Complete") == "true" else "partial"
        older = (
            ", older output dropped"
            if resp.headers.get("X-TauGrid-Log-Truncated") == "true"
            else ""
        )
        print(
            f"tau: pod {resp.headers.get('X-TauGrid-Pod') or '?'} is gone; this is the kept tail"
            f" of its log ({how}{older}, captured at"
            f" {resp.headers.get('X-TauGrid-Log-Captured-At') or '?'})",
            file=sys.stderr,
        )
    out = getattr(sys.stdout, "buffer", None)
    with resp:
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(4096)
            if not chunk:
                break
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stdout.write(chunk.decode(errors="replace"))
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    _, run = client.request("DELETE", f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}")
    if args.json:
        print(json.dumps(run, indent=2))
    else:
        print(
            f"run {run['name']}: {run['phase']}"
            + (f" ({run['message']})" if run.get("message") else "")
        )
    return EXIT_OK


def cmd_queues(client: Client, args: argparse.Namespace) -> int:
    _, body = client.request("GET", "/v1/queues", query={"namespace": args.namespace or "default"})
    if args.json:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    items = body.get("items") or []
    if not items:
        print(f"no queues in namespace {body.get('namespace')}; ask your platform team for one")
        return EXIT_OK
    rows = []
    for q in items:
        gpu = [r for r in q.get("resources") or [] if r["resource"] == "nvidia.com/gpu"]
        usage = ", ".join(f"{r['used']}/{r['quota']} ({r['flavor']})" for r in gpu) or "-"
        rows.append(
            [
                q["name"],
                q.get("clusterQueue"),
                usage,
                q.get("admittedWorkloads"),
                q.get("pendingWorkloads"),
            ]
        )
    print(_table(["QUEUE", "CLUSTER QUEUE", "GPUS USED/QUOTA", "ADMITTED", "PENDING"], rows))
    waiting = [(q["name"], w) for q in items for w in q.get("waiting") or []]
    if waiting:
        print()
        print(
            _table(
                ["QUEUE", "WAITING RUN", "GPUS", "POSITION", "WHY"],
                [
                    [qn, w["name"], w.get("gpus"), _position(w), w.get("message") or ""]
                    for qn, w in waiting
                ],
            )
        )
    return EXIT_OK


def cmd_evidence(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    _, body = client.request("GET", f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}/evidence")
    print(json.dumps(body, indent=2))
    return EXIT_OK


def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    body = {"checkpoint": args.checkpoint} if args.checkpoint else {}
    _, run = client.request(
        "POST",
        f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}/resume",
        json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    if args.json:
        print(json.dumps(run, indent=2))
    else:
        print(f"run {run['name']}: attempt {run.get('attempt')} {run['phase']}: {run['message']}")
    return EXIT_OK


def _own_run(args: argparse.Namespace) -> tuple[str, str]:
    run = args.run or os.environ.get("TAU_RUN", "")
    if not run:
        raise TauError("no run: pass --run or set TAU_RUN (set in every run's pods)", EXIT_USAGE)
    return args.namespace or "default", run


def cmd_checkpoint(client: Client, args: argparse.Namespace) -> int:
    ns, run = _own_run(args)
    path = f"/v1/runs/{ns}/{urllib.parse.quote(run)}/checkpoints"
    if args.action == "latest":
        try:
            _, body = client.request("GET", path + "/latest")
        except TauError as err:
            if err.code != EXIT_NOT_FOUND or "no checkpoint" not in str(err):
                raise
            return EXIT_NOT_FOUND  # nothing reported yet: print nothing, start fresh
        print(body.get("path", "") if args.path_only else json.dumps(body, indent=2))
        return EXIT_OK
    if args.action is not None:
        raise TauError(f"unknown checkpoint action {args.action!r}; try: latest", EXIT_USAGE)
    if args.step is None or not args.path:
        raise TauError("report a checkpoint with --step N --path P", EXIT_USAGE)
    attempt = args.attempt if args.attempt is not None else os.environ.get("TAU_ATTEMPT")
    if attempt is None or not str(attempt).isdigit():
        raise TauError("no attempt: pass --attempt or set TAU_ATTEMPT", EXIT_USAGE)
    report = {"attempt": int(attempt), "step": args.step, "path": args.path}
    _, body = client.request(
        "POST", path, json.dumps(report).encode(), headers={"Content-Type": "application/json"}
    )
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(f"checkpoint of run {run} at step {body['step']} recorded: {body['path']}")
    return EXIT_OK


def cmd_result(client: Client, args: argparse.Namespace) -> int:
    ns, run = _own_run(args)
    attempt = args.attempt if args.attempt is not None else os.environ.get("TAU_ATTEMPT")
    if attempt is None or not str(attempt).isdigit():
        raise TauError("no attempt: pass --attempt or set TAU_ATTEMPT", EXIT_USAGE)
    report: dict[str, Any] = {"attempt": int(attempt)}
    if args.metric:
        if args.step is None:
            raise TauError("a metric needs its training step: --step N", EXIT_USAGE)
        metrics = []
        for item in args.metric:
            name, sep, value = item.partition("=")
            try:
                number = float(value)
            except ValueError:
                number = None
            if not sep or not name or number is None:
                raise TauError(f"--metric takes NAME=NUMBER, not {item!r}", EXIT_USAGE)
            metrics.append({"name": name, "value": number, "step": args.step})
        report["metrics"] = metrics
    if args.artifact:
        if (args.size is not None or args.digest) and len(args.artifact) > 1:
            raise TauError("--size and --digest describe one --artifact at a time", EXIT_USAGE)
        artifacts = [{"uri": uri} for uri in args.artifact]
        if args.size is not None:
            artifacts[0]["size"] = args.size
        if args.digest:
            artifacts[0]["digest"] = args.digest
        report["artifacts"] = artifacts
    if args.summary is not None:
        report["summary"] = args.summary
    if len(report) == 1:
        raise TauError("report something: --metric NAME=V --step N, --artifact URI or --summary",
                       EXIT_USAGE)  # fmt: skip
    for tries_left in (2, 1, 0):  # a leader change answers 503 for a moment: ask again
        try:
            _, body = client.request(
                "POST", f"/v1/runs/{ns}/{urllib.parse.quote(run)}/results",
                json.dumps(report).encode(), headers={"Content-Type": "application/json"},
            )  # fmt: skip
            break
        except TauError as err:
            if err.code != EXIT_UNAVAILABLE or not tries_left:
                raise
            time.sleep(1.0)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        got = body.get("accepted") or {}
        summary = ", a summary" if got.get("summary") else ""
        print(f"results of run {run} accepted ({got.get('metrics', 0)} metrics,"
              f" {got.get('artifacts', 0)} artifacts{summary})")  # fmt: skip
    return EXIT_OK


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


_CONTROLS = dict.fromkeys([c for c in range(0x20) if c not in (0x09, 0x0A)]
                          + [0x7F] + list(range(0x80, 0xA0)))  # fmt: skip


def _printable(value: Any) -> str:
    """Text a run reported, without the control characters (ESC, CSI...) that would drive
    the terminal: the controller strips them on write, and an older one did not."""
    return str(value).translate(_CONTROLS)


def _print_results(body: dict[str, Any], metric: str | None) -> None:
    print(f"Run:     {body['name']} ({body.get('phase')}, attempt {body.get('attempt') or '-'})")
    exp = body.get("experiment") or {}
    if exp.get("name") or exp.get("project"):
        print(_printable(f"Experiment: {exp.get('name') or '-'} (project"
                         f" {exp.get('project') or '-'})"))  # fmt: skip
    if body.get("summary"):
        print(f"Summary: {_printable(body['summary'])}")
    metrics = body.get("metrics") or []
    if metric is not None:
        (series,) = metrics
        print()
        print(_table(["STEP", metric.upper(), "TIME"],
                     [[p["step"], _number(p["value"]), p.get("time")]
                      for p in series.get("points") or []]))  # fmt: skip
        if series.get("thinned"):
            print(f"({series['thinned']} older points were thinned to keep the run's status small)")
        return
    if metrics:
        print()
        rows = []
        for m in metrics:
            values = [p["value"] for p in m.get("points") or []]
            last = m.get("last") or {}
            rows.append([_printable(m["name"]), _number(last.get("value")), last.get("step"),
                         len(values),
                         _number(min(values) if values else None),
                         _number(max(values) if values else None)])  # fmt: skip
        print(_table(["METRIC", "LAST", "STEP", "POINTS", "MIN", "MAX"], rows))
    artifacts = body.get("artifacts") or []
    if artifacts:
        print()
        print(_table(["ARTIFACT", "SIZE", "DIGEST", "ATTEMPT"],
                     [[_printable(a["uri"]), a.get("size"), a.get("digest"), a.get("attempt")]
                      for a in artifacts]))  # fmt: skip
        if body.get("artifactsDropped"):
            print(f"({body['artifactsDropped']} older artifacts are no longer listed)")
    if not metrics and not artifacts and not body.get("summary"):
        print("no results reported yet (tau result, inside the run)")


def _print_compare(body: dict[str, Any], metric: str | None) -> None:
    runs = body.get("runs") or []
    if not runs:
        print(f"no runs in experiment {body.get('experiment')!r}")
        return
    names = [metric] if metric else list(body.get("metrics") or [])
    rows = []
    for run in runs:
        final = run.get("final") or {}
        cells = [
            f"{_number(final[n]['value'])} @{final[n]['step']}" if n in final else "-"
            for n in names
        ]
        rows.append([run["name"], run.get("phase"), *cells])
    print(_table(["RUN", "PHASE", *[n.upper() for n in names]], rows))


def cmd_results(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    if args.experiment and args.runs:
        raise TauError("give runs or --experiment, not both", EXIT_USAGE)
    if not args.experiment and not args.runs:
        raise TauError("which run? tau results RUN (or --experiment NAME)", EXIT_USAGE)
    if args.experiment or len(args.runs) > 1:
        query: dict[str, Any] = {"namespace": ns, "metric": args.metric}
        if args.experiment:
            query["name"] = args.experiment
        else:
            query["run"] = args.runs
        _, body = client.request("GET", "/v1/experiments/compare", query=query)
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            _print_compare(body, args.metric)
        return EXIT_OK
    (run,) = args.runs
    _, body = client.request(
        "GET", f"/v1/runs/{ns}/{urllib.parse.quote(run)}/results", query={"metric": args.metric}
    )
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        _print_results(body, args.metric)
    return EXIT_OK


def cmd_experiments(client: Client, args: argparse.Namespace) -> int:
    _, body = client.request("GET", "/v1/experiments",
                             query={"namespace": args.namespace or "default"})  # fmt: skip
    if args.json:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    items = body.get("items") or []
    if not items:
        print("no experiments (set experiment.name in tau.yaml)")
        return EXIT_OK
    rows = [
        [e["name"], ",".join(e.get("projects") or []), e.get("runs"),
         ", ".join(f"{n} {p}" for p, n in sorted((e.get("phases") or {}).items())),
         ",".join(e.get("tags") or [])]
        for e in items
    ]  # fmt: skip
    print(_table(["EXPERIMENT", "PROJECT", "RUNS", "PHASES", "TAGS"], rows))
    return EXIT_OK


def _spec_body(path: str) -> tuple[bytes, str]:
    try:
        body = pathlib.Path(path).read_bytes()
    except OSError as err:
        raise TauError(f"cannot read {path}: {err.strerror}", EXIT_USAGE) from None
    return body, ("application/json" if path.endswith(".json") else "application/yaml")


def _supports_dry_run(client: Client) -> bool:
    """Whether the controller documents `dryRun` on POST /v1/runs: an older one would ignore
    the parameter and *create* the run, so validate never sends it to one that does not."""
    _, doc = client.request("GET", "/openapi.json")
    post = ((doc.get("paths") or {}).get("/v1/runs") or {}).get("post") or {}
    return any(p.get("name") == "dryRun" for p in post.get("parameters") or [])


def cmd_validate(client: Client, args: argparse.Namespace) -> int:
    body, content_type = _spec_body(args.file)
    if not _supports_dry_run(client):
        raise TauError(
            "this controller cannot validate without submitting (no dryRun on POST /v1/runs);"
            " upgrade it, or check the file against `tau schema`", EXIT_UNAVAILABLE,
        )  # fmt: skip
    query = {**_namespace_query(args), "dryRun": "true"}
    _, answer = client.request("POST", "/v1/runs", body,
                               headers={"Content-Type": content_type}, query=query)  # fmt: skip
    if not answer.get("dryRun"):
        raise TauError("the controller did not answer as a dry run; nothing is certain",
                       EXIT_UNAVAILABLE)  # fmt: skip
    if args.json:
        print(json.dumps(answer, indent=2))
        return EXIT_OK
    for warning in answer.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    run = answer.get("run") or {}
    meta = run.get("metadata") or {}
    spec = run.get("spec") or {}
    print(f"{args.file} is valid: run {meta.get('name')} in namespace {meta.get('namespace')},"
          f" queue {spec.get('queue') or 'default'}")  # fmt: skip
    rows = [["TauRun", meta.get("name")]] + [
        [o.get("kind"), (o.get("metadata") or {}).get("name")] for o in answer.get("objects") or []
    ]
    print("submitting it would create:")
    print(_table(["KIND", "NAME"], rows))
    return EXIT_OK


def cmd_schema(client: Client, args: argparse.Namespace) -> int:
    _, schema = client.request("GET", "/v1/schema/run")
    print(json.dumps(schema, indent=2))
    return EXIT_OK


def cmd_rerun(client: Client, args: argparse.Namespace) -> int:
    ns = args.namespace or "default"
    body = {"name": args.name} if args.name else {}
    _, run = client.request(
        "POST", f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}/rerun", json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    if args.json:
        print(json.dumps(run, indent=2))
        return EXIT_OK
    for warning in run.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"run {run['name']} submitted to queue {run['queue']} in namespace {run['namespace']}"
          f" (a rerun of {args.run}): {run['phase']}")  # fmt: skip
    print(f"follow it with: tau status {run['name']}  |  tau logs -f {run['name']}")
    return EXIT_OK


# ---------------------------------------------------------------- main
def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=os.environ.get("TAU_URL", ""), help="controller URL (TAU_URL)"
    )
    common.add_argument(
        "--token", default=os.environ.get("TAU_TOKEN", ""), help="bearer token (TAU_TOKEN)"
    )
    common.add_argument(
        "--token-file",
        default=os.environ.get("TAU_TOKEN_FILE", ""),
        help="file holding the bearer token, when --token is not given (TAU_TOKEN_FILE)",
    )
    common.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("TAU_NAMESPACE") or None,
        help="namespace (TAU_NAMESPACE)",
    )
    common.add_argument(
        "--ca-file",
        default=os.environ.get("TAU_CA_FILE", ""),
        help="PEM CA bundle to trust for the controller (TAU_CA_FILE)",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON")
    p = argparse.ArgumentParser(
        prog="tau",
        description="Submit and follow TauGrid runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Exit codes", 1)[1].join(["Exit codes", ""]),
    )
    sub = p.add_subparsers(dest="verb", required=True)

    run = sub.add_parser("run", parents=[common], help="submit a run")
    run.add_argument("file", nargs="?", help="tau.yaml (or .json)")
    run.add_argument("--gpus", type=int, default=0, help="GPUs per worker")
    run.add_argument("--image", help="container image (best pinned by digest)")
    run.add_argument("--name", help="run name (default: run-<random>)")
    run.add_argument("--queue", help="queue (default: default)")
    run.add_argument("--workers", type=int, default=1, help="pods (default 1)")
    run.add_argument("--kind", choices=["job", "pytorch", "ray"], default="job")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- command and arguments")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", parents=[common], help="check a tau.yaml, create nothing")
    validate.add_argument("file", help="tau.yaml (or .json)")
    validate.set_defaults(func=cmd_validate)

    schema = sub.add_parser("schema", parents=[common], help="the JSON Schema of tau.yaml")
    schema.set_defaults(func=cmd_schema)

    status = sub.add_parser("status", parents=[common], help="a run in detail, or all runs")
    status.add_argument("run", nargs="?")
    status.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run ends; exit 0 if it succeeded, 1 if not",
    )
    status.set_defaults(func=cmd_status)

    lst = sub.add_parser("list", parents=[common], help="runs as a table")
    lst.add_argument("--phase")
    lst.add_argument("--queue")
    lst.add_argument("-A", "--all-namespaces", action="store_true")
    lst.set_defaults(func=cmd_list)

    logs = sub.add_parser("logs", parents=[common], help="a worker's log")
    logs.add_argument("run")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--attempt", type=int)
    logs.add_argument("--worker", type=int, default=0)
    logs.add_argument("--tail", type=int)
    logs.add_argument("--kept", action="store_true", help="the kept tail, even if the pod lives")
    logs.set_defaults(func=cmd_logs)

    cancel = sub.add_parser("cancel", parents=[common], help="stop a run, free its GPUs")
    cancel.add_argument("run")
    cancel.set_defaults(func=cmd_cancel)

    queues = sub.add_parser("queues", parents=[common], help="quota, usage, who waits")
    queues.set_defaults(func=cmd_queues)

    ev = sub.add_parser("evidence", parents=[common], help="what ran where")
    ev.add_argument("run")
    ev.set_defaults(func=cmd_evidence)

    resume = sub.add_parser("resume", parents=[common], help="start a failed run again")
    resume.add_argument("run")
    resume.add_argument("--checkpoint", help="start from this path (default: the latest)")
    resume.set_defaults(func=cmd_resume)

    rerun = sub.add_parser("rerun", parents=[common], help="a new run from a run's evidence")
    rerun.add_argument("run")
    rerun.add_argument("--name", help="the new run's name (default: RUN-r<N>)")
    rerun.set_defaults(func=cmd_rerun)

    ckpt = sub.add_parser(
        "checkpoint", parents=[common], help="report (or read) a checkpoint, inside a run"
    )
    ckpt.add_argument("action", nargs="?", help="`latest` to read the newest checkpoint")
    ckpt.add_argument("--step", type=int, help="training step of the checkpoint")
    ckpt.add_argument("--path", help="where it was saved")
    ckpt.add_argument("--attempt", type=int, help="attempt that saved it (TAU_ATTEMPT)")
    ckpt.add_argument("--run", help="the run (TAU_RUN)")
    ckpt.add_argument("--path-only", action="store_true", help="print the path alone")
    ckpt.set_defaults(func=cmd_checkpoint)

    result = sub.add_parser("result", parents=[common], help="report results, inside a run")
    result.add_argument("--metric", action="append", help="NAME=NUMBER (repeat for more)")
    result.add_argument("--step", type=int, help="the training step the metrics are at")
    result.add_argument("--artifact", action="append", help="URI of something the run made")
    result.add_argument("--size", type=int, help="the artifact's size in bytes")
    result.add_argument("--digest", help="the artifact's digest, sha256:<hex>")
    result.add_argument("--summary", help="a few lines for people (replaces the last one)")
    result.add_argument("--attempt", type=int, help="attempt reporting (TAU_ATTEMPT)")
    result.add_argument("--run", help="the run (TAU_RUN)")
    result.set_defaults(func=cmd_result)

    res = sub.add_parser("results", parents=[common], help="a run's results, or runs compared")
    res.add_argument("runs", nargs="*", metavar="RUN")
    res.add_argument("--metric", help="one metric: its series (several runs: its final value)")
    res.add_argument("--experiment", help="compare the runs of this experiment")
    res.set_defaults(func=cmd_results)

    exps = sub.add_parser("experiments", parents=[common], help="your experiments")
    exps.set_defaults(func=cmd_experiments)
    return p


def token_of(args: argparse.Namespace) -> str:
    """The token: --token / TAU_TOKEN, else the contents of --token-file / TAU_TOKEN_FILE
    (a run pod's projected token, which the kubelet rotates: read at each start)."""
    if args.token or not args.token_file:
        return str(args.token)
    try:
        with pathlib.Path(args.token_file).open(encoding="utf-8") as f:
            return f.read(64 * 1024).strip()
    except OSError as err:
        msg = f"cannot read the token file {args.token_file}: {err.strerror or err}"
        raise TauError(msg, EXIT_USAGE) from err


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "run":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if args.image and args.file:  # `tau run --image I -- cmd`: the file slot took `cmd`
            args.command = [args.file, *args.command]
            args.file = None
    try:
        client = Client(args.url, token_of(args), ca_file=args.ca_file)
        return int(args.func(client, args))
    except TauError as err:
        print(f"tau: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
