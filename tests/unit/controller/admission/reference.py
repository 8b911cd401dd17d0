"""The admission plan as it was before a pass worked each pod set's nodes out once: every
Workload rebuilt every node and walked every pod. Kept verbatim as the reference that the
differential property (`test_plan.py`) and `bench/gatepass.py` compare `policy.plan` with.

Below it, the gate's DRA inputs as they were before ResourceClaims were cached and parsed
once (`allocated_devices`, `claimed_pods`, read from the raw claims) and before a DRA node's
capacity was kept while it stayed the same (`with_devices`): the references of
`test_devices.py`'s properties and of `bench/gatepass.py --dra`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller import marks
from controller.admission import dra, policy, views


def _eligible(
    node: views.NodeCapacity, ps: views.PodSet, flavors: Mapping[str, views.Flavor]
) -> bool:
    """Whether the pod set may run on the node, health aside: the flavor's labels and the
    pod's node selector match, and every hard taint (health taints aside) is tolerated."""
    wanted = dict(ps.node_selector)
    tolerations = list(ps.tolerations)
    for name in ps.flavors:
        flavor = flavors.get(name)
        if flavor is None:
            continue
        wanted.update(flavor.node_labels)
        tolerations += flavor.tolerations
        # Kueue assigns a flavor only to Workloads that tolerate its nodeTaints.
        tolerations += [
            views.Toleration(t.key, "Equal", t.value, t.effect) for t in flavor.node_taints
        ]
    if any(node.labels.get(k) != v for k, v in wanted.items()):
        return False
    if ps.requests.gpus > 0 and ps.dra != node.dra:
        return False  # claims need a DRA node's devices, the extended resource a plugin's
    health_keys = {marks.TAINT_KEY, views.UNSCHEDULABLE_TAINT, *views.NOT_READY_TAINTS}
    return all(
        any(tol.tolerates(t) for tol in tolerations)
        for t in node.taints
        if t.effect in views.HARD_EFFECTS and t.key not in health_keys
    )


def _pack(
    pods: Sequence[policy._Pod], free: dict[str, views.Resources]
) -> tuple[list[tuple[str, views.Resources]], str | None]:
    """Place pods largest first, each on the tightest node that takes it; update `free`.
    Return the placement and the pod set of the first pod that did not fit (None: all did)."""
    placed: list[tuple[str, views.Resources]] = []
    for pod in sorted(pods, key=lambda p: p.requests, reverse=True):
        fits = [n for n in pod.nodes if pod.requests.fits_in(free[n])]
        if not fits:
            return placed, pod.pod_set
        node = min(fits, key=lambda n: (free[n], n))
        free[node] = free[node] - pod.requests
        placed.append((node, pod.requests))
    return placed, None


def _fit(
    workload: views.Workload,
    node_list: Sequence[views.NodeCapacity],
    flavors: Mapping[str, views.Flavor],
) -> tuple[bool, str, tuple[tuple[str, views.Resources], ...]]:
    """Pack every pod set of the Workload on healthy nodes; say where, or why not."""
    free = {n.name: n.free for n in node_list}
    before = dict(free)
    candidates = {ps.name: [n for n in node_list if _eligible(n, ps, flavors)]
                  for ps in workload.pod_sets}  # fmt: skip
    pods = [
        policy._Pod(
            ps.name, ps.requests, frozenset(n.name for n in candidates[ps.name] if n.healthy)
        )
        for ps in workload.pod_sets
        for _ in range(ps.count)
    ]
    placed, failed = _pack(pods, free)
    if failed is not None:
        ps = next(p for p in workload.pod_sets if p.name == failed)
        several = len(workload.pod_sets) > 1
        return False, policy._shortfall(ps, candidates[ps.name], before, several=several), ()
    used = sorted({node for node, _ in placed})
    flavor_names = sorted({f for ps in workload.pod_sets for f in ps.flavors})
    of = f" of flavor {'/'.join(flavor_names)}" if flavor_names else ""
    message = (
        f"fits on healthy nodes{of}: {policy._names(used)}" if used else "fits (no pods to place)"
    )
    return True, message, tuple(placed)


def _fencing(workload: views.Workload, pods: Iterable[views.PodUsage]) -> str:
    """The Pending message while pods of an earlier attempt still run ('' when none do).
    Pods that ended (Succeeded/Failed) run nothing: an ended attempt kept for its logs must
    not hold back a resume."""
    if not workload.run or workload.attempt is None:
        return ""
    earlier = sorted(
        (p.attempt, p.name)
        for p in pods
        if p.namespace == workload.namespace
        and p.run == workload.run
        and p.attempt is not None
        and p.attempt < workload.attempt
        and not p.terminal
    )
    if not earlier:
        return ""
    last = max(a for a, _ in earlier)
    names = [name for a, name in earlier if a == last]
    return f"waiting for attempt {last}'s pods to end: {policy._names(names)}"


def decide(
    workload: views.Workload,
    nodes: Sequence[views.NodeCapacity],
    flavors: Mapping[str, views.Flavor],
    earlier_attempt_pods: Iterable[views.PodUsage],
    now: dt.datetime,
    *,
    check: str = marks.DEFAULT_ADMISSION_CHECK,
    retry_after_s: float = views.DEFAULT_RETRY_AFTER_S,
) -> policy.Decision | None:
    """Decide our check's state for one Workload; None means write nothing.

    `nodes` carry their usage (`with_usage`); `earlier_attempt_pods` may hold any pods: only
    the non-terminal ones of earlier attempts of the Workload's run count (fencing).
    """
    ours = workload.check(check)
    if ours is None or ours.state in {
        views.CheckState.READY,
        views.CheckState.RETRY,
        views.CheckState.REJECTED,
    }:
        return None
    if (
        not workload.quota_reserved
        or workload.evicted
        or workload.finished
        or workload.admitted
        or not workload.active
    ):
        return None
    fenced = _fencing(workload, earlier_attempt_pods)
    placement: tuple[tuple[str, views.Resources], ...] = ()
    after: int | None = None
    if fenced:
        state, message = views.CheckState.PENDING, fenced
    else:
        fits, message, placement = _fit(workload, nodes, flavors)
        state = views.CheckState.READY if fits else views.CheckState.RETRY
        after = None if fits else math.ceil(retry_after_s)
    if state == ours.state and message == ours.message:
        return None
    since = now if state != ours.state or ours.last_transition is None else ours.last_transition
    return policy.Decision(state, message, after, since, placement)


def _claims(
    workload: views.Workload,
    pods: Sequence[views.PodUsage],
    node_list: Sequence[views.NodeCapacity],
    flavors: Mapping[str, views.Flavor],
    free: dict[str, views.Resources],
) -> None:
    """Reserve room for the pods of a passed Workload that are not bound yet (best effort:
    a pod that fits nowhere claims nothing). Pods are matched by the template's labels."""
    waiting: list[policy._Pod] = []
    for ps in workload.pod_sets:
        if not ps.labels:
            continue  # cannot tell its pods apart: assume they are bound and counted
        started = sum(1 for p in pods if _started(p, workload, ps))
        eligible = frozenset(n.name for n in node_list if n.healthy and _eligible(n, ps, flavors))
        waiting += [policy._Pod(ps.name, ps.requests, eligible)] * max(0, ps.count - started)
    for pod in waiting:
        _pack([pod], free)


def _started(p: views.PodUsage, w: views.Workload, ps: views.PodSet) -> bool:
    """Whether `p` is a started pod of pod set `ps` of `w`: placed (bound, or its claims
    allocated) or done, told apart by the template's labels."""
    return (
        p.namespace == w.namespace
        and (p.placed or p.terminal)
        and all(p.labels.get(k) == v for k, v in ps.labels.items())
    )


def plan(
    workloads: Sequence[views.Workload],
    nodes: Sequence[views.NodeCapacity],
    flavors: Mapping[str, views.Flavor],
    pods: Sequence[views.PodUsage],
    now: dt.datetime,
    *,
    check: str = marks.DEFAULT_ADMISSION_CHECK,
    retry_after_s: float = views.DEFAULT_RETRY_AFTER_S,
    queues: frozenset[str] | None = None,
) -> dict[tuple[str, str], policy.Decision]:
    """Decide every Workload of one pass, keyed by (namespace, name).

    `nodes` come without usage: the pods' requests are added here. Admitted (or already
    passed) Workloads whose pods are not bound yet claim their room first; then the
    Workloads waiting on our check are decided in Kueue's order (priority, then age), each
    Ready one claiming its nodes, so one pass never promises the same GPUs twice. `queues`
    limits the pass to Workloads admitted through those ClusterQueues (None: any).
    """
    base = views.with_usage(nodes, pods)
    free = {n.name: n.free for n in base}
    out: dict[tuple[str, str], policy.Decision] = {}
    passed = sorted(
        (w for w in workloads if w.holds_capacity(check)),
        key=lambda w: (-w.priority, w.created or now, w.namespace, w.name),
    )
    for w in passed:
        if _rechecked(w, pods, queues, check=check):
            current = [dataclasses.replace(n, used=n.allocatable - free[n.name]) for n in base]
            fits, message, placement = _fit(w, current, flavors)
            if not fits:
                out[(w.namespace, w.name)] = policy.Decision(
                    views.CheckState.RETRY,
                    f"quota released before its pods started: {message}",
                    math.ceil(retry_after_s),
                    now,
                )
                continue
            for node, req in placement:
                free[node] = free[node] - req
            continue
        _claims(w, pods, base, flavors, free)
    waiting = [
        w
        for w in workloads
        if w.check(check) is not None and (queues is None or w.cluster_queue in queues)
    ]
    waiting.sort(key=lambda w: (-w.priority, w.created or now, w.namespace, w.name))
    for w in waiting:
        current = [dataclasses.replace(n, used=n.allocatable - free[n.name]) for n in base]
        decision = decide(w, current, flavors, pods, now, check=check,
                          retry_after_s=retry_after_s)  # fmt: skip
        if decision is None:
            continue
        out[(w.namespace, w.name)] = decision
        for node, req in decision.placement:
            free[node] = free[node] - req
    return out


def _rechecked(
    w: views.Workload,
    pods: Sequence[views.PodUsage],
    queues: frozenset[str] | None,
    *,
    check: str,
) -> bool:
    """Whether a passed Workload is checked again: it gets GPUs through DRA claims, went
    through our check (Ready) in one of our queues, and none of its pods has started yet.
    Its devices may have gone bad since we said Ready; holding its quota then only keeps
    others out (kueue#12757). Started: bound to a node, or with its claims allocated (the
    scheduler is binding it; counting the devices those hold against it would send it back
    for want of its own GPUs). Pods are told apart by their template's labels; a pod set
    without labels cannot be, so its Workload is left alone."""
    ours = w.check(check)
    if not w.uses_dra or ours is None or ours.state != views.CheckState.READY:
        return False
    if w.pods_ready or (queues is not None and w.cluster_queue not in queues):
        return False
    if not all(ps.labels for ps in w.pod_sets):
        return False
    return not any(_started(p, w, ps) for ps in w.pod_sets for p in pods)


# ---------------------------------------------------------------- the gate's DRA inputs


def allocated_devices(raw_claims: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """(pool, device) of every device allocated to a ResourceClaim of NVIDIA's driver."""
    out = set()
    for claim in raw_claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if isinstance(result, Mapping) and result.get("driver") == marks.DRA_DRIVER:
                out.add((str(result.get("pool", "")), str(result.get("device", ""))))
    return frozenset(out)


def claimed_pods(raw_claims: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """(namespace, name) of every pod a ResourceClaim is allocated and reserved for."""
    out = set()
    for claim in raw_claims:
        status = claim.get("status") or {}
        if not status.get("allocation"):
            continue
        namespace = str((claim.get("metadata") or {}).get("namespace", ""))
        for ref in status.get("reservedFor") or []:
            if (
                isinstance(ref, Mapping)
                and ref.get("resource") == "pods"
                and not ref.get("apiGroup")
            ):
                out.add((namespace, str(ref.get("name", ""))))
    return frozenset(out)


def with_devices(
    node_list: Iterable[views.NodeCapacity],
    dra: Mapping[str, dra.DeviceNode],
    allocated: frozenset[tuple[str, str]],
) -> list[views.NodeCapacity]:
    """Give every DRA node its GPU capacity: the usable devices, and which of them claims
    hold. A node the fleet lists without devices, or as stale, offers no GPUs."""
    out = []
    for n in node_list:
        found = dra.get(n.name)
        if found is None:
            out.append(n)
            continue
        usable = [d for d in found.devices if d.usable]
        held = sum(1 for d in usable if (d.pool, d.name) in allocated)
        fenced = tuple((d.name, d.why) for d in found.devices if not d.usable)
        out.append(dataclasses.replace(
            n, dra=True, fresh=found.fresh, fenced=fenced,
            allocatable=dataclasses.replace(n.allocatable, gpus=len(usable) if found.fresh else 0),
            used=dataclasses.replace(n.used, gpus=n.used.gpus + held),
        ))  # fmt: skip
    return out
