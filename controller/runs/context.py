"""What the runs domain's handlers share: its live objects and the per-request helpers,
authorisation among them (a SubjectAccessReview per call, as `controller.runs.api` says)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from aiohttp import web

from controller import auth, errors, serving
from controller.kube import runs as kube_runs
from controller.runs import identity as run_identity
from controller.runs import keeping, reconciling, records, schemas
from shared import spec as specs

GROUP = "taugrid.dev"
RESOURCE = "tauruns"


@dataclasses.dataclass
class RunsContext:
    """The run reconciler and its adapter, shared by the handlers."""

    store: kube_runs.RunStore
    reconciler: reconciling.Reconciler
    keeper: keeping.LogKeeper
    run_pods: run_identity.RunPods = dataclasses.field(init=False, repr=False)
    """Which run and attempt a run pod's token is (`controller.runs.identity`)."""

    def __post_init__(self) -> None:
        self.run_pods = run_identity.RunPods(
            self.store.read_pod, self.store.read_object, self.store.get_run
        )


RUNS = web.AppKey("runs", RunsContext)


def context_of(request: web.Request) -> RunsContext:
    """The runs domain of the app handling `request`; Unavailable while it starts."""
    if RUNS not in request.app:
        raise errors.Unavailable("the controller is starting; retry shortly", code="Starting")
    return request.app[RUNS]


async def allow(
    request: web.Request,
    identity: auth.Identity,
    verb: str,
    namespace: str | None,
    *,
    resource: str = RESOURCE,
    group: str = GROUP,
    subresource: str = "",
) -> None:
    """Raise Forbidden unless RBAC lets `identity` make `verb` on runs (or `resource`)."""
    access = auth.Access(verb=verb, resource=resource, group=group, namespace=namespace,
                         subresource=subresource)  # fmt: skip
    await serving.allow(request, identity, access)


def run_path(request: web.Request) -> tuple[str, str]:
    """The namespace and name of the run the path names, validated in full before the
    handler ran (`schemas.RunPath`)."""
    path = serving.path_of(request, schemas.RunPath)
    return path.namespace, path.name


def check_run_namespace(request: web.Request, namespace: str) -> None:
    """Refuse a namespace this install does not run work in (`run_namespaces`): the
    controller has no rights there, so a run would never start (403 NamespaceNotServed)."""
    served = serving.serving_of(request).settings.run_namespaces
    if served and namespace not in served:
        msg = (
            f"namespace {namespace!r} is not one this TauGrid runs work in"
            f" ({', '.join(served)}); ask your platform team to add it"
        )
        raise errors.Forbidden(msg, field="namespace", code="NamespaceNotServed")


async def get_run(request: web.Request, namespace: str, name: str) -> dict[str, Any]:
    """The TauRun, read fresh (RunNotFoundError when it is not there)."""
    item = await context_of(request).store.get_run(namespace, name)
    if item is None:
        raise reconciling.RunNotFoundError(namespace, name)
    return item


async def read_run(request: web.Request, verb: str = "get") -> tuple[auth.Identity, dict[str, Any]]:
    """Authorise `verb` on the run the path names and read it (404 when it is not there)."""
    identity = await serving.identity(request)
    namespace, name = run_path(request)
    await allow(request, identity, verb, namespace)
    return identity, await get_run(request, namespace, name)


def expensive_read(
    request: web.Request, identity: auth.Identity
) -> contextlib.AbstractContextManager[None]:
    """One of the caller's slots for a read of many objects per call (429 when it holds as
    many as one caller may)."""
    limits = serving.serving_of(request).limits
    return limits.expensive_reads.hold(identity.username, identity.username)


def run_json(item: dict[str, Any], *, with_spec: bool = True) -> dict[str, Any]:
    """The API's view of a TauRun: what a researcher asks about, in camelCase."""
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    out: dict[str, Any] = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "kind": spec.get("kind", str(specs.RunKind.JOB)),
        "queue": spec.get("queue", specs.DEFAULT_QUEUE),
        "phase": status.get("phase", str(records.Phase.PENDING)),
        "reason": status.get("reason", ""),
        "message": status.get("message", ""),
        "attempt": status.get("currentAttempt", 0),
        "queuePosition": status.get("queuePosition"),
        "queuePositionInLocalQueue": status.get("queuePositionInLocalQueue"),
        "queuePositionSource": status.get("queuePositionSource"),
        "gpus": int((spec.get("resources") or {}).get("gpus") or 0) * int(spec.get("workers") or 1),
        "createdAt": meta.get("creationTimestamp"),
        "startTime": status.get("startTime"),
        "endTime": status.get("endTime"),
        "attempts": status.get("attempts") or [],
        "conditions": status.get("conditions") or [],
        "checkpoints": status.get("checkpoints") or [],
        "experiment": spec.get("experiment"),
        "rerunOf": ((status.get("evidence") or {}).get("rerunOf") or None),
    }
    if with_spec:
        out["spec"] = spec
    return out


def results_of(item: dict[str, Any]) -> records.Results | None:
    """The results a TauRun's status keeps (None before the first report); a member this
    controller cannot read is a 409, never a 500."""
    raw = (item.get("status") or {}).get("results")
    if raw is None:
        return None
    try:
        return records.Results.model_validate(raw)
    except ValueError as err:
        name = (item.get("metadata") or {}).get("name", "")
        msg = f"run {name!r} keeps results this controller cannot read ({err})"
        raise errors.Conflict(msg, code="UnreadableStatus") from err
