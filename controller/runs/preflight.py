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
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from controller import errors
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


class Unknown:
    """A fact that could not be read (the error, in words)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Unknown({self.why!r})"


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


def check(spec: specs.TauSpec, namespace: str, facts: Facts) -> list[str]:
    """The warnings of a spec that may be submitted; errors.Invalid (422, every problem in
    `problems`, the first one's field) when something it needs does not exist."""
    problems: list[dict[str, str]] = []
    warnings: list[str] = []
    queue = facts.cluster_queue
    if isinstance(queue, Unknown):
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
        if isinstance(claim, Unknown):
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
        if isinstance(facts.priority_class, Unknown):
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


async def _read(call: Any) -> Any:
    """A read's answer, or Unknown with why it could not be made."""
    try:
        return await call
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


async def gather(store: PreflightStore, spec: specs.TauSpec, namespace: str) -> Facts:
    """Read what `check` needs: the namespace's LocalQueues, the ClusterQueue behind the
    spec's, each claim it names, its priority class; in parallel."""
    names = sorted({name for _, name in claim_fields(spec)})
    queues, classes, *claims = await asyncio.gather(
        _read(store.list_kueue("localqueues", namespace)),
        _read(store.get_priority_class(spec.priority)) if spec.priority else _true(),
        *(_read(store.get_claim(namespace, n)) for n in names),
    )
    cluster_queue: str | Unknown | None
    if isinstance(queues, Unknown):
        cluster_queue = queues
    else:
        found = [q for q in queues if (q.get("metadata") or {}).get("name") == spec.queue]
        cluster_queue = str((found[0].get("spec") or {}).get("clusterQueue", "")) if found else None
    active: bool | Unknown | None = None
    if isinstance(cluster_queue, str):
        active = _active(await _read(store.get_cluster_queue(cluster_queue)))
    priority: bool | Unknown = classes if isinstance(classes, Unknown) else classes is not None
    return Facts(
        cluster_queue=cluster_queue, cluster_queue_active=active,
        claims={n: _claim(c) for n, c in zip(names, claims, strict=True)},
        priority_class=priority,
    )  # fmt: skip


async def _true() -> bool:
    return True


async def run(store: PreflightStore, spec: specs.TauSpec, namespace: str) -> Sequence[str]:
    """Gather and check: the warnings, or errors.Invalid naming the field."""
    return check(spec, namespace, await gather(store, spec, namespace))
