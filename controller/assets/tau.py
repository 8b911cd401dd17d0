#!/usr/bin/env python3
"""tau: submit and follow TauGrid runs. One file, Python 3.8+, standard library only.

    tau login --url URL [--ca-file ca.crt] --token -   keep URL, CA and token (token on stdin)
    tau run tau.yaml [-n NS] [--name N] [--generate-name]   submit a run described by a tau.yaml
    tau run --gpus 4 --image IMG -- python t.py   submit without a file
    tau validate tau.yaml                         check it as a submission would, create nothing
    tau schema                                    the JSON Schema of tau.yaml
    tau status [RUN] [--wait]                     one run in detail, or all your runs
    tau list [--phase P] [--queue Q] [-A]         runs as a table
    tau logs [-f] RUN [--all-workers] [--since 10m] [--attempt N] [--worker K]
                                                  a run's log (-f: follow, across attempts)
    tau cancel RUN                                stop a run and free its GPUs
    tau queues                                    your queues: quota, usage, who waits
    tau evidence RUN                              what ran where, to reproduce it
    tau resume RUN [--checkpoint P]               start a failed or cancelled run again
    tau rerun RUN [--name NEW]                    a new run from RUN's evidence (image by digest)
    tau checkpoint --step N --path P              (inside a run) report a saved checkpoint
    tau checkpoint latest [--path-only]           (inside a run) the newest checkpoint
    tau result --metric loss=0.12 --step 900      (inside a run) report metrics at a step
    tau result --artifact s3://b/m.pt [--size N --digest sha256:D] [--summary TEXT]
    tau results RUN [--metric loss] [--download DIR]   a run's metrics, artifacts and summary
    tau results RUN1 RUN2 | --experiment NAME     runs' final metrics side by side
    tau experiments                               your experiments and their runs
    tau fleet | nodes | node NAME [--agent]       (on-call) the breaker, the nodes, one node
    tau quarantine|release NAME --reason R        (on-call) fence a node by hand, or free it
    tau diag NAME [--level N]                     (on-call) start a DCGM diagnostic on its agent
    tau release-latch NAME [--gpu G] [--code C] [--force]   (on-call) free the agent's latch
    tau breaker-reset --reason R | dry-run on|off (on-call) close the breaker; switch dry run

Settings: tau reads each from a flag, else the environment, else the config file that
`tau login` writes ($XDG_CONFIG_HOME/tau/config, else ~/.config/tau/config; mode 0600):
    --url URL        TAU_URL         the controller, as your platform team gave it (https://...)
    --token T        TAU_TOKEN       any token your Kubernetes API server accepts (OIDC, or
                                     `kubectl create token SA --duration=8h`: 1 h by default)
    --token-file F   TAU_TOKEN_FILE  a file holding the token, read at each start
    --ca-file F      TAU_CA_FILE     the CA (PEM) that issued the controller's certificate,
                                     trusted besides the system store (URL/ca.crt, or ask)
    -n NS            TAU_NAMESPACE   the namespace: -n, else a given tau.yaml's namespace,
                                     else TAU_NAMESPACE, else the config file, else default
The config file's token is sent only to the config file's URL. tau never sends a token to
another origin (it does not follow such a redirect) and warns before plain http:// to
anything but this machine. Inside a run's pods TAU_URL, TAU_TOKEN_FILE (the pod's own token,
good only for its run and attempt), TAU_NAMESPACE, TAU_RUN and TAU_ATTEMPT are set, so
`tau checkpoint` and `tau result` need only what they report.

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
import configparser
import datetime
import getpass
import hashlib
import ipaddress
import json
import os
import pathlib
import re
import secrets
import ssl
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

__version__ = "0.1.0"
"""The client's version: the project's (pyproject.toml), which a test keeps equal."""

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INVALID = 0, 1, 2, 3
EXIT_FORBIDDEN, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_UNAVAILABLE = 4, 5, 6, 7
TERMINAL = ("Succeeded", "Failed", "Cancelled")


class TauError(Exception):
    """An answer that ends the command: message for people, code for scripts."""

    def __init__(self, message: str, code: int, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        """The controller's HTTP status, when it answered (0 when not)."""


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


def unauthorised_hint(sent_token: bool) -> str:
    """What to do about a 401: give a token, or get a fresh one."""
    first = (
        "the controller refused your token: it has expired or was not issued for this cluster."
        if sent_token
        else "no token was sent."
    )
    return (
        f"{first} Get a new one (from your platform team's sign-in, or `kubectl create token SA"
        " --duration=8h`: without --duration it lasts 1 hour) and keep it with"
        " `tau login --url URL --token -`, or set TAU_TOKEN."
    )


FORBIDDEN_HINT = (
    "\nThe controller knows your token, but Kubernetes RBAC does not allow this call for it:"
    " ask your platform team for the role (researchers and on-call have different ones)."
)


def unreachable_message(url: str, reason: Any) -> str:
    """`cannot reach URL: why`, and what to do about it: trust the controller's CA, use the
    name its certificate carries, or check the address."""
    text = str(reason)
    if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        if "mismatch" in text or "doesn't match" in text:
            advice = (
                "the controller's certificate is not for this host name: use the name it was"
                " issued for (your platform team's URL; through a port-forward, map that name"
                " to 127.0.0.1 in /etc/hosts)"
            )
        else:
            advice = (
                "tau does not trust the controller's certificate: pass --ca-file ca.crt or set"
                " TAU_CA_FILE (or keep it with `tau login --ca-file`). Get ca.crt from your"
                f" platform team, or from {url}/ca.crt and check its fingerprint with them"
            )
        return f"cannot reach {url}: {text}\n{advice}"
    return (
        f"cannot reach {url}: {text}\nCheck the address (TAU_URL, --url or `tau login`) and"
        " that the controller runs; from outside the cluster use the URL your platform team"
        " gave you, or `kubectl -n <taugrid namespace> port-forward svc/taugrid-controller"
        " 8080`"
    )


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
            error = self._error(err.code, err.read())
            hint = {401: f"\n{unauthorised_hint(bool(self.token))}", 403: FORBIDDEN_HINT}.get(
                err.code, ""
            )
            raise TauError(f"{error}{hint}", error.code, err.code) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise TauError(unreachable_message(self.url, reason), EXIT_UNAVAILABLE) from None
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


_DECLARED_NAMESPACE_RE = re.compile(
    rb"(?:^|[{,])[ \t]*[\"']?namespace[\"']?[ \t]*:[ \t]*[\"']?"
    rb"([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)[\"']?[ \t]*(?=[,}#\r\n]|\Z)",
    re.MULTILINE,
)
"""A `namespace: NAME` line or JSON member, as the controller scans a body for it
(shared/spec.py `_DECLARED_NAMESPACE_RE`): the spec's namespace, found without a YAML parser."""


def declared_namespace(body: bytes) -> str | None:
    """The namespace a tau.yaml declares at its top level, None when it declares none."""
    found = _DECLARED_NAMESPACE_RE.search(body)
    return found.group(1).decode("ascii") if found else None


def resolve_namespace(
    flag: str | None, spec: str | None, env: str | None, config: str | None
) -> tuple[str, str]:
    """The namespace a command acts in, and where it came from: `-n`, else the spec's (when a
    file is given), else TAU_NAMESPACE, else the config file, else `default`. Every verb uses
    this one order, so the namespace `tau run` submitted to is the one `tau status` reads."""
    for value, source in ((flag, "-n"), (spec, "spec"), (env, "TAU_NAMESPACE"),
                          (config, "config")):  # fmt: skip
        if value:
            return value, source
    return "default", "default"


MAX_NAME_LENGTH = 40
"""A run name's limit (shared/spec.py MAX_NAME_LENGTH), so a generated name still fits."""

RUN_OVERRIDES = ("name", "queue", "gpus", "workers", "kind", "priority")
"""`tau run` flags that, given with a tau.yaml, replace the file's value."""


def generated_name(base: str, suffix: str) -> str:
    """`base-suffix`, `base` cut so the whole stays a valid run name (at most 40)."""
    room = MAX_NAME_LENGTH - len(suffix) - 1
    return f"{base[:room].rstrip('-')}-{suffix}"


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The tau.yaml fields the flags given replace (only those given)."""
    return {k: getattr(args, k) for k in RUN_OVERRIDES if getattr(args, k, None) is not None}


def apply_overrides(spec: dict[str, Any], overrides: dict[str, Any], suffix: str) -> dict[str, Any]:
    """The spec (tau.yaml fields, as JSON) with the flags' values in place of the file's, and
    a generated name when `suffix` is set: a new dict, the given one untouched."""
    out = dict(spec)
    for key, value in overrides.items():
        if key == "gpus":
            out["resources"] = {**(out.get("resources") or {}), "gpus": value}
        else:
            out[key] = value
    if suffix:
        out["name"] = generated_name(str(out.get("name") or "run"), suffix)
    return out


def inline_spec(args: argparse.Namespace, suffix: str) -> dict[str, Any]:
    """The spec of `tau run --image IMG -- command ...` (no file)."""
    spec: dict[str, Any] = {
        "name": args.name or "run",
        "image": args.image,
        "command": args.command,
        "resources": {"gpus": args.gpus or 0},
        "workers": args.workers or 1,
        "kind": args.kind or "job",
    }
    for key in ("queue", "priority"):
        if getattr(args, key, None):
            spec[key] = getattr(args, key)
    return apply_overrides(spec, {}, suffix)


def check_run_grammar(args: argparse.Namespace) -> None:
    """Refuse a `tau run` line that says two things at once, or half of one, naming the part
    that is missing (the forgotten `--image`, the command after `--`)."""
    if args.file and args.image:
        raise TauError(
            f"give either a tau.yaml ({args.file}) or --image with a command, not both; to change"
            " the file's image, edit it", EXIT_USAGE,
        )  # fmt: skip
    if args.file and args.command:
        raise TauError(
            f"{args.file} holds the run's command; a command after `--` goes with --image"
            f" instead of a file (got: {' '.join(args.command)})", EXIT_USAGE,
        )  # fmt: skip
    if args.file and args.rest:
        raise TauError(
            f"tau run takes one tau.yaml, got more: {' '.join(args.rest)}. To run a command"
            " without a file: tau run --image IMAGE -- python train.py", EXIT_USAGE,
        )  # fmt: skip
    if not args.file and args.command and not args.image:
        raise TauError(
            f"which image runs `{' '.join(args.command)}`? add --image IMAGE"
            " (or put image and command in a tau.yaml)", EXIT_USAGE,
        )  # fmt: skip
    if args.image and not args.command:
        raise TauError(
            "--image needs a command after `--`: tau run --image IMAGE -- python train.py",
            EXIT_USAGE,
        )
    if not args.file and not args.image:
        raise TauError("give a tau.yaml, or --image IMAGE -- command ...", EXIT_USAGE)


def _spec_as_json(client: Client, body: bytes, content_type: str,
                  query: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A tau.yaml as JSON, to change fields of it: a JSON file is read here; YAML (which the
    standard library cannot read) is read by the controller's dry run, whose TauRun carries
    the validated spec in tau.yaml's own field names."""
    if content_type == "application/json":
        try:
            spec = json.loads(body)
        except ValueError as err:
            raise TauError(f"the file is not JSON: {err}", EXIT_INVALID) from None
        if not isinstance(spec, dict):
            raise TauError("the file must hold a mapping of tau.yaml fields", EXIT_INVALID)
        return spec
    if not _supports_dry_run(client):
        raise TauError(
            "this controller cannot read the file for tau to change it (no dryRun on"
            " POST /v1/runs): edit the file instead of passing --name/--queue/--gpus/..."
            , EXIT_UNAVAILABLE,
        )  # fmt: skip
    _, answer = client.request("POST", "/v1/runs", body, headers={"Content-Type": content_type},
                               query={**query, "dryRun": "true"})  # fmt: skip
    spec = (answer.get("run") or {}).get("spec")
    if not answer.get("dryRun") or not isinstance(spec, dict):
        raise TauError("the controller did not answer as a dry run", EXIT_UNAVAILABLE)
    return dict(spec)


def _name_suffix(args: argparse.Namespace) -> str:
    return secrets.token_hex(3)[:5] if args.generate_name else ""


SUBMIT_RETRIES = 5
"""`tau run` tries again this many times, a second apart, when the controller is busy (429:
it parses a caller's submissions a few at a time) or could not be reached."""


def cmd_run(client: Client, args: argparse.Namespace) -> int:
    query = _namespace_query(args)
    suffix = _name_suffix(args)
    if args.file:
        body, content_type = _spec_body(args.file)
        overrides = overrides_of(args)
        if overrides or suffix:
            spec = _spec_as_json(client, body, content_type, query)
            body = json.dumps(apply_overrides(spec, overrides, suffix)).encode()
            content_type = "application/json"
    else:
        generated = suffix or ("" if args.name else secrets.token_hex(3)[:5])
        body = json.dumps(inline_spec(args, generated)).encode()
        content_type = "application/json"
    headers = {"Content-Type": content_type, "Idempotency-Key": secrets.token_hex(16)}
    try:
        for tries_left in range(SUBMIT_RETRIES, -1, -1):
            # The same Idempotency-Key makes a retry safe: a run created by a call whose
            # answer was lost is found, not made twice.
            try:
                _, run = client.request("POST", "/v1/runs", body, headers=headers, query=query)
                break
            except TauError as err:
                busy = err.status == 429 or (
                    err.code == EXIT_UNAVAILABLE and "cannot reach" in str(err)
                )
                if not busy or not tries_left:
                    raise
                time.sleep(1.0)
    except TauError as err:
        if err.status != 409:
            raise
        again = f"tau run {args.file} --generate-name" if args.file else "tau run --name NEW ..."
        raise TauError(f"{err}\nto submit it again under a new name: {again} (or --name NEW)",
                       err.code, err.status) from None  # fmt: skip
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
    print(follow_up(run["name"], run["namespace"]))
    return EXIT_OK


def follow_up(name: str, namespace: str) -> str:
    """The commands that follow a submitted run, with its namespace, so they find it."""
    return f"follow it with: tau status {name} -n {namespace}  |  tau logs -f {name} -n {namespace}"


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


_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def duration(text: str) -> int:
    """Seconds in a duration: 90s, 10m, 2h, 1h30m, 1d (a bare number is seconds)."""
    text = text.strip()
    if text.isdigit():
        seconds = int(text)
    else:
        found = _DURATION_RE.fullmatch(text)
        if not text or found is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration: try 30s, 10m, 2h, 1h30m")
        d, h, m, s = (int(g or 0) for g in found.groups())
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds < 1:
        raise argparse.ArgumentTypeError("a duration of at least 1s")
    return seconds


def worker_count(run: dict[str, Any]) -> int:
    """How many workers a run has, numbered as `logs?worker=` counts them (ray: the head is
    worker 0, then its `workers`)."""
    spec = run.get("spec") or {}
    workers = spec.get("workers")
    count = workers if isinstance(workers, int) and workers > 0 else 1
    return count + (1 if (run.get("kind") or spec.get("kind")) == "ray" else 0)


def after_attempt(run: dict[str, Any], followed: int) -> tuple[str, int]:
    """What `logs -f` does once attempt `followed` has no more to say: ("next", N) when the
    run has moved on to a newer attempt (it follows N = followed + 1, so an attempt that came
    and went between two looks still shows), ("done", 0) when the run ended with no newer
    attempt, ("wait", 0) while it is between attempts or about to say it ended."""
    current = int(run.get("attempt") or 0)
    if current > followed:
        return "next", followed + 1
    if run.get("phase") in TERMINAL:
        return "done", 0
    return "wait", 0


FOLLOW_POLL_S = 2.0
"""How often `logs -f` asks whether the run has a next attempt, between two."""


def _kept_notice(resp: Any, prefix: str, since: int | None) -> None:
    if resp.headers.get("X-TauGrid-Log-Source") != "kept":
        return
    how = "complete" if resp.headers.get("X-TauGrid-Log-Complete") == "true" else "partial"
    truncated = resp.headers.get("X-TauGrid-Log-Truncated") == "true"
    older = ", older output dropped" if truncated else ""
    whole = "; --since does not apply to it" if since else ""
    print(
        f"tau: {prefix}pod {resp.headers.get('X-TauGrid-Pod') or '?'} is gone; this is the kept"
        f" tail of its log ({how}{older}, captured at"
        f" {resp.headers.get('X-TauGrid-Log-Captured-At') or '?'}{whole})",
        file=sys.stderr,
    )


class _Out:
    """stdout shared by the workers' streams: whole lines, each under one lock, prefixed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffer = getattr(sys.stdout, "buffer", None)

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.buffer is not None:
                self.buffer.write(data)
                self.buffer.flush()
            else:
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()


def prefixed(chunks: Iterable[bytes], prefix: bytes) -> Iterator[bytes]:
    """The stream cut into whole lines, each prefixed (a last line without a newline gets
    one), so two workers' output never mixes inside a line."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines:
            yield b"".join(prefix + line + b"\n" for line in lines)
    if pending:
        yield prefix + pending + b"\n"


def _chunks(resp: Any) -> Iterator[bytes]:
    with resp:
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(4096)
            if not chunk:
                return
            yield chunk


def _print_worker(client: Client, args: argparse.Namespace, attempt: int | None, worker: int,
                  *, out: _Out, prefix: str) -> None:  # fmt: skip
    ns = args.namespace or "default"
    query = {
        "follow": "true" if args.follow else None,
        "attempt": attempt,
        "worker": worker,
        "tail": args.tail,
        "sinceSeconds": args.since,
        "kept": "true" if args.kept else None,
    }
    resp = client.request(
        "GET", f"/v1/runs/{ns}/{urllib.parse.quote(args.run)}/logs", query=query, stream=True
    )
    _kept_notice(resp, prefix, args.since)
    chunks = _chunks(resp)
    for data in prefixed(chunks, prefix.encode()) if prefix else chunks:
        out.write(data)


def _print_attempt(client: Client, args: argparse.Namespace, attempt: int | None,
                   workers: list[int]) -> None:  # fmt: skip
    """Every chosen worker's log of one attempt: one at a time, or side by side (threads)
    while following, each line prefixed `[wK]` when there is more than one."""
    out = _Out()
    if len(workers) == 1:
        _print_worker(client, args, attempt, workers[0], out=out, prefix="")
        return
    failures: list[str] = []

    def one(worker: int) -> None:
        try:
            _print_worker(client, args, attempt, worker, out=out, prefix=f"[w{worker}] ")
        except TauError as err:
            failures.append(f"worker {worker}: {err}")

    if not args.follow:
        for worker in workers:
            one(worker)
    else:
        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for failure in failures:
        print(f"tau: {failure}", file=sys.stderr)


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.all_workers and args.worker:
        raise TauError("give --worker K or --all-workers, not both", EXIT_USAGE)
    run: dict[str, Any] = {}
    if args.all_workers or (args.follow and args.attempt is None):
        run = _get_run(client, args, args.run)
    workers = list(range(worker_count(run))) if args.all_workers else [args.worker]
    if not args.follow or args.attempt is not None:
        _print_attempt(client, args, args.attempt, workers)
        return EXIT_OK
    attempt = int(run.get("attempt") or 0)
    what = "next" if attempt else "wait"
    while True:
        if what == "next" and attempt:
            _print_attempt(client, args, attempt, workers)
        run = _get_run(client, args, args.run)
        what, number = after_attempt(run, attempt)
        if what == "done":
            return EXIT_OK
        if what == "next":
            if attempt:
                print(f"tau: run {args.run} goes on with attempt {number}", file=sys.stderr)
            attempt = number
            continue
        time.sleep(FOLLOW_POLL_S)


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


OBJECT_STORE_TOOLS = {
    "s3": "aws s3 cp {uri} {dir}/",
    "gs": "gcloud storage cp {uri} {dir}/",
    "az": "azcopy copy '{uri}' {dir}/",
    "hf": "huggingface-cli download (the repository in {uri})",
}
"""How to fetch an artifact tau does not download itself, by URI scheme."""


def artifact_plan(artifacts: list[dict[str, Any]], directory: str) -> list[tuple[str, str, str]]:
    """For each artifact: (uri, the file to save it as, "") when tau fetches it (http and
    https), else (uri, "", a hint saying how to fetch it). File names are the URI's last path
    segment, never a path of their own (no `..`, no `/`), made unique within the directory."""
    plan: list[tuple[str, str, str]] = []
    taken: set[str] = set()
    for number, artifact in enumerate(artifacts, 1):
        uri = str(artifact.get("uri") or "")
        parts = urllib.parse.urlsplit(uri)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            tool = OBJECT_STORE_TOOLS.get(scheme)
            if tool:
                hint = "fetch it with " + tool.format(uri=uri, dir=directory)
            elif not scheme or scheme == "file":
                hint = ("a path inside the run's volume: read it from a run that mounts the same"
                        " volume, or have the run upload it and report that URI")  # fmt: skip
            else:
                hint = f"tau fetches http(s) only: use the tool of the {scheme}:// store"
            plan.append((uri, "", hint))
            continue
        leaf = urllib.parse.unquote(parts.path).rsplit("/", 1)[-1]
        leaf = "".join(c for c in leaf if c not in "/\\\0:").strip(". ") or f"artifact-{number}"
        name, n = leaf, 1
        while name in taken:
            n += 1
            stem, dot, ext = leaf.partition(".")
            name = f"{stem}-{n}{dot}{ext}"
        taken.add(name)
        plan.append((uri, str(pathlib.Path(directory) / name), ""))
    return plan


def _download(uri: str, dest: str, digest: str, context: ssl.SSLContext | None) -> int:
    """Fetch `uri` into `dest` (via `dest.part`, renamed when whole and its digest matches).
    No tau token goes with it: an artifact URI is whatever the run reported."""
    handlers: list[urllib.request.BaseHandler] = []
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    part = pathlib.Path(dest + ".part")
    hasher = hashlib.sha256()
    size = 0
    try:
        with opener.open(uri, timeout=60) as resp, part.open("wb") as f:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                hasher.update(chunk)
                f.write(chunk)
                size += len(chunk)
    except (urllib.error.URLError, OSError) as err:
        part.unlink(missing_ok=True) if sys.version_info >= (3, 8) else None
        raise TauError(f"cannot fetch {uri}: {getattr(err, 'reason', err)}",
                       EXIT_UNAVAILABLE) from None  # fmt: skip
    if digest.startswith("sha256:") and digest[7:].lower() != hasher.hexdigest():
        part.unlink()
        raise TauError(f"{uri}: its sha256 is {hasher.hexdigest()}, not the reported {digest[7:]};"
                       " nothing kept", EXIT_UNAVAILABLE)  # fmt: skip
    part.replace(dest)
    return size


def download_artifacts(body: dict[str, Any], directory: str,
                       context: ssl.SSLContext | None) -> int:  # fmt: skip
    """Fetch the run's http(s) artifacts into `directory`; say how to fetch the rest."""
    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    artifacts = body.get("artifacts") or []
    if not artifacts:
        print(f"run {body.get('name')} reported no artifacts (tau result --artifact URI)")
        return EXIT_OK
    digests = {a.get("uri"): str(a.get("digest") or "") for a in artifacts}
    for uri, dest, hint in artifact_plan(artifacts, directory):
        if hint:
            print(f"{uri}: not fetched; {hint}", file=sys.stderr)
            continue
        size = _download(uri, dest, digests.get(uri, ""), context)
        print(f"{uri} -> {dest} ({size} bytes)")
    return EXIT_OK


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
    if args.download:
        return download_artifacts(body, args.download, client.context)
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
        hint = ""
        if not path.endswith((".yaml", ".yml", ".json")):
            hint = f"; to run a command without a file: tau run --image IMAGE -- {path} ..."
        raise TauError(f"cannot read {path}: {err.strerror}{hint}", EXIT_USAGE) from None
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
    print(follow_up(run["name"], run["namespace"]))
    return EXIT_OK


# ---------------------------------------------------------------- on-call
def _node_path(name: str) -> str:
    return f"/v1/nodes/{urllib.parse.quote(name)}"


def _print_nodes(items: list[dict[str, Any]]) -> None:
    rows = []
    for n in items:
        q = n.get("quarantine") or {}
        fence = f"{q.get('mode')} by {q.get('by')}" if q else ""
        if n.get("fencedGpus"):
            fence = (fence + ", " if fence else "") + f"{n['fencedGpus']} GPUs fenced"
        rows.append([n["name"], n.get("state"), n.get("reason"), fence or "-",
                     n.get("gpuCapacity"), "yes" if n.get("unschedulable") else "no",
                     _age(_second(n.get("lastHeartbeat"))), n.get("message") or ""])  # fmt: skip
    print(_table(["NODE", "STATE", "REASON", "QUARANTINE", "GPUS", "CORDONED", "REPORTED",
                  "MESSAGE"], rows) if rows else "no GPU nodes")  # fmt: skip


def _second(stamp: Any) -> str | None:
    """An RFC 3339 time cut to whole seconds (UTC), as `_age` reads it."""
    if not isinstance(stamp, str) or len(stamp) < 19:
        return None
    return stamp[:19] + "Z"


def cmd_nodes(client: Client, args: argparse.Namespace) -> int:
    _, body = client.request("GET", "/v1/nodes", query={"state": args.state})
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        _print_nodes(body.get("items") or [])
    return EXIT_OK


def _print_node(node: dict[str, Any]) -> None:
    q = node.get("quarantine") or {}
    pairs = [
        ("Node", node["name"]),
        ("State", f"{node.get('state')}" + (f" ({node['reason']})" if node.get("reason") else "")),
        ("Message", node.get("message")),
        ("Reported", node.get("lastHeartbeat")),
        ("Boot ID", node.get("bootId")),
        ("Cordoned", "yes" + (" (by TauGrid)" if node.get("cordonedByUs") else "")
         if node.get("unschedulable") else "no"),
        ("Quarantine", f"{q.get('mode')} by {q.get('by')} at {q.get('at')}: {q.get('reason')};"
         f" cleared by {q.get('clearsWith')}" if q else "none"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in pairs) + 1
    for key, value in pairs:
        print(f"{key + ':':<{width}} {value if value not in (None, '') else '-'}")
    gpus = node.get("gpus") or []
    if gpus:
        print()
        rows = [[g.get("index"), g.get("uuid"), g.get("verdict"), g.get("action"),
                 "; ".join(f"{r.get('code')}" + (" (latched)" if r.get("latched") else "")
                           for r in g.get("reasons") or [])]
                for g in gpus]  # fmt: skip
        print(_table(["GPU", "UUID", "VERDICT", "ACTION", "REASONS"], rows))
    for device in node.get("devices") or []:
        print(f"fenced {device.get('device')}: {device.get('reason')}; clears with"
              f" {device.get('clears')}")  # fmt: skip
    history = node.get("history") or []
    if history:
        print()
        print(_table(["TIME", "ACTION", "BY", "REASON"],
                     [[h.get("at"), h.get("action"), h.get("by"), h.get("reason")]
                      for h in history[-10:]]))  # fmt: skip


def _serves(client: Client, path: str) -> bool:
    """Whether the controller's OpenAPI document lists `path` (an older one may not)."""
    _, doc = client.request("GET", "/openapi.json")
    return path in (doc.get("paths") or {})


def _needs(client: Client, path: str, what: str) -> None:
    """Refuse, saying so, a call the controller does not offer (an older one)."""
    if not _serves(client, path):
        msg = f"this controller does not {what} ({path.replace('{name}', 'NAME')}); upgrade it"
        raise TauError(msg, EXIT_UNAVAILABLE)


def cmd_node(client: Client, args: argparse.Namespace) -> int:
    _, node = client.request("GET", _node_path(args.name))
    agent: Any = None
    if args.agent:
        _needs(client, "/v1/nodes/{name}/gpus", "relay the agent's GPU view")
        _, agent = client.request("GET", _node_path(args.name) + "/gpus")
    if args.json:
        print(json.dumps({**node, "agent": agent} if args.agent else node, indent=2))
        return EXIT_OK
    _print_node(node)
    if agent is not None:
        print("\nThe agent's view:")
        print(json.dumps(agent, indent=2))
    return EXIT_OK


def cmd_quarantine(client: Client, args: argparse.Namespace) -> int:
    method = "DELETE" if args.verb == "release" else "POST"
    _, node = client.request(method, _node_path(args.name) + "/quarantine",
                             json.dumps({"reason": args.reason}).encode(),
                             headers={"Content-Type": "application/json"})  # fmt: skip
    if args.json:
        print(json.dumps(node, indent=2))
        return EXIT_OK
    q = node.get("quarantine") or {}
    now = f"quarantined ({q.get('mode')}, by {q.get('by')})" if q else "not quarantined"
    print(f"node {node['name']}: {now}; state {node.get('state')}")
    return EXIT_OK


def _print_fleet(fleet: dict[str, Any]) -> None:
    breaker = fleet.get("breaker") or {}
    state = "OPEN: " + (breaker.get("message") or "") if breaker.get("open") else "closed"
    devices = fleet.get("devices") or {}
    pairs = [
        ("Leader", fleet.get("leader")),
        ("Dry run", "on (decides and records, changes no node)" if fleet.get("dryRun") else "off"),
        ("Breaker", state),
        ("Nodes", fleet.get("nodes")),
        ("Quarantined", f"{fleet.get('quarantined')} of at most {fleet.get('maxQuarantined')}"),
        ("States", ", ".join(f"{v} {k}" for k, v in (fleet.get("states") or {}).items())),
        ("GPU mode", devices.get("gpuMode")),
    ]
    if breaker.get("resetBy"):
        pairs.append(("Last reset", f"{breaker.get('resetAt')} by {breaker['resetBy']}"))
    width = max(len(k) for k, _ in pairs) + 1
    for key, value in pairs:
        print(f"{key + ':':<{width}} {value if value not in (None, '') else '-'}")


def _fleet_answer(args: argparse.Namespace, fleet: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(fleet, indent=2))
    else:
        _print_fleet(fleet)
    return EXIT_OK


def cmd_fleet(client: Client, args: argparse.Namespace) -> int:
    return _fleet_answer(args, client.request("GET", "/v1/fleet")[1])


def cmd_diag(client: Client, args: argparse.Namespace) -> int:
    _needs(client, "/v1/nodes/{name}/diag", "start diagnostics on agents")
    _, answer = client.request("POST", _node_path(args.name) + "/diag",
                               query={"level": args.level})  # fmt: skip
    if args.json:
        print(json.dumps(answer, indent=2))
        return EXIT_OK
    print(f"node {args.name}: level {answer.get('level', args.level)} diagnostic started;"
          f" its result: tau node {args.name} --agent (lastDiagnostic)")  # fmt: skip
    return EXIT_OK


def cmd_release_latch(client: Client, args: argparse.Namespace) -> int:
    _needs(client, "/v1/nodes/{name}/agent/release", "release agents' latched faults")
    query = {"gpu": args.gpu, "code": args.code, "force": "true" if args.force else None}
    _, answer = client.request("POST", _node_path(args.name) + "/agent/release", query=query)
    if args.json:
        print(json.dumps(answer, indent=2))
        return EXIT_OK
    released = answer.get("released") or []
    for fault in released:
        print(f"released {fault.get('code')} on {fault.get('gpuUuid')}")
    print(f"node {args.name}: {len(released)} latched fault(s) released on its agent; now"
          f" `tau release {args.name} --reason R` if the node is still quarantined")  # fmt: skip
    return EXIT_OK


def cmd_breaker_reset(client: Client, args: argparse.Namespace) -> int:
    body = json.dumps({"reason": args.reason}).encode()
    _, fleet = client.request("POST", "/v1/fleet/breaker/reset", body,
                              headers={"Content-Type": "application/json"})  # fmt: skip
    return _fleet_answer(args, fleet)


def cmd_dry_run(client: Client, args: argparse.Namespace) -> int:
    body = json.dumps({"dryRun": args.switch == "on"}).encode()
    _, fleet = client.request("PUT", "/v1/fleet/mode", body,
                              headers={"Content-Type": "application/json"})  # fmt: skip
    return _fleet_answer(args, fleet)


# ---------------------------------------------------------------- settings
def config_path(env: Mapping[str, str]) -> pathlib.Path:
    """Where `tau login` keeps its settings: $XDG_CONFIG_HOME/tau/config, else
    ~/.config/tau/config (the XDG base directory default)."""
    base = env.get("XDG_CONFIG_HOME") or str(pathlib.Path.home() / ".config")
    return pathlib.Path(base) / "tau" / "config"


CONFIG_SECTION = "tau"
CONFIG_KEYS = ("url", "token", "ca-file", "namespace")


def read_config(path: pathlib.Path) -> dict[str, str]:
    """The config file's settings; none when there is no file. One that cannot be read or
    parsed is a usage error naming it (a silently ignored config would send you elsewhere)."""
    parser_ = configparser.ConfigParser(interpolation=None)
    try:
        with path.open(encoding="utf-8") as f:
            parser_.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, configparser.Error) as err:
        raise TauError(f"cannot read the config file {path}: {err}", EXIT_USAGE) from None
    if not parser_.has_section(CONFIG_SECTION):
        return {}
    return {k: v for k, v in parser_.items(CONFIG_SECTION) if k in CONFIG_KEYS and v}


def write_config(path: pathlib.Path, values: Mapping[str, str]) -> None:
    """Write the settings readable by you alone (0600, in a 0700 directory), replacing the
    file in one step so a reader never sees half of it."""
    parser_ = configparser.ConfigParser(interpolation=None)
    parser_[CONFIG_SECTION] = {k: values[k] for k in CONFIG_KEYS if values.get(k)}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    fd = os.open(str(part), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if hasattr(os, "fchmod"):  # POSIX: an old file of wider mode is narrowed too
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("# written by `tau login`; holds your token: keep it to yourself\n")
            parser_.write(f)
    except BaseException:
        part.unlink()
        raise
    part.replace(path)


class Settings(NamedTuple):
    """Where and how to call the controller, each value from its flag, the environment or the
    config file (in that order)."""

    url: str
    token: str
    ca_file: str
    namespace: str
    namespace_from: str


def settings_of(
    args: argparse.Namespace, env: Mapping[str, str], config: Mapping[str, str],
    spec_namespace: str | None = None,
) -> Settings:  # fmt: skip
    """Resolve the settings. The config file's token and CA go only with the config file's
    URL: a TAU_URL or --url naming another origin never receives the token kept for it."""
    url = args.url or config.get("url", "")
    same = bool(url) and "url" in config and origin(url) == origin(config["url"])
    token = token_of(args) or (config.get("token", "") if same else "")
    ca_file = args.ca_file or (config.get("ca-file", "") if same else "")
    namespace, source = resolve_namespace(
        args.namespace, spec_namespace, env.get("TAU_NAMESPACE"), config.get("namespace")
    )
    return Settings(url, token, ca_file, namespace, source)


# ---------------------------------------------------------------- login
def _read_secret(args: argparse.Namespace) -> str:
    """The token to keep: `--token -` (or none given and stdin not a terminal) reads stdin,
    `--token-file F` reads F, a terminal is asked without echo."""
    if args.token or args.token_file:
        return token_of(args)
    if not sys.stdin.isatty():
        return sys.stdin.read(64 * 1024).strip()
    return getpass.getpass("token (input hidden): ").strip()


def cmd_login(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Check the controller answers, then keep URL, CA and token in the config file."""
    path = config_path(env)
    try:
        old = read_config(path)
    except TauError:  # login is how a broken config file is replaced
        old = {}
    url = args.url
    if not url:
        raise TauError("tau login --url URL (the controller's address, from your platform team)",
                       EXIT_USAGE)  # fmt: skip
    token = _read_secret(args)
    if not token:
        raise TauError("no token given: pass --token - and paste it, or --token-file F",
                       EXIT_USAGE)  # fmt: skip
    client = Client(url, token, ca_file=args.ca_file)  # refuses a file that is no CA bundle
    if not args.no_check:
        namespace = args.namespace or old.get("namespace") or "default"
        try:
            client.request("GET", "/v1/runs", query={"namespace": namespace})
        except TauError as err:
            if err.status != 403:  # a 403 is a token the controller knows, RBAC narrower
                raise TauError(f"{err}\nnothing was saved (--no-check saves anyway)",
                               err.code) from None  # fmt: skip
    ca_file = ""
    if args.ca_file:  # a copy beside the config, so the download may go
        ca_file = str(path.parent / "ca.crt")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if pathlib.Path(args.ca_file).resolve() != pathlib.Path(ca_file).resolve():
            pathlib.Path(ca_file).write_bytes(pathlib.Path(args.ca_file).read_bytes())
    values = {"url": client.url, "token": token, "ca-file": ca_file,
              "namespace": args.namespace or old.get("namespace", "")}  # fmt: skip
    write_config(path, values)
    where = f", namespace {values['namespace']}" if values["namespace"] else ""
    print(f"logged in to {client.url}{where}; settings kept in {path} (readable by you alone)")
    return EXIT_OK


# ---------------------------------------------------------------- main
GLOBAL_HELP = {
    "url": "the controller's URL (TAU_URL)",
    "token": "bearer token, or - to read it from stdin (TAU_TOKEN)",
    "token_file": "file holding the bearer token, when no token is given (TAU_TOKEN_FILE)",
    "namespace": "namespace (default: the spec's, else TAU_NAMESPACE, else the config, else"
    " default)",
    "ca_file": "PEM CA bundle to trust for the controller (TAU_CA_FILE)",
}


def _global_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every verb takes, accepted before the verb too (`tau --url U status`). The
    verb's copies default to nothing, so they never undo a value given before the verb."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    p.add_argument("--url", default=default(os.environ.get("TAU_URL", "")),
                   help=GLOBAL_HELP["url"])  # fmt: skip
    p.add_argument("--token", default=default(os.environ.get("TAU_TOKEN", "")),
                   help=GLOBAL_HELP["token"])  # fmt: skip
    p.add_argument("--token-file", default=default(os.environ.get("TAU_TOKEN_FILE", "")),
                   help=GLOBAL_HELP["token_file"])  # fmt: skip
    p.add_argument("-n", "--namespace", default=default(None), help=GLOBAL_HELP["namespace"])
    p.add_argument("--ca-file", default=default(os.environ.get("TAU_CA_FILE", "")),
                   help=GLOBAL_HELP["ca_file"])  # fmt: skip
    p.add_argument("--json", action="store_true", default=default(False),
                   help="print the API's JSON")  # fmt: skip


PHASES = ("Pending", "Queued", "Admitted", "Running", "Resuming", "Succeeded", "Failed",
          "Cancelled")  # fmt: skip
NODE_STATES = ("Healthy", "Degraded", "Failed", "Stale", "Unknown", "Missing")


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, top=False)
    p = argparse.ArgumentParser(
        prog="tau",
        description="Submit and follow TauGrid runs; look after the fleet (on-call).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n" + __doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--version", action="version", version=f"tau {__version__}")
    _global_options(p, top=True)
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        paragraphs = (description or summary).split("\n\n")  # prose wrapped, examples kept
        text = "\n\n".join(p if p.startswith("  ") else textwrap.fill(p, 79) for p in paragraphs)
        return sub.add_parser(
            name, parents=[common], help=summary, description=text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip

    login = verb(
        "login",
        "keep the controller's URL, CA and your token in the config file",
        "Check that the controller answers, then keep --url, --ca-file (copied beside the"
        " config) and the token in $XDG_CONFIG_HOME/tau/config (else ~/.config/tau/config),"
        " readable by you alone. Give the token as --token - (read from stdin; paste it, or"
        " pipe it: `kubectl create token SA --duration=8h | tau login --url URL --token -`)"
        " or --token-file F; on a terminal without either, tau asks for it. TAU_URL,"
        " TAU_TOKEN, TAU_CA_FILE and TAU_NAMESPACE still win over the file.",
    )
    login.add_argument("--no-check", action="store_true",
                       help="save without calling the controller")  # fmt: skip
    login.set_defaults(func=None)

    run = verb(
        "run",
        "submit a run",
        "Submit a run from a tau.yaml, or from --image and a command after `--`.\n\n"
        "  tau run tau.yaml -n team-a --json\n"
        "  tau run tau.yaml --gpus 8 --name lr-3     flags replace the file's values\n"
        "  tau run tau.yaml --generate-name          a new name each time: rerun as is\n"
        "  tau run --image IMG --gpus 1 -- python train.py --lr 0.1\n\n"
        "With a file, --name, --queue, --gpus, --workers, --kind and --priority replace the"
        " file's values (the file itself is not changed); -n replaces its namespace.",
    )
    run.add_argument("file", nargs="?", help="tau.yaml (or .json)")
    run.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    run.add_argument("--image", help="container image (best pinned by digest); no file then")
    run.add_argument("--gpus", type=int, help="GPUs per worker (default 0)")
    run.add_argument("--name", help="run name (default: the file's, else run-<random>)")
    run.add_argument("--generate-name", action="store_true",
                     help="add a random suffix to the name: rerun without editing")  # fmt: skip
    run.add_argument("--queue", help="queue (default: the file's, else default)")
    run.add_argument("--workers", type=int, help="pods (default 1)")
    run.add_argument("--kind", choices=["job", "pytorch", "ray"], help="default job")
    run.add_argument("--priority", help="a priority class your platform allows")
    run.set_defaults(func=cmd_run, command=[])

    validate = verb("validate", "check a tau.yaml, create nothing")
    validate.add_argument("file", help="tau.yaml (or .json)")
    validate.set_defaults(func=cmd_validate)

    schema = verb("schema", "the JSON Schema of tau.yaml")
    schema.set_defaults(func=cmd_schema)

    status = verb("status", "a run in detail, or all runs")
    status.add_argument("run", nargs="?")
    status.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run ends; exit 0 if it succeeded, 1 if not",
    )
    status.set_defaults(func=cmd_status)

    lst = verb("list", "runs as a table")
    lst.add_argument("--phase", choices=PHASES)
    lst.add_argument("--queue")
    lst.add_argument("-A", "--all-namespaces", action="store_true")
    lst.set_defaults(func=cmd_list)

    logs = verb(
        "logs",
        "a run's log, across workers and attempts",
        "Print a run's log: worker 0 of the current attempt, or --worker K, --all-workers"
        " (each line prefixed [wK]) and --attempt N. With -f it follows, and when the run"
        " resumes it goes on with the next attempt until the run ends. After a pod is gone"
        " the tail the controller kept is shown (marked so on stderr).",
    )
    logs.add_argument("run")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following")
    logs.add_argument("--attempt", type=int, help="which attempt (default: the current one)")
    logs.add_argument("--worker", type=int, default=0, help="which worker, from 0 (ray: the head)")
    logs.add_argument("--all-workers", action="store_true", help="every worker, lines prefixed")
    logs.add_argument("--since", type=duration, help="only lines newer than this: 30s, 10m, 2h")
    logs.add_argument("--tail", type=int, help="only the last N lines")
    logs.add_argument("--kept", action="store_true", help="the kept tail, even if the pod lives")
    logs.set_defaults(func=cmd_logs)

    cancel = verb("cancel", "stop a run, free its GPUs")
    cancel.add_argument("run")
    cancel.set_defaults(func=cmd_cancel)

    queues = verb("queues", "quota, usage, who waits")
    queues.set_defaults(func=cmd_queues)

    ev = verb("evidence", "what ran where")
    ev.add_argument("run")
    ev.set_defaults(func=cmd_evidence)

    resume = verb("resume", "start a failed run again")
    resume.add_argument("run")
    resume.add_argument("--checkpoint", help="start from this path (default: the latest)")
    resume.set_defaults(func=cmd_resume)

    rerun = verb("rerun", "a new run from a run's evidence")
    rerun.add_argument("run")
    rerun.add_argument("--name", help="the new run's name (default: RUN-r<N>)")
    rerun.set_defaults(func=cmd_rerun)

    ckpt = verb("checkpoint", "report (or read) a checkpoint, inside a run")
    ckpt.add_argument("action", nargs="?", help="`latest` to read the newest checkpoint")
    ckpt.add_argument("--step", type=int, help="training step of the checkpoint")
    ckpt.add_argument("--path", help="where it was saved")
    ckpt.add_argument("--attempt", type=int, help="attempt that saved it (TAU_ATTEMPT)")
    ckpt.add_argument("--run", help="the run (TAU_RUN)")
    ckpt.add_argument("--path-only", action="store_true", help="print the path alone")
    ckpt.set_defaults(func=cmd_checkpoint)

    result = verb("result", "report results, inside a run")
    result.add_argument("--metric", action="append", help="NAME=NUMBER (repeat for more)")
    result.add_argument("--step", type=int, help="the training step the metrics are at")
    result.add_argument("--artifact", action="append", help="URI of something the run made")
    result.add_argument("--size", type=int, help="the artifact's size in bytes")
    result.add_argument("--digest", help="the artifact's digest, sha256:<hex>")
    result.add_argument("--summary", help="a few lines for people (replaces the last one)")
    result.add_argument("--attempt", type=int, help="attempt reporting (TAU_ATTEMPT)")
    result.add_argument("--run", help="the run (TAU_RUN)")
    result.set_defaults(func=cmd_result)

    res = verb(
        "results",
        "a run's results, or runs compared",
        "A run's metrics, artifacts and summary; several runs (or --experiment) side by side."
        " --download DIR fetches the artifacts whose URIs are http(s) (without your tau token)"
        " and says how to fetch the others (s3://, gs://, a path on a volume).",
    )
    res.add_argument("runs", nargs="*", metavar="RUN")
    res.add_argument("--metric", help="one metric: its series (several runs: its final value)")
    res.add_argument("--experiment", help="compare the runs of this experiment")
    res.add_argument("--download", metavar="DIR", help="fetch the run's http(s) artifacts into DIR")
    res.set_defaults(func=cmd_results)

    exps = verb("experiments", "your experiments")
    exps.set_defaults(func=cmd_experiments)

    fleet_ = verb("fleet", "(on-call) the breaker, dry run and the fleet's counts")
    fleet_.set_defaults(func=cmd_fleet)
    nodes = verb("nodes", "(on-call) every GPU node: state, quarantine, last report")
    nodes.add_argument("--state", choices=NODE_STATES, help="only nodes in this state")
    nodes.set_defaults(func=cmd_nodes)
    node = verb(
        "node",
        "(on-call) one node: GPUs, quarantine, history",
        "One node as the controller sees it; --agent adds the agent's own view of its GPUs"
        " (latched faults, last diagnostics) through the controller, where it offers that.",
    )
    node.add_argument("name")
    node.add_argument("--agent", action="store_true", help="the agent's GPU view too")
    node.set_defaults(func=cmd_node)
    for name, summary in (("quarantine", "(on-call) quarantine a node by hand"),
                          ("release", "(on-call) release a node by hand")):  # fmt: skip
        q = verb(name, summary, summary + "; the reason is kept in the node's history.")
        q.add_argument("name")
        q.add_argument("--reason", required=True, help="why (kept in the node's history)")
        q.set_defaults(func=cmd_quarantine)
    diag = verb(
        "diag",
        "(on-call) start a DCGM diagnostic on a node's agent",
        "The controller asks the node's agent to start a diagnostic (level 1: seconds; 2 and"
        " 3, minutes, only on an idle or quarantined node); read its result with"
        " `tau node NAME --agent` (lastDiagnostic).",
    )
    diag.add_argument("name")
    diag.add_argument("--level", type=int, choices=[1, 2, 3], default=1, help="1, 2 or 3")
    diag.set_defaults(func=cmd_diag)
    latch = verb(
        "release-latch",
        "(on-call) release latched faults on a node's agent",
        "An Inspect fault (row remap failure, uncorrectable ECC...) stays latched on the agent,"
        " the node Failed, until a person releases it here; then `tau release NAME --reason R`."
        " --force releases faults that a reset or a reboot would clear too.",
    )
    latch.add_argument("name")
    latch.add_argument("--gpu", help="only this GPU (index or UUID)")
    latch.add_argument("--code", help="only faults of this code (RowRemapFailure)")
    latch.add_argument("--force", action="store_true", help="faults other than Inspect too")
    latch.set_defaults(func=cmd_release_latch)
    breaker = verb(
        "breaker-reset",
        "(on-call) close the quarantine circuit breaker",
        "Close the breaker after you have checked why it opened (`tau fleet` shows it); the"
        " controller records who reset it and why (in the breaker's Event).",
    )
    breaker.add_argument("--reason", required=True, help="why it may close now (kept)")
    breaker.set_defaults(func=cmd_breaker_reset)
    mode = verb("dry-run", "(on-call) switch dry run on or off at runtime")
    mode.add_argument("switch", choices=["on", "off"])
    mode.set_defaults(func=cmd_dry_run)
    return p


def token_of(args: argparse.Namespace) -> str:
    """The token: --token / TAU_TOKEN (`-`: read from stdin), else the contents of
    --token-file / TAU_TOKEN_FILE (a run pod's projected token, which the kubelet rotates:
    read at each start)."""
    if args.token == "-":  # noqa: S105  ("-" means stdin, not a password)
        return sys.stdin.read(64 * 1024).strip()
    if args.token or not args.token_file:
        return str(args.token)
    try:
        with pathlib.Path(args.token_file).open(encoding="utf-8") as f:
            return f.read(64 * 1024).strip()
    except OSError as err:
        msg = f"cannot read the token file {args.token_file}: {err.strerror or err}"
        raise TauError(msg, EXIT_USAGE) from err


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse a command line. `tau run`'s command is everything after the first `--`, split
    off before argparse sees it, so flags after the file are read and the command's own
    flags are never taken for tau's."""
    head, tail = argv, []
    if "--" in argv and "run" in argv[: argv.index("--")]:
        head, tail = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser().parse_args(head)
    if args.verb != "run":
        return args if not tail else parser().parse_args(argv)
    args.command = list(tail)
    spec_file = bool(args.file) and args.file.endswith((".yaml", ".yml", ".json"))
    if args.image and args.file and not spec_file:  # `tau run --image I python t.py`
        args.command = [args.file, *args.rest, *args.command]
        args.file, args.rest = None, []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else list(argv))
    env = os.environ
    try:
        if args.verb == "login":
            return cmd_login(args, env)
        config = read_config(config_path(env))
        if args.verb == "run":
            check_run_grammar(args)  # before anything else can fail: say what the line lacks
        spec_ns = None
        if getattr(args, "file", None) and not args.namespace:
            spec_ns = declared_namespace(_spec_body(args.file)[0])
        settings = settings_of(args, env, config, spec_ns)
        args.namespace = settings.namespace
        if getattr(args, "file", None) and settings.namespace_from in ("spec", "default"):
            args.namespace = None  # the controller reads (and checks) the file's own
        client = Client(settings.url, settings.token, ca_file=settings.ca_file)
        return int(args.func(client, args))
    except TauError as err:
        print(f"tau: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
