"""When the GPU pods of a quarantined node are evicted again: the pacing of eviction rounds.

The policy returns `EvictGpuPods` on every pass while a node's eviction is due, and a node
with something to do is judged on every pass (`passes.Ledger.pending`), so without pacing a
round (a pod list of the node, an Eviction per GPU pod) ran on every pass: each second, and on
every poke, for as long as the node stayed quarantined, which may be days for a fault that
clears only by hand. Rounds are paced instead:

- the first round on a node (of this leader) runs at once;
- after a round that left pods behind (a PodDisruptionBudget answered 429, a conflict 409, or
  an error), the next one runs `retry_s` later (`evictionRetryS`, 5 s as `kubectl drain`);
- after a round that left nothing, the next one, a sweep for a pod that tolerated the taint
  and landed meanwhile, runs `sweep_s` later (the full pass's interval).

A node whose quarantine ended is forgotten (`keep_only`), so a later quarantine starts at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection


@dataclasses.dataclass(slots=True)
class Rounds:
    """When each quarantined node's next eviction round may run (pure: `now` passed in)."""

    retry_s: float
    """Seconds after a round that left pods behind."""
    sweep_s: float
    """Seconds after a round that left nothing."""
    next_at: dict[str, dt.datetime] = dataclasses.field(default_factory=dict)

    def due(self, node: str, now: dt.datetime) -> bool:
        """Whether a round on `node` may run now."""
        at = self.next_at.get(node)
        return at is None or now >= at

    def ran(self, node: str, now: dt.datetime, *, left_pods: bool) -> None:
        """Record a round on `node` at `now`; `left_pods`: some pod was not evicted."""
        wait = self.retry_s if left_pods else self.sweep_s
        self.next_at[node] = now + dt.timedelta(seconds=wait)

    def keep_only(self, quarantined: Collection[str]) -> None:
        """Forget the nodes no longer quarantined."""
        for node in [n for n in self.next_at if n not in quarantined]:
            del self.next_at[node]

    def next_due(self, now: dt.datetime) -> dt.datetime | None:
        """The earliest round still to come after `now`, if any."""
        later = [at for at in self.next_at.values() if at > now]
        return min(later) if later else None
