"""Nodes, their GPU pods and Events: the quarantine actuator's view of the API server.

The node cache lists then watches Nodes as raw JSON and keeps only the fields the policy
reads (DESIGN.md section 9: RSS matters at 5,000 nodes), so a node costs a few hundred bytes
rather than a deserialised V1Node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import structlog
from kubernetes_asyncio import client

from controller import marks
from controller.kube import _api, informer

log = structlog.get_logger()

KEPT_CONDITIONS = frozenset({marks.NODE_CONDITION, "Ready"})


def trim_node(node: dict[str, Any]) -> dict[str, Any]:
    """Keep only what the policy, the actuator and the on-call API read."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    out_status: dict[str, Any] = {
        "conditions": [
            c for c in status.get("conditions") or [] if c.get("type") in KEPT_CONDITIONS
        ],
    }
    for part in ("capacity", "allocatable"):
        if (gpus := (status.get(part) or {}).get(marks.GPU_RESOURCE)) is not None:
            out_status[part] = {marks.GPU_RESOURCE: gpus}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
            "labels": meta.get("labels") or {},
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(marks.PREFIX)
            },
        },
        "spec": {
            "unschedulable": bool(spec.get("unschedulable")),
            "taints": spec.get("taints") or [],
        },
        "status": out_status,
    }


class NodeCache(informer.Informer[Any]):
    """List and watch the Nodes (of `label_selector`), trimmed (`trim_node`), by name: the
    informer, with our own node writes shown at once (`Informer.put`)."""

    def __init__(
        self,
        api: client.ApiClient,
        on_change: Callable[[], None],
        label_selector: str = "",
        *,
        on_delete: Callable[[str], None] = lambda _name: None,
    ) -> None:
        core = client.CoreV1Api(api)
        selector = {"label_selector": label_selector} if label_selector else {}
        super().__init__(
            functools.partial(core.list_node, **selector), trim_node, kind="nodes",
            on_change=on_change, on_delete=lambda node: on_delete(node["metadata"]["name"]),
        )  # fmt: skip

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every cached node, trimmed, by name."""
        return self.items


class EvictionOutcome:
    """Counts of one eviction round on a node."""

    def __init__(self) -> None:
        self.evicted: list[str] = []
        self.blocked: list[str] = []
        self.failed: list[str] = []
        self.evicted_pods: list[dict[str, str]] = []
        """The evicted pods as Event `regarding` references (each gets its own Event)."""


class NodePatch(Protocol):
    """One PATCH of a Node as the quarantine core builds it (`fleet.conditions.NodePatch`)."""

    @property
    def subresource(self) -> str:
        """ "status" for the status subresource, "" for the Node itself."""
        ...

    @property
    def content_type(self) -> str:
        """The patch's media type (merge or strategic merge)."""
        ...

    @property
    def body(self) -> dict[str, Any]:
        """The patch document."""
        ...


class NodeWriter:
    """Patch nodes, record Events, evict GPU pods."""

    def __init__(
        self, api: client.ApiClient, namespace: str, component: str = "taugrid-controller"
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.events = _api.EventRecorder(
            api, controller=marks.NODE_EVENT_CONTROLLER, instance=component
        )
        self.namespace = namespace

    async def read(self, name: str) -> dict[str, Any] | None:
        """The node as the API server has it now; None when it is gone."""
        try:
            resp = await self._core.read_node(name, _preload_content=False)
            return dict(await _api.read_json(resp))
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise

    async def patch(self, name: str, patch: NodePatch) -> dict[str, Any] | None:
        """Send one node patch; return the node, None on a 409 (requeue) or 404 (gone)."""
        kwargs: dict[str, Any] = {"_content_type": patch.content_type, "_preload_content": False}
        try:
            if patch.subresource == "status":
                resp = await self._core.patch_node_status(name, patch.body, **kwargs)
            else:
                resp = await self._core.patch_node(name, patch.body, **kwargs)
            return dict(await _api.read_json(resp))
        except client.ApiException as err:
            if err.status in (404, 409):
                return None
            raise

    async def event(self, node: dict[str, Any], reason: str, note: str, *, warning: bool) -> None:
        """Record a Kubernetes Event on a node (best effort: never blocks an action)."""
        meta = node.get("metadata") or {}
        regarding = {"apiVersion": "v1", "kind": "Node", "name": meta.get("name", ""),
                     "uid": meta.get("uid", "")}  # fmt: skip
        await self.events.emit("default", regarding, reason, note, warning=warning)

    async def pod_event(self, pod: dict[str, str], reason: str, note: str) -> None:
        """Record a Warning Event on one pod in its own namespace (best effort).

        A node's Event lives in `default`, readable by more people than any one tenant's
        namespace, so what happened to a tenant's pod is told only there (review 3, finding 4).
        """
        await self.events.emit(pod["namespace"], pod, reason, note, warning=True)

    async def breaker_event(self, lease_name: str, reason: str, note: str) -> None:
        """Record a fleet-level Event (the breaker) on the controller's Lease."""
        regarding = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "name": lease_name, "namespace": self.namespace}  # fmt: skip
        await self.events.emit(self.namespace, regarding, reason, note, warning=True)

    async def gpu_pods(self, node: str) -> list[dict[str, Any]]:
        """Pods bound to the node that request GPUs, DaemonSet pods excluded."""
        resp = await self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        data = await _api.read_json(resp)
        return [pod for pod in data.get("items") or [] if _evictable(pod)]

    async def evict_gpu_pods(self, node: str) -> EvictionOutcome:
        """Evict every GPU pod on the node through the Eviction API (PDBs honoured)."""
        outcome = EvictionOutcome()
        for pod in await self.gpu_pods(node):
            meta = pod["metadata"]
            ref = f"{meta['namespace']}/{meta['name']}"
            body = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
            try:
                await self._core.create_namespaced_pod_eviction(
                    meta["name"], meta["namespace"], body
                )
                outcome.evicted.append(ref)
                outcome.evicted_pods.append(
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                     "namespace": meta["namespace"], "uid": meta.get("uid", "")}
                )  # fmt: skip
            except client.ApiException as err:
                if err.status == 404:
                    continue
                if err.status in (409, 429):
                    outcome.blocked.append(ref)
                else:
                    outcome.failed.append(f"{ref}: HTTP {err.status}")
        return outcome


def _evictable(pod: dict[str, Any]) -> bool:
    """A pod that asks for GPUs, runs, is not being deleted and is no DaemonSet's."""
    meta = pod["metadata"]
    return (
        not any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])
        and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        and not meta.get("deletionTimestamp")
        and _requests_gpu(pod)
    )


def _requests_gpu(pod: dict[str, Any]) -> bool:
    """Whether the pod asks for GPUs: the device plugin's resource, or DRA claims (on a DRA
    node its GPUs come through claims; other DRA devices are rare enough to count too)."""
    if (pod.get("spec") or {}).get("resourceClaims"):
        return True
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            value = (res.get(part) or {}).get(marks.GPU_RESOURCE)
            if value not in (None, "0", 0):
                return True
    return False


def trim_install_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod of the install namespace as `AgentPods` keeps it: its UID and its IP."""
    return {"uid": _uid_of(pod), "ip": str((pod.get("status") or {}).get("podIP") or "")}


def _uid_of(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


class AgentPods:
    """The install namespace's pods (the agents and the controller replicas) by UID, from a
    list-then-watch.

    Two uses. The IP of each pod an agent token is bound to is the address the on-call API
    shows as a node's `agentUrl` (DESIGN.md section 10: derived by the controller, never taken
    from a heartbeat). And a pod's deletion is seen at once (`on_gone(uid)`): the
    authenticator then forgets the tokens bound to that pod, so it can keep their reviews as
    long as any other token's instead of re-reviewing every agent each minute (review L7;
    170 TokenReviews/s at 10,000 agents).

    A heartbeat never waits for it: until the first LIST is in, a pod is unknown (None, not
    alive) and its next heartbeat finds it (a 1,000-node bench once saw its fault reports
    wait ~1 s behind a LIST made on demand).
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        on_gone: Callable[[str], None] = lambda _uid: None,
    ) -> None:
        core = client.CoreV1Api(api)
        self.pods: informer.Informer[informer.Raw] = informer.Informer(
            functools.partial(core.list_namespaced_pod, namespace), trim_install_pod,
            kind="install-namespace pods", key=_uid_of,
            on_delete=lambda pod: on_gone(str(pod["uid"])),
        )  # fmt: skip

    async def run(self) -> None:
        """Keep the pods current until cancelled."""
        await self.pods.run()

    def ip_of(self, uid: str) -> str | None:
        """The pod's IP, None when it is not known (yet) or has none."""
        pod = self.pods.items.get(uid) if uid else None
        return str(pod["ip"]) or None if pod else None

    def alive(self, uid: str) -> bool:
        """Whether the pod exists as of the watch (False before the first LIST)."""
        return bool(uid) and self.pods.synced.is_set() and uid in self.pods.items
