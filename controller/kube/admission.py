"""The admission gate's adapter: Kueue objects, nodes and pods as raw JSON, and its writes.

Nodes, pods, ResourceClaims, Kueue's AdmissionChecks, ClusterQueues, Workloads and
ResourceFlavors and the runs' Jobs and RayJobs come from watch-fed caches
(`informer.Informer`, started by `run_caches`) once they are synced, so a pass lists none
of them; until then, and in tests without the caches running, they are listed. A Workload
or AdmissionCheck the gate wrote is shown in its cache as the write returned it
(`Informer.note`), so the next pass does not answer it again from an older copy.

Reads use `_preload_content=False` and return plain dicts, which `controller.admission.views`
parses; kubernetes_asyncio checks the HTTP status only when it preloads the content, so every
raw response goes through `read_json`, which raises on an error status.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import marks
from controller.kube import _api, informer

log = structlog.get_logger()

KUEUE = ("kueue.x-k8s.io", "v1beta2")
APPLY = "application/apply-patch+yaml"
RAYJOB = ("ray.io", "v1", "rayjobs")
RESOURCE = ("resource.k8s.io", "v1")


def trim_node(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep what `admission.views.parse_node` reads: labels, taints, the cordon, allocatable,
    and the Ready and GPUHealthy conditions."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    kept = {"Ready", marks.NODE_CONDITION}
    return {
        "metadata": {"name": meta.get("name", ""), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable") is True,
                 "taints": spec.get("taints") or []},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "conditions": [c for c in status.get("conditions") or [] if c.get("type") in kept],
        },
    }  # fmt: skip


def trim_owner(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep what `owner_labels` reads of a run's Job or RayJob: its identity and labels."""
    meta = raw.get("metadata") or {}
    return {"metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
                         "labels": meta.get("labels") or {}}}  # fmt: skip


def trim_claim(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep what `admission.dra.parse_claim` reads of a ResourceClaim: its identity, the
    driver, pool and device of each allocated device, and the consumers it is reserved for.
    A claim's other changes (its spec, conditions, managed fields) then leave the cached copy
    as it was, so the gate does not parse it again."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    out: dict[str, Any] = {
        "metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", "")}
    }
    allocation = status.get("allocation") if isinstance(status, dict) else None
    if isinstance(allocation, dict) and allocation:
        found = allocation.get("devices")
        results = found.get("results") if isinstance(found, dict) else None
        keys = ("driver", "pool", "device")
        refs = status.get("reservedFor")
        out["status"] = {
            "allocation": {"devices": {"results": [
                {k: r[k] for k in keys if k in r}
                for r in (results if isinstance(results, list) else []) if isinstance(r, dict)
            ]}},
            "reservedFor": [
                {k: ref[k] for k in ("apiGroup", "resource", "name") if k in ref}
                for ref in (refs if isinstance(refs, list) else []) if isinstance(ref, dict)
            ],
        }  # fmt: skip
    return out


CACHED_KUEUE = ("admissionchecks", "clusterqueues", "workloads", "resourceflavors")
"""The Kueue plurals the gate reads, served from caches."""


def trim_pod(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep what `admission.views.parse_pod` reads: identity, labels, the node, the phase and
    each container's resources (init containers and the overhead too)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}

    def resources(containers: Any) -> list[dict[str, Any]]:
        return [{"resources": c.get("resources") or {}} for c in containers or []]

    out_spec: dict[str, Any] = {
        "nodeName": spec.get("nodeName") or "",
        "containers": resources(spec.get("containers")),
    }
    if spec.get("initContainers"):
        out_spec["initContainers"] = resources(spec.get("initContainers"))
    if spec.get("overhead"):
        out_spec["overhead"] = spec["overhead"]
    return {
        "metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
                     "labels": meta.get("labels") or {}},
        "spec": out_spec,
        "status": {"phase": (raw.get("status") or {}).get("phase") or "Pending"},
    }  # fmt: skip


class AdmissionStore:
    """Every API call the admission gate makes."""

    def __init__(self, api: client.ApiClient, component: str = "taugrid-controller") -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self.events = _api.EventRecorder(
            api, controller=marks.ADMISSION_EVENT_CONTROLLER, instance=component
        )
        self.component = component
        self.nodes: informer.Informer[Any] = informer.Informer(
            self._core.list_node, trim_node, kind="nodes"
        )
        self.pods: informer.Informer[Any] = informer.Informer(
            self._core.list_pod_for_all_namespaces, trim_pod, kind="pods"
        )
        self.claims: informer.Informer[Any] = informer.Informer(
            functools.partial(self._custom.list_cluster_custom_object, *RESOURCE,
                              "resourceclaims"),
            trim_claim, kind="resourceclaims", optional=True,
        )  # fmt: skip
        """ResourceClaims: a cluster that serves no `resource.k8s.io/v1` has none."""
        self.kueue: dict[str, informer.Informer[Any]] = {
            plural: informer.Informer(
                functools.partial(self._custom.list_cluster_custom_object, *KUEUE, plural),
                informer.trim_object, kind=plural,
            )
            for plural in CACHED_KUEUE
        }  # fmt: skip
        """AdmissionChecks, ClusterQueues, Workloads and ResourceFlavors."""
        self.owners: dict[str, informer.Informer[informer.Raw]] = {
            "Job": informer.Informer(
                functools.partial(self._batch.list_job_for_all_namespaces,
                                  label_selector=marks.RUN_LABEL),
                trim_owner, kind="run jobs (labels)"),
            "RayJob": informer.Informer(
                functools.partial(self._custom.list_cluster_custom_object, *RAYJOB,
                                  label_selector=marks.RUN_LABEL),
                trim_owner, kind="run rayjobs (labels)", optional=True),
        }  # fmt: skip

    async def run_caches(self) -> None:
        """Keep the caches current until cancelled (the gate subscribes to their changes)."""
        caches = [self.nodes, self.pods, self.claims, *self.kueue.values(), *self.owners.values()]
        await asyncio.gather(*(c.run() for c in caches))

    # ------------------------------------------------------------------ reads
    async def get_admission_check(self, name: str) -> dict[str, Any] | None:
        """Return an AdmissionCheck, None when it does not exist: from the cache once it is
        synced, else read."""
        cache = self.kueue["admissionchecks"]
        if cache.synced.is_set():
            return cache.items.get(name)
        return await _api.json_or_none(
            self._custom.get_cluster_custom_object(
                *KUEUE, "admissionchecks", name, _preload_content=False
            )
        )

    async def list_kueue(self, plural: str) -> list[dict[str, Any]]:
        """Every Workload, ClusterQueue or ResourceFlavor (`Informer.current`)."""
        return await self.kueue[plural].current()

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Every node (`Informer.current`)."""
        return await self.nodes.current()

    async def list_pods(self) -> list[dict[str, Any]]:
        """Every pod (`Informer.current`)."""
        return await self.pods.current()

    async def list_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim (`Informer.current`; none where the cluster serves no
        `resource.k8s.io/v1`)."""
        return await self.claims.current()

    async def claim_views(self) -> list[Any] | None:
        """Every ResourceClaim as the gate's parser reads it, listed and parsed now; None once
        the cache is synced (the gate then counts the changes it tells). None are listed where
        the cluster serves no `resource.k8s.io/v1`."""
        return None if self.claims.synced.is_set() else await self.claims.current_views()

    async def owner_labels(self) -> dict[tuple[str, str, str], dict[str, str]]:
        """Labels of every run's Job and RayJob, keyed by (namespace, kind, name): they name
        the run and attempt of the Workload Kueue made for them (from the caches once
        synced, else listed; no RayJobs without KubeRay)."""
        out: dict[tuple[str, str, str], dict[str, str]] = {}
        for kind, cache in self.owners.items():
            for item in await cache.current():
                meta = item.get("metadata") or {}
                key = (str(meta.get("namespace", "")), kind, str(meta.get("name", "")))
                out[key] = dict(meta.get("labels") or {})
        return out

    # ------------------------------------------------------------------ writes
    async def apply_check_state(
        self, namespace: str, name: str, resource_version: str, state: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Apply our entry of a Workload's `status.admissionChecks`, on the condition that the
        Workload is still at `resource_version`; None on a conflict (changed since) or when
        it is gone."""
        body = {
            "apiVersion": "/".join(KUEUE),
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace,
                         "resourceVersion": resource_version},
            "status": {"admissionChecks": [dict(state)]},
        }  # fmt: skip
        written = await _api.json_or_none(self._custom.patch_namespaced_custom_object_status(
            *KUEUE, namespace, "workloads", name, body,
            field_manager=marks.ADMISSION_FIELD_MANAGER, force=True, _content_type=APPLY,
            _preload_content=False,
        ), absent=(404, 409))  # fmt: skip
        if written is not None:
            self.kueue["workloads"].note(written)
        return written

    async def apply_active(self, name: str, condition: Mapping[str, Any]) -> dict[str, Any] | None:
        """Apply the `Active` condition on an AdmissionCheck; None when it is gone."""
        body = {
            "apiVersion": "/".join(KUEUE),
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [dict(condition)]},
        }
        written = await _api.json_or_none(self._custom.patch_cluster_custom_object_status(
            *KUEUE, "admissionchecks", name, body,
            field_manager=marks.ADMISSION_FIELD_MANAGER, force=True, _content_type=APPLY,
            _preload_content=False,
        ))  # fmt: skip
        if written is not None:
            self.kueue["admissionchecks"].note(written)
        return written

    async def workload_event(
        self, namespace: str, name: str, uid: str, reason: str, note: str, *, warning: bool
    ) -> None:
        """Record an Event on a Workload (best effort: never blocks a decision)."""
        regarding = {"apiVersion": "/".join(KUEUE), "kind": "Workload",
                     "name": name, "namespace": namespace, "uid": uid}  # fmt: skip
        await self.events.emit(namespace, regarding, reason, note, warning=warning)
