"""A run's objects on the cluster: the one executor of the run decision's plan.

It carries a `plans.RunPlan` out in order: the TauRun's annotations, then the logs of the
attempts that end (kept before their pods can go), then the deletes (an attempt that ended,
a finished run's objects after its TTL), then the creates (the per-run checkpoint
ConfigMap, each attempt's Job or RayJob and headless Service).
Every write checks that the lease is still held; creates tolerate a 409 and deletes a 404, so
a repeated plan is harmless (level-triggered).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from controller import leading
from controller.runs import objects, plans


class ObjectStore(Protocol):
    """The writes the executor makes (`controller.kube.runs.RunStore` implements them)."""

    async def annotate_run(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any] | None:
        """Merge annotations into a TauRun; None when it is gone."""
        ...

    async def create(self, obj: dict[str, Any]) -> bool:
        """Create an object; False when it already exists as the run's; errors.NameTaken
        when one of that name is somebody else's."""
        ...

    async def delete(self, kind: str, namespace: str, name: str, *, owner_uid: str) -> bool:
        """Delete an object with its dependents if it is the run `owner_uid`'s; False when
        it is gone or not the run's."""
        ...


class Attempts:
    """Carry plans out; see the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        elector: leading.Elector,
        keep_logs: Callable[[objects.RunRef, Sequence[int]], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.elector = elector
        self.keep_logs = keep_logs
        """Keeps the workers' logs of attempts (the log keeper's `keep_final`)."""

    async def apply(self, ref: objects.RunRef, plan: plans.RunPlan) -> dict[str, Any] | None:
        """Write the plan's annotations, keep its logs, then its deletes and creates, in that
        order; return the TauRun when its annotations were written (else None)."""
        namespace, name = ref.namespace, ref.name
        updated = None
        if plan.annotations:
            self.elector.ensure_leader()
            updated = await self.store.annotate_run(namespace, name, dict(plan.annotations))
        if plan.keep_logs and self.keep_logs is not None:
            await self.keep_logs(ref, plan.keep_logs)
        for gone in plan.deletes:
            self.elector.ensure_leader()
            await self.store.delete(gone.kind, gone.namespace, gone.name, owner_uid=ref.uid)
        for obj in plan.creates:
            self.elector.ensure_leader()
            await self.store.create(obj)
        return updated
