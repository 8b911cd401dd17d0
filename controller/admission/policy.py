"""The admission gate, computed: does a Workload fit, node by node, on healthy nodes?

Purely computational (DESIGN.md section 7, "Admission gate"): the `Gate` loop reads raw
Workloads, Nodes, Pods, ResourceFlavors, ClusterQueues and the AdmissionCheck, turns them into
the small views below with the `parse_*` functions, and asks `plan` (one pass over every
Workload) or `decide` (one Workload) what our check's state should be. `now` is always an
argument. No I/O, no clock, no logging.

What the gate holds a Workload to:
- **Ready** when every pod set fits on healthy, schedulable nodes of its assigned flavor,
  counted node by node: a pod of 8 GPUs needs one node with 8 free GPUs, however many GPUs
  the flavor has in total. Free means allocatable minus the requests of the pods bound to
  the node (and of admitted Workloads whose pods are not bound yet), for GPUs, CPU and memory.
  Pod sets are packed together, largest pods first, each on the tightest node that takes it.
  A Ready check carries exactly one merged `podSetUpdates` entry per pod set: marks saying
  the gate passed the pods and when (`entries.gate_pod_set_updates`).
- **Retry**, with `requeueAfterSeconds` set, when they do not fit: Kueue releases the quota
  and queues the Workload again after that delay (nil would make Kueue retry at once: a hot
  loop). The message says what is missing in words.
- **Pending** while pods of an earlier attempt of the same run still run (fencing): they
  end within their grace period, and two attempts of a run must never run at once.
- Nothing at all (None: no write) for a Workload that is Evicted, has no quota reserved, is
  finished or deactivated, is already admitted, whose check Kueue has not listed yet or is
  already Retry/Rejected, or whose check already says what we would write. A check once
  Ready is never taken back: a node failing after admission is the quarantine's business.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller import marks, timestamps
from controller.admission import views

# ---------------------------------------------------------------- the check and its queues


def cluster_queue_checks(raw: Mapping[str, Any]) -> frozenset[str]:
    """Names of the admission checks a raw ClusterQueue's `admissionChecksStrategy` lists."""
    strategy = (raw.get("spec") or {}).get("admissionChecksStrategy") or {}
    return frozenset(
        str(c.get("name", ""))
        for c in strategy.get("admissionChecks") or []
        if isinstance(c, Mapping) and c.get("name")
    )


def queues_with_check(raw_queues: Iterable[Mapping[str, Any]], check: str) -> frozenset[str]:
    """Names of the ClusterQueues whose strategy names `check`."""
    return frozenset(
        str((q.get("metadata") or {}).get("name", ""))
        for q in raw_queues
        if check in cluster_queue_checks(q)
    )


def owns_check(
    raw_check: Mapping[str, Any] | None, controller_name: str = marks.ADMISSION_CHECK_CONTROLLER
) -> bool:
    """Whether a raw AdmissionCheck exists and names our controller."""
    if raw_check is None:
        return False
    return (raw_check.get("spec") or {}).get("controllerName") == controller_name


def active_condition(
    raw_check: Mapping[str, Any], now: dt.datetime, message: str
) -> dict[str, Any] | None:
    """The `Active` condition to write on our AdmissionCheck, None when it already holds
    (True, our reason and message, for the current generation)."""
    meta = raw_check.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    current = next(
        (c for c in (raw_check.get("status") or {}).get("conditions") or []
         if isinstance(c, Mapping) and c.get("type") == marks.CHECK_ACTIVE_CONDITION),
        None,
    )  # fmt: skip
    if (
        current is not None
        and current.get("status") == "True"
        and current.get("reason") == marks.CHECK_ACTIVE_REASON
        and current.get("message") == message
        and int(current.get("observedGeneration") or 0) == generation
    ):
        return None
    since = now
    if current is not None and current.get("status") == "True":
        since = timestamps.parse(current.get("lastTransitionTime")) or now
    return {
        "type": marks.CHECK_ACTIVE_CONDITION,
        "status": "True",
        "reason": marks.CHECK_ACTIVE_REASON,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": timestamps.rfc3339(since),
    }


# ---------------------------------------------------------------- the decision


@dataclasses.dataclass(frozen=True)
class Decision:
    """What our check on one Workload should say."""

    state: views.CheckState
    message: str
    requeue_after_s: int | None = None
    """Set with Retry only: Kueue waits this long before positions the Workload again."""
    since: dt.datetime | None = None
    """`lastTransitionTime` to write: now on a change of state, else the current one."""
    placement: tuple[tuple[str, views.Resources], ...] = ()
    """(node, requests) of every pod, for Ready: what the later Workloads of a pass must
    not count on."""


@dataclasses.dataclass(frozen=True)
class _Pod:
    pod_set: str
    requests: views.Resources
    nodes: frozenset[str]


_Shape = tuple[tuple[tuple[str, str], ...], tuple[views.Toleration, ...], bool | None]
"""What decides which nodes a pod set may run on, health aside: the labels wanted (the
flavors' and the pod's node selector), the tolerations (the pod's, the flavors', and the
flavors' node taints) and, for pods of GPUs, whether they need a DRA node."""


def _shape(ps: views.PodSet, flavors: Mapping[str, views.Flavor]) -> _Shape:
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
    # claims need a DRA node's devices, the extended resource a plugin's
    dra = ps.dra if ps.requests.gpus > 0 else None
    return tuple(sorted(wanted.items())), tuple(tolerations), dra


_HEALTH_TAINTS = frozenset({marks.TAINT_KEY, views.UNSCHEDULABLE_TAINT, *views.NOT_READY_TAINTS})


def _eligible(node: views.NodeCapacity, shape: _Shape) -> bool:
    """Whether a pod set of this shape may run on the node, health aside: the labels match,
    the node is of the kind its GPUs need, and every hard taint (health taints aside) is
    tolerated."""
    wanted, tolerations, dra = shape
    if any(node.labels.get(k) != v for k, v in wanted):
        return False
    if dra is not None and dra != node.dra:
        return False
    return all(
        any(tol.tolerates(t) for tol in tolerations)
        for t in node.taints
        if t.effect in views.HARD_EFFECTS and t.key not in _HEALTH_TAINTS
    )


class _Fleet:
    """One pass's nodes. Each pod set shape's eligible nodes are worked out once a pass,
    not once for every Workload: Workloads of one flavor share them."""

    def __init__(
        self, nodes: Sequence[views.NodeCapacity], flavors: Mapping[str, views.Flavor]
    ) -> None:
        self.nodes = nodes
        self.flavors = flavors
        self._shapes: dict[_Shape, tuple[list[views.NodeCapacity], frozenset[str]]] = {}

    def candidates(self, ps: views.PodSet) -> tuple[list[views.NodeCapacity], frozenset[str]]:
        """The nodes the pod set may run on, health aside (in the pass's order), and the
        names of the healthy ones."""
        shape = _shape(ps, self.flavors)
        found = self._shapes.get(shape)
        if found is None:
            eligible = [n for n in self.nodes if _eligible(n, shape)]
            found = eligible, frozenset(n.name for n in eligible if n.healthy)
            self._shapes[shape] = found
        return found


class _Pods:
    """One pass's pods, indexed as the plan asks for them: by run (fencing) and by label
    (a pod set's started pods), each index built the first time it is asked for."""

    def __init__(self, pods: Iterable[views.PodUsage]) -> None:
        self.pods = list(pods)
        self._runs: dict[tuple[str, str], list[views.PodUsage]] | None = None
        self._labels: dict[str, dict[tuple[str, str], list[views.PodUsage]]] = {}

    def of_run(self, namespace: str, run: str) -> list[views.PodUsage]:
        """The pods of a run that carry an attempt."""
        if self._runs is None:
            self._runs = {}
            for p in self.pods:
                if p.run and p.attempt is not None:
                    self._runs.setdefault((p.namespace, p.run), []).append(p)
        return self._runs.get((namespace, run), [])

    def _labelled(self, namespace: str, key: str, value: str) -> list[views.PodUsage]:
        index = self._labels.get(key)
        if index is None:
            index = self._labels[key] = {}
            for p in self.pods:
                if key in p.labels:
                    index.setdefault((p.namespace, p.labels[key]), []).append(p)
        return index.get((namespace, value), [])

    def started(self, w: views.Workload, ps: views.PodSet) -> int:
        """How many started pods pod set `ps` of `w` has (`_started`)."""
        if not ps.labels:
            return sum(1 for p in self.pods if _started(p, w, ps))
        some = min((self._labelled(w.namespace, k, v) for k, v in ps.labels.items()), key=len)
        return sum(1 for p in some if _started(p, w, ps))


class _Free:
    """What each node has left in one pass, with the nodes also kept in order of it (GPUs,
    CPU, memory, name: `Resources`' order), so the tightest node that takes a pod is the
    first eligible one that fits past the nodes with too few GPUs, not a walk of all."""

    def __init__(self, rooms: Mapping[str, views.Resources]) -> None:
        self.rooms = dict(rooms)
        self._order = sorted(_key(r, n) for n, r in self.rooms.items())

    def take(self, placed: Iterable[tuple[str, views.Resources]]) -> None:
        """Count a placement's requests out of what its nodes have left."""
        for node, req in placed:
            room = self.rooms[node]
            del self._order[bisect.bisect_left(self._order, _key(room, node))]
            self.rooms[node] = room - req
            bisect.insort(self._order, _key(self.rooms[node], node))

    def tightest(
        self, req: views.Resources, nodes: frozenset[str], taken: Mapping[str, views.Resources]
    ) -> str | None:
        """The node of `nodes` with the least room that still takes `req` (by room, then
        name), counting `taken` (nodes given part of their room already) as what they have
        left; None when none takes it."""
        best: tuple[int, int, int, str] | None = None
        for node, room in taken.items():
            if node in nodes and req.fits_in(room) and (best is None or _key(room, node) < best):
                best = _key(room, node)
        order = self._order
        for i in range(bisect.bisect_left(order, (req.gpus,)), len(order)):
            entry = order[i]
            if best is not None and entry >= best:
                break
            _, cpu, memory, node = entry
            if (
                node in nodes
                and node not in taken
                and cpu >= req.cpu_milli
                and memory >= req.memory
            ):
                best = entry  # the first that fits: the least room of the rest
                break
        return None if best is None else best[3]


def _key(room: views.Resources, node: str) -> tuple[int, int, int, str]:
    return room.gpus, room.cpu_milli, room.memory, node


def _pack(
    pods: Sequence[_Pod], free: _Free
) -> tuple[list[tuple[str, views.Resources]], str | None]:
    """Place pods largest first, each on the tightest node that takes it (`free` is left as
    it is: the caller takes the placement). Return the placement and the pod set of the first
    pod that did not fit (None: all did)."""
    placed: list[tuple[str, views.Resources]] = []
    taken: dict[str, views.Resources] = {}
    for pod in sorted(pods, key=lambda p: p.requests, reverse=True):
        node = free.tightest(pod.requests, pod.nodes, taken)
        if node is None:
            return placed, pod.pod_set
        taken[node] = taken.get(node, free.rooms[node]) - pod.requests
        placed.append((node, pod.requests))
    return placed, None


def _slots(free: views.Resources, req: views.Resources, cap: int) -> int:
    """How many pods of `req` fit in `free` (at most `cap`)."""
    counts = [
        have // need
        for have, need in ((free.gpus, req.gpus), (free.cpu_milli, req.cpu_milli),
                           (free.memory, req.memory))
        if need > 0
    ]  # fmt: skip
    return max(0, min([cap, *counts]))


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[: views.MAX_NAMES])
    return shown + (" …" if len(items) > views.MAX_NAMES else "")


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _size(req: views.Resources) -> str:
    parts = []
    if req.cpu_milli:
        parts.append(f"{req.cpu_milli / 1000:g} CPU")
    if req.memory:
        parts.append(f"{req.memory / 2**30:g}Gi memory")
    return " and ".join(parts) or "nothing"


def _shortfall(
    ps: views.PodSet,
    candidates: Sequence[views.NodeCapacity],
    free: Mapping[str, views.Resources],
    *,
    several: bool,
) -> str:
    """Say in words why a pod set does not fit: what it needs, which healthy nodes have it,
    and which nodes of its flavor are unhealthy and why."""
    req, count = ps.requests, ps.count
    flavor = "/".join(ps.flavors)
    where = f"on healthy nodes of flavor {flavor}" if flavor else "on healthy nodes"
    whole_nodes = req.gpus > 0 and all(n.allocatable.gpus < 2 * req.gpus for n in candidates)
    if whole_nodes:
        need = f"needs {count} {_plural(count, 'node', 'nodes')} with {req.gpus} free GPUs"
    elif req.gpus > 0:
        need = f"needs room for {count} {_plural(count, 'pod', 'pods')} of {req.gpus} GPUs"
    else:
        need = f"needs room for {count} {_plural(count, 'pod', 'pods')} of {_size(req)}"
    head = f"pod set {ps.name} {need}" if several else need
    healthy = [n for n in candidates if n.healthy]
    roomy = sorted(n.name for n in healthy if _slots(free[n.name], req, count) > 0)
    slots = sum(_slots(free[n.name], req, count) for n in healthy)
    if not candidates:
        return f"{head} {where}; no node matches the flavor's labels and the pod's selector"
    if not roomy:
        have = f"; no healthy node has {'them' if whole_nodes else 'room'}"
    elif whole_nodes and slots < count:
        have = (f"; only {len(roomy)} healthy {_plural(len(roomy), 'node has', 'nodes have')}"
                f" them: {_names(roomy)}")  # fmt: skip
    elif slots < count:
        have = f"; healthy nodes have room for only {slots}: {_names(roomy)}"
    else:
        have = f"; with the other pod sets it does not fit on {_names(roomy)}"
    sick = sorted((n.name, n.problem) for n in candidates if not n.healthy)
    if sick:
        listed = _names([f"{name} {why}" for name, why in sick])
        have += f" ({len(sick)} unhealthy: {listed})"
    fenced = [(n.name, n.fenced) for n in candidates if n.healthy and n.fenced]
    if fenced:
        count = sum(len(f) for _, f in fenced)
        listed = _names([_devices_of(name, devs) for name, devs in fenced])
        have += f" ({count} {_plural(count, 'GPU', 'GPUs')} not usable: {listed})"
    return f"{head} {where}{have}"


def _devices_of(node: str, devices: Sequence[tuple[str, str]]) -> str:
    """`d0 gpu-1, gpu-4 tainted; gpu-6 faulty`: one node's unusable devices, by why."""
    by_why: dict[str, list[str]] = {}
    for name, why in devices:
        by_why.setdefault(why, []).append(name)
    return f"{node} " + "; ".join(f"{', '.join(names)} {why}" for why, names in by_why.items())


def _fit(
    workload: views.Workload, fleet: _Fleet, free: _Free
) -> tuple[bool, str, tuple[tuple[str, views.Resources], ...]]:
    """Pack every pod set of the Workload on healthy nodes; say where, or why not."""
    pods = [
        _Pod(ps.name, ps.requests, fleet.candidates(ps)[1])
        for ps in workload.pod_sets
        for _ in range(ps.count)
    ]
    placed, failed = _pack(pods, free)
    if failed is not None:
        ps = next(p for p in workload.pod_sets if p.name == failed)
        several = len(workload.pod_sets) > 1
        return False, _shortfall(ps, fleet.candidates(ps)[0], free.rooms, several=several), ()
    used = sorted({node for node, _ in placed})
    flavor_names = sorted({f for ps in workload.pod_sets for f in ps.flavors})
    of = f" of flavor {'/'.join(flavor_names)}" if flavor_names else ""
    message = f"fits on healthy nodes{of}: {_names(used)}" if used else "fits (no pods to place)"
    return True, message, tuple(placed)


def _fencing(workload: views.Workload, pods: _Pods) -> str:
    """The Pending message while pods of an earlier attempt still run ('' when none do).
    Pods that ended (Succeeded/Failed) run nothing: an ended attempt kept for its logs must
    not hold back a resume."""
    if not workload.run or workload.attempt is None:
        return ""
    earlier = sorted(
        (p.attempt, p.name)
        for p in pods.of_run(workload.namespace, workload.run)
        if p.attempt is not None and p.attempt < workload.attempt and not p.terminal
    )
    if not earlier:
        return ""
    last = max(a for a, _ in earlier)
    names = [name for a, name in earlier if a == last]
    return f"waiting for attempt {last}'s pods to end: {_names(names)}"


def decide(
    workload: views.Workload,
    nodes: Sequence[views.NodeCapacity],
    flavors: Mapping[str, views.Flavor],
    earlier_attempt_pods: Iterable[views.PodUsage],
    now: dt.datetime,
    *,
    check: str = marks.DEFAULT_ADMISSION_CHECK,
    retry_after_s: float = views.DEFAULT_RETRY_AFTER_S,
) -> Decision | None:
    """Decide our check's state for one Workload; None means write nothing.

    `nodes` carry their usage (`with_usage`); `earlier_attempt_pods` may hold any pods: only
    the non-terminal ones of earlier attempts of the Workload's run count (fencing).
    """
    free = _Free({n.name: n.free for n in nodes})
    return _decide(workload, _Fleet(nodes, flavors), free, _Pods(earlier_attempt_pods), now,
                   check=check, retry_after_s=retry_after_s)  # fmt: skip


def _decide(
    workload: views.Workload,
    fleet: _Fleet,
    free: _Free,
    pods: _Pods,
    now: dt.datetime,
    *,
    check: str,
    retry_after_s: float,
) -> Decision | None:
    """`decide` on a pass's nodes: `free` is what each has left."""
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
    fenced = _fencing(workload, pods)
    placement: tuple[tuple[str, views.Resources], ...] = ()
    after: int | None = None
    if fenced:
        state, message = views.CheckState.PENDING, fenced
    else:
        fits, message, placement = _fit(workload, fleet, free)
        state = views.CheckState.READY if fits else views.CheckState.RETRY
        after = None if fits else math.ceil(retry_after_s)
    if state == ours.state and message == ours.message:
        return None
    since = now if state != ours.state or ours.last_transition is None else ours.last_transition
    return Decision(state, message, after, since, placement)


def _claims(workload: views.Workload, pods: _Pods, fleet: _Fleet, free: _Free) -> None:
    """Reserve room for the pods of a passed Workload that are not bound yet (best effort:
    a pod that fits nowhere claims nothing). Pods are matched by the template's labels."""
    waiting: list[_Pod] = []
    for ps in workload.pod_sets:
        if not ps.labels:
            continue  # cannot tell its pods apart: assume they are bound and counted
        pod = _Pod(ps.name, ps.requests, fleet.candidates(ps)[1])
        waiting += [pod] * max(0, ps.count - pods.started(workload, ps))
    for pod in waiting:
        free.take(_pack([pod], free)[0])


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
) -> dict[tuple[str, str], Decision]:
    """Decide every Workload of one pass, keyed by (namespace, name).

    `nodes` come without usage: the pods' requests are added here. Admitted (or already
    passed) Workloads whose pods are not bound yet claim their room first; then the
    Workloads waiting on our check are decided in Kueue's order (priority, then age), each
    Ready one claiming its nodes, so one pass never promises the same GPUs twice. `queues`
    limits the pass to Workloads admitted through those ClusterQueues (None: any).

    A pass costs its nodes and pods once, plus each Workload's candidate nodes: the nodes
    a pod set shape may use are worked out once (`_Fleet`), what is left on each node is
    one map the Workloads take from, kept in order so the tightest fit is found without a
    walk of all (`_Free`), and pods are looked up by run and by label (`_Pods`).
    """
    used = views.usage(pods)
    fleet = _Fleet(nodes, flavors)
    index = _Pods(pods)
    free = _Free({n.name: n.free - used[n.name] if n.name in used else n.free for n in nodes})
    out: dict[tuple[str, str], Decision] = {}
    passed = sorted(
        (w for w in workloads if w.holds_capacity(check)),
        key=lambda w: (-w.priority, w.created or now, w.namespace, w.name),
    )
    for w in passed:
        if not _rechecked(w, index, queues, check=check):
            _claims(w, index, fleet, free)
            continue
        fits, message, placement = _fit(w, fleet, free)
        if fits:
            free.take(placement)
        else:
            out[(w.namespace, w.name)] = Decision(
                views.CheckState.RETRY,
                f"quota released before its pods started: {message}",
                math.ceil(retry_after_s),
                now,
            )
    waiting = [
        w
        for w in workloads
        if w.check(check) is not None and (queues is None or w.cluster_queue in queues)
    ]
    waiting.sort(key=lambda w: (-w.priority, w.created or now, w.namespace, w.name))
    for w in waiting:
        decision = _decide(w, fleet, free, index, now, check=check,
                           retry_after_s=retry_after_s)  # fmt: skip
        if decision is None:
            continue
        out[(w.namespace, w.name)] = decision
        free.take(decision.placement)
    return out


def _rechecked(
    w: views.Workload,
    pods: _Pods,
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
    return not any(pods.started(w, ps) > 0 for ps in w.pod_sets)
