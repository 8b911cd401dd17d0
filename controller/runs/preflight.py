"""Pre-flight of a submission: what the spec names must exist before anything is created.

`POST /v1/runs` (and a rerun) checks, after the tau.yaml validates and before the TauRun is
created, what the cluster must hold for the run to ever start (docs/tau-yaml.md, "Checked at
submission"). Errors are a 422 naming the field; warnings ride along in the answer:

- `queue`: an error when no LocalQueue of that name is in the namespace (Kueue would never
  admit the run); a warning when its ClusterQueue does not exist or is not active (the
  platform may fix that while it waits).
- `volumes[i].claim`, `checkpoint.volume`: an error when no PersistentVolumeClaim of that
  name is in the namespace (its pods could never be scheduled); a warning when the claim is
  not bound yet (it may be, later), and for a checkpoint claim that is not ReadWriteMany
  when the run has several workers (only rank 0 may write).
- `priority`: an error when no WorkloadPriorityClass of that name exists (Kueue refuses the
  Workload).

A claim or a queue that cannot be read (the API server failing, RBAC) is a warning that it
was not checked, never a refusal and never a 500. Image pull Secrets are not checked: the
controller never reads Secrets (DESIGN.md section 10). Which priority classes a namespace
may use is a separate check (the platform's allow-list).

Every fact is told only to a caller who may read it (security review 3, finding 10): the
controller reads with its own, wider rights, so each object is first asked about for the
caller (`Readable`, SubjectAccessReviews through the API's cached path). What the caller may
not read is a warning that says so, the same words whether the object exists or not, and never
a refusal: a claim needs `get persistentvolumeclaims` in the namespace; the
queue and its ClusterQueue what `tau queues` needs (`list tauruns` there); a priority class
`get workloadpriorityclasses.kueue.x-k8s.io`, unless the platform's allow-list names it (public
configuration). The names a run's objects would take are checked the same way (`name_check`,
`get` of each kind in the namespace).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from controller import auth, errors
from controller.runs import owners
from shared import spec as specs


class PreflightStore(Protocol):
    """The reads pre-flight makes (`controller.kube.runs.RunStore` implements them)."""

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Kueue objects of one plural (of a namespace)."""
        ...

    async def get_cluster_queue(self, name: str) -> dict[str, Any] | None:
        """A ClusterQueue, None when there is none."""
        ...

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        """A WorkloadPriorityClass, None when there is none."""
        ...

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A PersistentVolumeClaim, None when there is none."""
        ...


@dataclasses.dataclass(frozen=True)
class Unknown:
    """A fact that could not be read (the error, in words)."""

    why: str


@dataclasses.dataclass(frozen=True)
class Readable:
    """Which of pre-flight's facts the caller may be told: each is asked about for the caller
    (a SubjectAccessReview, cached), never inferred from what the controller may read."""

    queue: bool = True
    """The LocalQueue and the ClusterQueue behind it: `list tauruns` in the namespace, the
    right `GET /v1/queues` shows them for."""
    unreadable_claims: frozenset[str] = frozenset()
    """Claims the caller may not `get` in the namespace (`get persistentvolumeclaims`)."""
    priority_class: bool = True
    """The spec's priority class: allow-listed, or the caller may `get` it."""


def priority_readable(name: str, allowed: Sequence[str], may_get: bool) -> bool:
    """Whether a priority class's existence may be told: a name on the platform's allow-list
    is public configuration; any other only to a caller who may `get` it (the same answer,
    whether it exists or not, to anyone else)."""
    return name in allowed or may_get


OBJECT_RESOURCES: Mapping[str, tuple[str, str]] = {
    "ConfigMap": ("", "configmaps"),
    "Service": ("", "services"),
    "Job": ("batch", "jobs"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "RayJob": ("ray.io", "rayjobs"),
    "ResourceClaimTemplate": ("resource.k8s.io", "resourceclaimtemplates"),
}
"""(API group, resource) of each kind a run's first objects are, for the caller's `get`."""


def not_readable(resource: str, group: str, namespace: str | None) -> str:
    """Why a fact was not checked, in the words a caller who may not read it is told."""
    res = f"{resource}.{group}" if group else resource
    return f"you may not get {res}" + (f" in {namespace}" if namespace else "")


@dataclasses.dataclass(frozen=True)
class Name:
    """A name one of a new run's objects would take, as the caller may be told of it."""

    kind: str
    namespace: str
    name: str
    readable: bool
    """Whether the caller may `get` that kind of that name there."""
    existing: Mapping[str, Any] | None = None
    """The object that holds the name (None: free, or not read because not `readable`)."""


def name_check(run: str, names: Sequence[Name]) -> list[str]:
    """Whether a new run may take its objects' names (review M4), told only to a caller who
    may `get` each: errors.NameTaken naming the first readable one somebody else's object
    holds (an object run `run` already controls is its own); for the names the caller may
    not read, one warning that they were not checked, the same whether any is taken or free
    (the held object is not looked at: the run's own creation meets a taken name, and the
    run ends Failed NameTaken)."""
    for n in names:
        owner = owners.controller(n.existing)
        if not n.readable or n.existing is None or (
            owner.get("kind") == "TauRun" and owner.get("name") == run
        ):  # fmt: skip
            continue
        msg = (
            f"a {n.kind} {n.namespace}/{n.name} already exists and is not a run's;"
            f" run {run!r} would need that name: delete it, or choose another run name"
        )
        raise errors.NameTaken(msg, field="name")
    hidden = [n for n in names if not n.readable]
    if not hidden:
        return []
    which = ", ".join(f"{n.kind} {n.name!r}" for n in hidden)
    rights = ", ".join(dict.fromkeys(_resource_name(n.kind) for n in hidden))
    why = (
        f"whether the names run {run!r} needs are free ({which}) was not checked: you may not"
        f" get {rights} in {hidden[0].namespace} (a run whose name is taken ends Failed"
        " NameTaken)"
    )
    return [why]


def _resource_name(kind: str) -> str:
    group, resource = OBJECT_RESOURCES.get(kind, ("", kind.lower() + "s"))
    return f"{resource}.{group}" if group else resource


@dataclasses.dataclass(frozen=True)
class Claim:
    """What pre-flight reads of a PersistentVolumeClaim."""

    phase: str
    access_modes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the cluster holds of what a spec names."""

    cluster_queue: str | Unknown | None
    """The ClusterQueue behind the spec's LocalQueue; None: no such LocalQueue."""
    cluster_queue_active: bool | Unknown | None = None
    """Whether that ClusterQueue exists and is Active; None: it does not exist."""
    claims: Mapping[str, Claim | Unknown | None] = dataclasses.field(default_factory=dict)
    priority_class: bool | Unknown = True
    """Whether the spec's WorkloadPriorityClass exists (True when it names none)."""


def claim_fields(spec: specs.TauSpec) -> list[tuple[str, str]]:
    """(field, claim) for every claim the spec names, as a refusal would name the field."""
    out = [(f"volumes[{i}].claim", v.claim) for i, v in enumerate(spec.volumes)]
    if spec.checkpoint is not None and spec.checkpoint.volume:
        out.append(("checkpoint.volume", spec.checkpoint.volume))
    return out


def check(
    spec: specs.TauSpec, namespace: str, facts: Facts, readable: Readable = Readable()
) -> list[str]:
    """The warnings of a spec that may be submitted; errors.Invalid (422, every problem in
    `problems`, the first one's field) when something it needs does not exist. A fact the
    caller may not read (`readable`) is not looked at: its warning says so, in words that do
    not depend on the fact."""
    problems: list[dict[str, str]] = []
    warnings: list[str] = []
    queue = facts.cluster_queue
    if not readable.queue:
        why = not_readable("tauruns", "taugrid.dev", namespace).replace(" get ", " list ")
        warnings.append(f"queue {spec.queue!r} was not checked: {why}")
    elif isinstance(queue, Unknown):
        warnings.append(f"queue {spec.queue!r} was not checked: {queue.why}")
    elif queue is None:
        problems.append({"field": "queue", "message": (
            f"no queue {spec.queue!r} in namespace {namespace}; `tau queues` lists the ones"
            " there are (a run in a queue that does not exist never starts)")})  # fmt: skip
    elif isinstance(facts.cluster_queue_active, Unknown):
        warnings.append(
            f"cluster queue {queue!r} was not checked: {facts.cluster_queue_active.why}"
        )
    elif facts.cluster_queue_active is None:
        warnings.append(
            f"queue {spec.queue!r} points at cluster queue {queue!r}, which does not exist:"
            " the run waits until your platform team creates it"
        )
    elif not facts.cluster_queue_active:
        warnings.append(
            f"cluster queue {queue!r} behind queue {spec.queue!r} is not active: the run waits"
            " until it is (`kubectl get clusterqueue` says why)"
        )
    for field, name in claim_fields(spec):
        claim = facts.claims.get(name)
        if name in readable.unreadable_claims:
            why = not_readable("persistentvolumeclaims", "", namespace)
            warnings.append(f"claim {name!r} ({field}) was not checked: {why}")
        elif isinstance(claim, Unknown):
            warnings.append(f"claim {name!r} ({field}) was not checked: {claim.why}")
        elif claim is None:
            problems.append({"field": field, "message": (
                f"no PersistentVolumeClaim {name!r} in namespace {namespace}; create it first"
                " (the run's pods cannot be scheduled without it)")})  # fmt: skip
        else:
            if claim.phase != "Bound":
                warnings.append(
                    f"claim {name!r} ({field}) is {claim.phase or 'not bound'}, not Bound: the"
                    " run's pods wait until it is"
                )
            if (
                field == "checkpoint.volume" and spec.workers > 1
                and "ReadWriteMany" not in claim.access_modes
            ):  # fmt: skip
                warnings.append(
                    f"checkpoint claim {name!r} is not ReadWriteMany but the run has"
                    f" {spec.workers} workers: only rank 0 may write checkpoints"
                )
    if spec.priority is not None:
        if not readable.priority_class:
            why = not_readable("workloadpriorityclasses", "kueue.x-k8s.io", None)
            warnings.append(
                f"priority {spec.priority!r} was not checked: {why}, and the platform's"
                " allow-list does not name it"
            )
        elif isinstance(facts.priority_class, Unknown):
            warnings.append(
                f"priority {spec.priority!r} was not checked: {facts.priority_class.why}"
            )
        elif not facts.priority_class:
            problems.append({"field": "priority", "message": (
                f"no WorkloadPriorityClass {spec.priority!r}; Kueue would refuse the run"
                " (ask your platform team which classes there are)")})  # fmt: skip
    if problems:
        first = problems[0]
        raise errors.Invalid(
            f"{first['field']}: {first['message']}", field=first["field"], code="Preflight",
            problems=problems,
        )  # fmt: skip
    return warnings


async def _read(call: Callable[[], Awaitable[Any]]) -> Any:
    """A read's answer, or Unknown with why it could not be made. The read is started here:
    a coroutine handed in would be left never awaited were this task cancelled before its
    first step (a caller gone while `gather` starts its reads)."""
    try:
        return await call()
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001  (a read that fails is reported, not raised)
        return Unknown(str(getattr(err, "reason", "") or err)[:200])


def _claim(raw: Any) -> Claim | Unknown | None:
    if raw is None or isinstance(raw, Unknown):
        return raw
    spec = raw.get("spec") or {}
    return Claim(
        phase=str((raw.get("status") or {}).get("phase") or ""),
        access_modes=tuple(str(m) for m in spec.get("accessModes") or []),
    )


def _active(raw: Any) -> bool | Unknown | None:
    if raw is None or isinstance(raw, Unknown):
        return raw
    for c in (raw.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Active":
            return bool(c.get("status") == "True")
    return False


Allowed = Callable[[auth.Access], Awaitable[bool]]
"""Whether the caller may make an access (the API's cached SubjectAccessReview)."""


async def readable(
    may: Allowed, spec: specs.TauSpec, namespace: str, allowed_priorities: Sequence[str]
) -> Readable:
    """Ask, for the caller, about each fact pre-flight would tell (one review at a time: a
    caller's reviews in flight are capped). Each asks for `get` of the kind, any name: one
    cached answer per caller and kind, however many names are tried (a caller whose RBAC
    names single objects is told nothing: the safe side)."""
    queue = await may(auth.Access(verb="list", resource="tauruns", group="taugrid.dev",
                                  namespace=namespace))  # fmt: skip
    claims = sorted({name for _, name in claim_fields(spec)})
    access = auth.Access(verb="get", resource="persistentvolumeclaims", namespace=namespace)
    hidden = set() if not claims or await may(access) else set(claims)
    priority = True
    if spec.priority is not None and spec.priority not in allowed_priorities:
        access = auth.Access(verb="get", resource="workloadpriorityclasses",
                             group="kueue.x-k8s.io")  # fmt: skip
        priority = priority_readable(spec.priority, allowed_priorities, await may(access))
    return Readable(queue=queue, unreadable_claims=frozenset(hidden), priority_class=priority)


async def gather(
    store: PreflightStore, spec: specs.TauSpec, namespace: str, readable: Readable = Readable()
) -> Facts:
    """Read what `check` needs: the namespace's LocalQueues, the ClusterQueue behind the
    spec's, each claim it names, its priority class; in parallel. What the caller may not
    read (`readable`) is not read at all."""
    names = sorted({name for _, name in claim_fields(spec)} - readable.unreadable_claims)
    hidden: Unknown = Unknown("not read: the caller may not")
    wanted = spec.priority if readable.priority_class else None
    queues, classes, *claims = await asyncio.gather(
        _read(functools.partial(store.list_kueue, "localqueues", namespace))
        if readable.queue else _value(hidden),
        _read(functools.partial(store.get_priority_class, wanted)) if wanted else _value(True),
        *(_read(functools.partial(store.get_claim, namespace, n)) for n in names),
    )  # fmt: skip
    cluster_queue: str | Unknown | None
    if isinstance(queues, Unknown):
        cluster_queue = queues
    else:
        found = [q for q in queues if (q.get("metadata") or {}).get("name") == spec.queue]
        cluster_queue = str((found[0].get("spec") or {}).get("clusterQueue", "")) if found else None
    active: bool | Unknown | None = None
    if isinstance(cluster_queue, str):
        active = _active(await _read(functools.partial(store.get_cluster_queue, cluster_queue)))
    priority: bool | Unknown = classes if isinstance(classes, Unknown) else classes is not None
    return Facts(
        cluster_queue=cluster_queue, cluster_queue_active=active,
        claims={n: _claim(c) for n, c in zip(names, claims, strict=True)},
        priority_class=priority,
    )  # fmt: skip


async def _value(value: Any) -> Any:
    return value


async def run(
    store: PreflightStore, spec: specs.TauSpec, namespace: str, may: Allowed,
    allowed_priorities: Sequence[str],
) -> Sequence[str]:  # fmt: skip
    """Ask what the caller may read, gather that, and check: the warnings, or errors.Invalid
    naming the field."""
    seen = await readable(may, spec, namespace, allowed_priorities)
    return check(spec, namespace, await gather(store, spec, namespace, seen), seen)
