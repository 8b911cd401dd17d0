"""Quarantine passes that cost what changed: the node policy applied to the nodes whose
inputs changed or whose deadline came, deciding exactly what the full pass would.

`policy.decide` judges every node on every pass. Most nodes of a big fleet are healthy and
were already judged: their decision cannot change until one of their inputs does (a
heartbeat that changes something, `FleetState.take_changed`; a Node that changed in the
cache; device quarantine taking a node in or out of its scope) or until a time their last
judgement named comes (staleness, the silence that quarantines, the eviction deadline, the
healthy streak that releases). `decide_changed` judges exactly those, plus every node that
had something to do on the last pass (an action not yet seen on its Node, a quarantine held
back), since only those can be touched by the fleet-wide terms: the breaker holds back
candidates and evictions, and maxQuarantined ranks candidates.

The fleet-wide terms stay exact: the `Ledger` keeps, for every judged node, the few facts
they are made of (quarantined by us, contained, when it turned bad), updated whenever the
node is judged, and the counts over them. A change of what every node is judged against
(the settings, the leader's warm-up start) judges every node again; so does the caller's
`everything` (the safety-net pass on a slow timer, level-triggered like before).

What the incremental pass returns for a node it did not judge is what it learnt last time:
the `health` of such a node carries its last receipt time, and its staleness deadline may
be an earlier one than the latest heartbeat set (the node is judged then, found fresh, and
scheduled again), so `next_deadline` is never later than the full pass's and may be earlier.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import datetime as dt
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from controller.fleet import actions, nodes, policy, state


@dataclasses.dataclass(frozen=True, slots=True)
class Facts:
    """What the fleet-wide terms need of one judged node."""

    state: state.NodeState
    quarantined: bool
    """In any quarantine of ours (what the quarantined-nodes gauge shows)."""
    auto_quarantined: bool
    """In an automatic quarantine (what maxQuarantined counts)."""
    contained: bool
    """Gives an open breaker no reason to stay open."""
    turned_at: dt.datetime | None
    """When it turned bad or silent, as the breaker's window counts it."""


class Ledger:
    """The memory of `decide_changed` between passes: the facts of every judged node, the
    counts over them, who is due when, and who had something to do.

    Mutable for the same reason as `FleetState`: copying it per pass would cost the fleet.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next pass judges every node."""
        self.facts: dict[str, Facts] = {}
        self.health: dict[str, state.NodeHealth] = {}
        """Each judged node's health when it was last judged."""
        self.pending: set[str] = set()
        """Nodes the next pass judges whatever happens: those that had actions (carried out,
        or held back) on the last pass, and those with a deadline at that pass's instant."""
        self.states: collections.Counter[state.NodeState] = collections.Counter()
        self.quarantined = 0
        self.auto_quarantined = 0
        self.uncontained = 0
        self.basis: tuple[object, ...] | None = None
        """What every node was judged against: the settings and the warm-up's start."""
        self.device_scope: frozenset[str] = frozenset()
        self.device_nodes: frozenset[str] = frozenset()
        self.judged: list[str] = []
        """The nodes the last pass judged (sorted), counted nodes only."""
        self._due: dict[str, dt.datetime] = {}
        self._heap: list[tuple[dt.datetime, str]] = []
        self._turned: list[tuple[dt.datetime, str]] = []
        """(turned_at, node) of every node that turned bad, sorted."""

    def __len__(self) -> int:
        return len(self.facts)

    def put(self, name: str, facts: Facts, health: state.NodeHealth) -> None:
        """Record one node's facts from its judgement now."""
        self.drop(name)
        self.facts[name] = facts
        self.health[name] = health
        self.states[facts.state] += 1
        self.quarantined += facts.quarantined
        self.auto_quarantined += facts.auto_quarantined
        self.uncontained += not facts.contained
        if facts.turned_at is not None:
            bisect.insort(self._turned, (facts.turned_at, name))

    def drop(self, name: str) -> None:
        """Forget one node (gone from the cache, or no longer judged)."""
        old = self.facts.pop(name, None)
        self.health.pop(name, None)
        self._due.pop(name, None)
        if old is None:
            return
        self.states[old.state] -= 1
        self.quarantined -= old.quarantined
        self.auto_quarantined -= old.auto_quarantined
        self.uncontained -= not old.contained
        if old.turned_at is not None:
            index = bisect.bisect_left(self._turned, (old.turned_at, name))
            del self._turned[index]

    def turned_after(self, after: dt.datetime) -> list[str]:
        """The nodes (sorted by name) that turned bad or silent after `after`."""
        start = bisect.bisect_right(self._turned, after, key=lambda item: item[0])
        return sorted(name for _, name in self._turned[start:])

    def schedule(self, name: str, when: dt.datetime | None) -> None:
        """Judge the node again at `when` (None: only when its inputs change)."""
        if when is None:
            self._due.pop(name, None)
            return
        self._due[name] = when
        heapq.heappush(self._heap, (when, name))

    def take_due(self, now: dt.datetime) -> set[str]:
        """The nodes whose deadline is at or before `now` (each is unscheduled)."""
        due: set[str] = set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, name = heapq.heappop(heap)
            if self._due.get(name) == when:
                del self._due[name]
                due.add(name)
        return due

    def next_due(self) -> dt.datetime | None:
        """The earliest deadline scheduled (entries superseded since are skipped); after a
        pass, every one is later than its `now`."""
        heap = self._heap
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


def facts_of(view: nodes.NodeView, h: state.NodeHealth, *, in_device_scope: bool) -> Facts:
    """The fleet-wide facts of one node judged now."""
    return Facts(
        state=h.state,
        quarantined=view.quarantine is not None,
        auto_quarantined=policy.auto_quarantined(view),
        contained=policy.contained(view, h, in_device_scope=in_device_scope),
        turned_at=policy.turned_at(h, in_device_scope=in_device_scope),
    )


def decide_changed(
    fleet_state: state.FleetState,
    views: Mapping[str, nodes.NodeView],
    settings: policy.Settings,
    breaker: actions.BreakerState,
    now: dt.datetime,
    *,
    ledger: Ledger,
    changed: Iterable[str],
    device_scope: frozenset[str] = frozenset(),
    device_nodes: frozenset[str] = frozenset(),
    everything: bool = False,
) -> actions.Decision:
    """Judge the nodes in `changed`, those due by `now` and those with something to do
    (`views`: every node of the cache, by name), and return what `policy.decide` returns for
    the whole fleet; `ledger` is updated. `everything`: judge every node again."""
    basis = (settings, fleet_state.leader_since, fleet_state.stale_multiplier)
    if everything or ledger.basis != basis:
        ledger.reset()
        ledger.basis = basis
        names: set[str] = set(views)
    else:
        names = set(changed)
        names |= ledger.pending
        names |= ledger.take_due(now)
        names |= ledger.device_scope ^ device_scope
        names |= ledger.device_nodes ^ device_nodes
    ledger.device_scope, ledger.device_nodes = device_scope, device_nodes
    judged: list[tuple[nodes.NodeView, state.NodeHealth]] = []
    for name in sorted(names):
        view = views.get(name)
        if view is None or not policy.counts(view, fleet_state, device_nodes):
            ledger.drop(name)
            continue
        h = fleet_state.assess(name, now, default_interval_s=settings.default_interval_s)
        ledger.put(name, facts_of(view, h, in_device_scope=name in device_scope), h)
        judged.append((view, h))

    deadlines: list[dt.datetime] = []
    decided: list[actions.Action] = []
    breaker = policy.judge_breaker(
        breaker, settings, now=now, total=len(ledger), turned_after=ledger.turned_after,
        all_contained=ledger.uncontained == 0, decided=decided, deadlines=deadlines,
    )  # fmt: skip
    limit = settings.limit_for(len(ledger))
    quarantined = ledger.auto_quarantined
    candidates: list[policy.Candidate] = []
    pending: set[str] = set()
    for view, h in judged:
        found, candidate, due = policy.node_pass(
            view, h, settings, breaker, now, in_device_scope=view.name in device_scope
        )
        decided.extend(found)
        if candidate is not None:
            candidates.append(candidate)
        later = [d for d in due if d > now]
        if found or candidate is not None or len(later) < len(due):
            pending.add(view.name)  # a deadline at `now` itself falls due at the next pass
        ledger.schedule(view.name, min(later) if later else None)
    ledger.pending = pending
    ledger.judged = [view.name for view, _ in judged]
    policy.rank(candidates, budget=max(0, limit - quarantined), decided=decided)
    future = [d for d in deadlines if d > now]
    scheduled = ledger.next_due()
    if scheduled is not None and scheduled > now:
        future.append(scheduled)
    return actions.Decision(
        actions=tuple(policy.finish(decided, settings)),
        breaker=breaker,
        next_deadline=min(future) if future else None,
        health=ledger.health,
        quarantined=quarantined,
        max_quarantined=limit,
    )


_T = TypeVar("_T")

MAX_ROUTINE_NODES = 64
"""Nodes whose only write is a healthy GPUHealthy condition acted on in one pass."""

MAX_CONDITION_NODES = 128
"""Nodes whose only write is another GPUHealthy condition (a stale node's Unknown, a
degraded node's False, each with its Event) acted on in one pass."""


def routine(todo: Iterable[object]) -> bool:
    """Whether a node's actions only mark it healthy (nothing to fence, nothing bad to say):
    the first pass over a fresh fleet has this for every node."""
    todo = list(todo)
    return bool(todo) and all(
        isinstance(a, actions.SetCondition) and a.condition.status is nodes.ConditionStatus.TRUE
        for a in todo
    )


def says_only(todo: Iterable[object]) -> bool:
    """Whether a node's only write is its GPUHealthy condition: nothing to fence, put back
    or evict (an action held back by a limit writes nothing)."""
    todo = list(todo)
    return any(isinstance(a, actions.SetCondition) for a in todo) and all(
        isinstance(a, actions.SetCondition | actions.Skipped) for a in todo
    )


def urgent_first(
    by_node: Mapping[str, list[_T]],
    *,
    max_routine: int = MAX_ROUTINE_NODES,
    max_conditions: int = MAX_CONDITION_NODES,
) -> tuple[list[tuple[str, list[_T]]], int]:
    """The nodes a pass acts on, in order, and how many it leaves for the next pass.

    Every node with something to write besides its condition (a fence, a taint put back, an
    eviction) goes, first, however many; then at most `max_conditions`
    nodes that have only a condition to write other than healthy; then at most `max_routine`
    that have only a healthy one. A pass awaits its writes, so without the caps a fault that
    arrives meanwhile waits for the whole wave: the first pass over 10,000 nodes wrote
    10,000 healthy conditions (a 58 s mean on the 10,000-node bench), and a fleet that went
    stale at once wrote thousands of Unknown conditions in one 52 s pass. A node left out
    still has something to do, so the next pass judges it again (`Ledger.pending`) and
    decides the same: only when it is written changes.
    """
    urgent: list[tuple[str, list[_T]]] = []
    said: list[tuple[str, list[_T]]] = []
    healthy: list[tuple[str, list[_T]]] = []
    for n, todo in by_node.items():
        (healthy if routine(todo) else said if says_only(todo) else urgent).append((n, todo))
    left = max(0, len(said) - max_conditions) + max(0, len(healthy) - max_routine)
    return urgent + said[:max_conditions] + healthy[:max_routine], left


FENCING = (actions.Quarantine, actions.RestoreTaint, actions.FenceDevice)
"""What keeps new work off a failed GPU: a node's taint and cordon, a device's taint."""


def fencing_first(todo: Sequence[tuple[str, list[_T]]]) -> list[list[tuple[str, list[_T]]]]:
    """A pass's writes in two waves: every node's fencing first, then the rest (conditions,
    quarantine updates, evictions), each node's in the order decided, nodes in `todo`'s order.

    A node's actions run one after another (each patch is computed from the node the last
    one returned), and only so many nodes write at once; in one wave a failed node's
    GPUHealthy condition went before its taint, and held a slot while other nodes' taints
    waited: 200 nodes failing at once had their last taint behind ~400 writes instead of 200.
    """

    def fencing(action: object) -> bool:
        return isinstance(action, FENCING)

    first = [(n, [a for a in acts if fencing(a)]) for n, acts in todo]
    rest = [(n, [a for a in acts if not fencing(a)]) for n, acts in todo]
    return [[(n, acts) for n, acts in wave if acts] for wave in (first, rest)]
