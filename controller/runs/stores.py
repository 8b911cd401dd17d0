"""What the run reconciler needs of the API server (`controller.kube.runs.RunStore` is the
real one; the unit tests' store is in memory)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from controller.kube import informer
from controller.runs import attempts


class RunReads(Protocol):
    """The reads of every run's objects that the reconciler and the log keeper make."""

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every TauRun (of a namespace)."""
        ...

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Jobs, RayJobs or Pods with a label selector, every namespace."""
        ...


class RunStore(RunReads, attempts.ObjectStore, Protocol):
    """What the reconciler reads and writes (`controller.kube.runs.RunStore` implements it)."""

    async def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A TauRun, None when it does not exist."""
        ...

    async def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch a TauRun's status; None when it is gone."""
        ...

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Kueue objects of one plural (of a namespace)."""
        ...

    async def list_nodes(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Nodes (metadata), all or the named ones."""
        ...

    async def pending_workloads(
        self, namespace: str, local_queue: str
    ) -> list[dict[str, Any]] | None:
        """Kueue's visibility API for a LocalQueue; None when it does not answer."""
        ...

    async def write_configmap(self, body: dict[str, Any]) -> None:
        """Merge a ConfigMap's data, creating it when missing."""
        ...


@runtime_checkable
class ChangeFeed(Protocol):
    """A store whose caches tell their changes (`controller.kube.runs.RunStore`)."""

    def subscribe(self, handler: Callable[[str, informer.Change[Any]], None]) -> None:
        """Tell `handler` each change, with the name of the cache it came from."""
        ...

    def parse_workloads_with(self, view: Callable[[dict[str, Any]], Any]) -> None:
        """Keep each cached Workload parsed by `view`."""
        ...

    def workload_views(self) -> list[Any] | None:
        """The cached Workloads' views; None until the cache is synced."""
        ...

    @property
    def synced(self) -> bool:
        """Whether every cache is synced (and so tells every change)."""
        ...
