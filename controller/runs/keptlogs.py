"""Logs kept as evidence, computed: which pod is which worker, the tail to keep, the object.

Purely computational (DESIGN.md sections 4 and 10). A worker's log dies with its pod (the
Job's TTL, an eviction, a node that vanished), so the controller keeps the last
`keep_bytes` of each worker's log in a `TauRunLog` (`taugrid.dev/v1alpha1`, one per attempt
and worker, owned by the TauRun and labelled with it): captured periodically while the pod
runs and finally when the attempt ends. Not a ConfigMap: whoever may read a run's logs is
exactly whoever may read `pods/log` in its namespace (the API checks that, as it does for
live logs), and people who may read ConfigMaps must not read logs through them.

`workers` is the one numbering of a run's pods that both the live logs and the kept logs
use, so `?worker=K` means the same pod either way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from controller import marks, timestamps
from controller.runs import objects, rendering, views
from shared import patterns

_OBJECT_NAME_RE = patterns.compile_full(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
"""A pod's or container's name as Kubernetes allows it (DNS-1123 subdomain, in full)."""

API_VERSION = objects.TAURUN_API_VERSION
KIND = "TauRunLog"
DEFAULT_KEEP_BYTES = 64 * 1024
READ_FACTOR = 4
"""A tail read asks for at most this many times the bytes it keeps (`limitBytes`)."""


def name(run: str, attempt: int, worker: int) -> str:
    """`<run>-a<N>-w<K>`: the TauRunLog of worker K of attempt N."""
    return f"{objects.attempt_name(run, attempt)}-w{worker}"


# ---------------------------------------------------------------- workers
def _order(pods: Sequence[tuple[views.PodView, Any]]) -> list[tuple[views.PodView, Any]]:
    floor = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(
        pods,
        key=lambda vp: (vp[0].index if vp[0].index is not None else 0, vp[0].created or floor,
                        vp[0].name),
    )  # fmt: skip


def workers(pods: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str]]:
    """The pods of one attempt as workers 0, 1, …, each with the container whose log is its
    log. Ray: worker 0 is the head, 1.. the workers. Otherwise by completion index (Indexed
    Jobs), else by creation; a pod being deleted gives way to one that is not (Kueue
    readmitted the attempt and its new pods run)."""
    parsed = [(views.parse_pod(p), p) for p in pods]
    heads = _order([vp for vp in parsed if rendering.RAY_HEAD_CONTAINER in vp[0].containers])
    ray = _order([vp for vp in parsed if rendering.RAY_WORKER_CONTAINER in vp[0].containers])
    if heads or ray:
        return [(p, rendering.RAY_HEAD_CONTAINER) for _, p in heads[:1]] + [
            (p, rendering.RAY_WORKER_CONTAINER) for _, p in ray
        ]
    live = [vp for vp in parsed if not vp[0].deleting] or parsed
    indexed = [vp for vp in live if vp[0].index is not None]
    if indexed and len(indexed) == len(live):
        by_index = {vp[0].index or 0: vp for vp in _order(indexed)}  # the newest of an index wins
        return [(by_index[i][1], rendering.CONTAINER_NAME) for i in sorted(by_index)]
    return [(p, rendering.CONTAINER_NAME) for _, p in _order(live)]


# ---------------------------------------------------------------- the tail
def tail_lines(keep_bytes: int) -> int:
    """How many lines the first read of a tail asks for: enough for `keep_bytes` of lines
    of 32 bytes (a shorter average only means a shorter tail is kept)."""
    return max(keep_bytes // 32, 64)


def read_again(got: int, asked_lines: int, keep_bytes: int) -> int | None:
    """After a tail read of `asked_lines` lines returned `got` bytes: None when those bytes
    end at the log's end (fewer than the read's byte limit), else the fewer lines to ask
    for next (the limit cut the read short, so what came is not the end of the log)."""
    if got < keep_bytes * READ_FACTOR or asked_lines <= 1:
        return None
    return max(asked_lines // READ_FACTOR, 1)


def keep(data: bytes, keep_bytes: int) -> tuple[str, bool]:
    """The last `keep_bytes` of `data` as text, starting at a line when one starts within
    the kept part, and whether anything older was dropped. Invalid UTF-8 is replaced, never
    refused: a log is whatever the program wrote."""
    if len(data) <= keep_bytes:
        return data.decode("utf-8", errors="replace"), False
    cut = data[-keep_bytes:]
    newline = cut.find(b"\n")
    if 0 <= newline < len(cut) - 1:
        cut = cut[newline + 1 :]
    return cut.decode("utf-8", errors="replace"), True


def finished(pod: views.PodView) -> bool:
    """Whether the pod's containers have ended: nothing more will be written to its log."""
    return pod.phase in {"Succeeded", "Failed"}


# ---------------------------------------------------------------- the object
@dataclasses.dataclass(frozen=True)
class Kept:
    """One worker's log as kept."""

    name: str
    run: str
    attempt: int
    worker: int
    pod: str
    log: str
    captured_at: dt.datetime | None
    complete: bool
    """The container had ended when it was captured: this is its whole tail."""
    truncated: bool
    """Older output was dropped (only the last `keep_bytes` are kept)."""
    owner_uid: str
    """The uid of the TauRun that controls it (an owner reference with `controller: true`)."""
    resource_version: str = ""
    labelled_run: str = ""
    """Its `taugrid.dev/run` label."""

    def belongs_to(self, run: objects.RunRef) -> bool:
        """Whether this is `run`'s own kept log as the controller writes it: controlled by
        the run (uid), labelled and naming it. The chart's admission policy lets only the
        controller write TauRunLogs; this check holds where that policy is not installed."""
        return (self.owner_uid, self.run, self.labelled_run) == (run.uid, run.name, run.name)


def render(
    run: objects.RunRef, attempt: int, worker: int, *, pod: str, container: str, log: str,
    now: dt.datetime, complete: bool, truncated: bool,
) -> dict[str, Any]:  # fmt: skip
    """The TauRunLog of one worker of one attempt, owned by and labelled with its TauRun."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name(run.name, attempt, worker),
            "namespace": run.namespace,
            "labels": {
                marks.RUN_LABEL: run.name,
                marks.ATTEMPT_LABEL: str(attempt),
                marks.WORKER_LABEL: str(worker),
            },
            "ownerReferences": [objects.owner_reference(run)],
        },
        "spec": {
            "run": run.name,
            "attempt": attempt,
            "worker": worker,
            "pod": pod,
            "container": container,
            "capturedAt": timestamps.rfc3339(now),
            "complete": complete,
            "truncated": truncated,
            "bytes": len(log.encode()),
            "log": log,
        },
    }


def read(raw: Mapping[str, Any]) -> Kept:
    """A TauRunLog as stored (missing fields read as empty)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    owners = [o for o in meta.get("ownerReferences") or []
              if o.get("kind") == "TauRun" and o.get("controller") is True]  # fmt: skip
    return Kept(
        name=str(meta.get("name", "")),
        run=str(spec.get("run", "")),
        attempt=int(spec.get("attempt") or 0),
        worker=int(spec.get("worker") or 0),
        pod=_object_name(spec.get("pod")),
        log=str(spec.get("log", "")),
        captured_at=timestamps.parse(spec.get("capturedAt")),
        complete=bool(spec.get("complete")),
        truncated=bool(spec.get("truncated")),
        owner_uid=str(owners[0].get("uid", "")) if owners else "",
        resource_version=str(meta.get("resourceVersion", "")),
        labelled_run=str((meta.get("labels") or {}).get(marks.RUN_LABEL, "")),
    )


def _object_name(value: object) -> str:
    """A stored pod name when it is one, else '': it becomes a response header
    (`X-TauGrid-Pod`), where CR/LF would break the answer (review 3, finding 9)."""
    text = str(value or "")
    return text if len(text) <= 253 and _OBJECT_NAME_RE.fullmatch(text) else ""


def replaces(old: Kept, new: Mapping[str, Any]) -> bool:
    """Whether a fresh capture should replace what is kept: not when nothing changed, and
    never a complete capture by an incomplete one (the pod's end is the better evidence)."""
    spec = new.get("spec") or {}
    if old.complete and not spec.get("complete"):
        return False
    return (old.log, old.complete, old.pod) != (spec.get("log"), spec.get("complete"),
                                                spec.get("pod"))  # fmt: skip


def index(kept: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the evidence lists of a run's kept logs (not their text: that needs pods/log)."""
    out = [
        {"attempt": k.attempt, "worker": k.worker, "name": k.name, "pod": k.pod,
         "capturedAt": timestamps.rfc3339(k.captured_at) if k.captured_at else None,
         "complete": k.complete, "truncated": k.truncated, "bytes": len(k.log.encode())}
        for k in map(read, kept)
    ]  # fmt: skip
    return sorted(out, key=lambda e: (e["attempt"], e["worker"]))
