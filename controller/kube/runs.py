"""TauRuns and what they own, as raw JSON: the run reconciler's and the run API's adapter.

Reads use `_preload_content=False` and return plain dicts (no deserialised V1 models: the
pure code in `controller.runs` reads the few fields it needs). Creates tolerate 409 (the
object exists: level-triggered callers simply go on) and deletes tolerate 404 (gone is done).

What the reconciler lists on every pass (TauRuns, the run-labelled Jobs, RayJobs and Pods,
Kueue's Workloads, LocalQueues and WorkloadPriorityClasses, and the nodes' quarantine
annotations) comes from watch-fed caches (`informer.Informer`, kept by `run_caches` while
this replica leads) once they are synced; before that, and for a store whose caches do not
run (the run API's), the same calls list. What must be fresh stays a direct read (`get_run`,
`read_object`, `list_pods`). Our own writes are shown in the caches as they return
(`Informer.note`), so a pass never reads a copy older than what this replica wrote.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import errors, marks
from controller.kube import _api, informer, runlogs, selectors
from controller.kube.refusals import (
    ConflictError,
    NotFoundError,
    RejectedError,
    api_status,
    refusal,
)

log = structlog.get_logger()

TAURUN = ("taugrid.dev", "v1alpha1", "tauruns")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RAYJOB = ("ray.io", "v1", "rayjobs")
CLAIM_TEMPLATES = ("resource.k8s.io", "v1", "resourceclaimtemplates")
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")
NODE_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept header asking the API server for object metadata only."""
NODE_METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Accept header of a metadata-only watch (each event's object is one PartialObjectMetadata)."""
NODE_ANNOTATIONS = (marks.QUARANTINED_BY_ANNOTATION, marks.QUARANTINE_ANNOTATION)
"""The node annotations the reconciler reads (`views.node_facts`): all the node cache keeps."""
CACHED_KUEUE = ("workloads", "localqueues", "workloadpriorityclasses")
"""The Kueue plurals the reconciler lists every pass, served from caches."""
VISIBILITY_RETRY_S = 60.0
"""After the visibility API fails, use the computed fallback this long before asking again."""


def trim_run(raw: dict[str, Any]) -> dict[str, Any]:
    """A TauRun as the reconciler and the log keeper read it: `informer.trim_object`, and
    without `status.results` (the pods' reports: up to most of a run's bytes), which they
    never read (`records.read(..., results=False)`); the results collector reads the run
    fresh (`get_run`)."""
    out = informer.trim_object(raw)
    status = out.get("status")
    if isinstance(status, dict) and "results" in status:
        out["status"] = {k: v for k, v in status.items() if k != "results"}
    return out


def trim_node(raw: dict[str, Any]) -> dict[str, Any]:
    """A node as the reconciler reads it: its name and quarantine annotations, nothing else
    (so a node's other changes, its heartbeats among them, change nothing a reader sees)."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kept = {k: annotations[k] for k in NODE_ANNOTATIONS if k in annotations}
    return {"metadata": {"name": str(meta.get("name") or ""), "annotations": kept}}


def _kind_trim(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """`informer.trim_object`, stamping the kind (a list's items carry none; readers
    index by it)."""

    def trim(raw: dict[str, Any]) -> dict[str, Any]:
        return {**informer.trim_object(raw), "kind": kind}

    return trim


class RunStore(runlogs.RunLogs):
    """Every API call the run reconciler and the run API make."""

    def __init__(self, api: client.ApiClient, *, streams: client.ApiClient | None = None) -> None:
        """Calls go through `api`; log streams through `streams` when given, a client whose
        pool they have to themselves (a stream holds its connection while it lasts)."""
        self.api = api
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._networking = client.NetworkingV1Api(api)
        self._logs = client.CoreV1Api(streams or api)
        self._visibility_down_until = 0.0
        self._on_change: Callable[[], None] = lambda: None
        labelled = marks.RUN_LABEL
        self.runs = self._cache(
            functools.partial(self._custom.list_cluster_custom_object, *TAURUN),
            trim_run, "tauruns",
        )  # fmt: skip
        self.labelled = {
            "Job": self._cache(functools.partial(
                self._batch.list_job_for_all_namespaces, label_selector=labelled),
                _kind_trim("Job"), "run jobs"),
            "RayJob": self._cache(functools.partial(
                self._custom.list_cluster_custom_object, *RAYJOB, label_selector=labelled),
                _kind_trim("RayJob"), "run rayjobs", optional=True),
            "Pod": self._cache(functools.partial(
                self._core.list_pod_for_all_namespaces, label_selector=labelled),
                _kind_trim("Pod"), "run pods"),
        }  # fmt: skip
        """The objects carrying `marks.RUN_LABEL`, by kind."""
        self.kueue = {
            plural: self._cache(
                functools.partial(self._custom.list_cluster_custom_object, *KUEUE, plural),
                informer.trim_object,
                plural,
                optional=plural == "workloadpriorityclasses",  # without: resumes go unboosted
            )
            for plural in CACHED_KUEUE
        }
        self.nodes = self._cache(self._node_metadata, trim_node, "node metadata")
        self._caches = [self.runs, *self.labelled.values(), *self.kueue.values(), self.nodes]

    def _cache(
        self,
        call: informer.ListCall,
        trim: Callable[[dict[str, Any]], dict[str, Any]],
        kind: str,
        *,
        optional: bool = False,
    ) -> informer.Informer[Any]:
        return informer.Informer(call, trim, kind=kind, on_change=self._changed, optional=optional)

    def _changed(self) -> None:
        self._on_change()

    def subscribe(self, handler: Callable[[str, informer.Change[Any]], None]) -> None:
        """Tell `handler` every change the caches see, with the cache's name: `TauRun`,
        `Job`, `RayJob`, `Pod`, a Kueue plural (`workloads` …) or `Node`."""
        named = {"TauRun": self.runs, **self.labelled, **self.kueue, "Node": self.nodes}
        for name, cache in named.items():
            cache.subscribe(functools.partial(handler, name))

    def parse_workloads_with(self, view: Callable[[dict[str, Any]], Any]) -> None:
        """Keep each cached Workload parsed by `view` (the reconciler's parser), once."""
        self.kueue["workloads"].parse_with(view)

    def workload_views(self) -> list[Any] | None:
        """The cached Workloads' views (`parse_workloads_with`); None before the cache is
        synced (the caller then lists and parses)."""
        cache = self.kueue["workloads"]
        return list(cache.views.values()) if cache.synced.is_set() else None

    async def run_caches(self, on_change: Callable[[], None] = lambda: None) -> None:
        """Keep the caches current until cancelled, calling `on_change` when what a reader
        sees changes (the reconciler's coalescing `poke`); then forget them, so the list
        calls list again until the next `run_caches` has synced."""
        self._on_change = on_change
        try:
            await asyncio.gather(*(c.run() for c in self._caches))
        finally:
            self._on_change = lambda: None
            for cache in self._caches:
                cache.reset()

    @property
    def synced(self) -> bool:
        """Whether every cache is synced (the passes read no list at all)."""
        return all(c.synced.is_set() for c in self._caches)

    async def _node_metadata(self, **query: Any) -> Any:
        """List or watch the nodes as metadata only (`NODE_METADATA`): the raw response."""
        accept = NODE_METADATA_WATCH if query.get("watch") else NODE_METADATA
        names = {"resource_version": "resourceVersion", "timeout_seconds": "timeoutSeconds",
                 "allow_watch_bookmarks": "allowWatchBookmarks"}  # fmt: skip
        params = [
            (names.get(k, k), str(v).lower() if isinstance(v, bool) else v)
            for k, v in query.items()
            if not k.startswith("_")
        ]
        return await self.api.call_api(
            "/api/v1/nodes", "GET", query_params=params,
            header_params={"Accept": accept}, auth_settings=["BearerToken"],
            _preload_content=False, _return_http_data_only=True,
        )  # fmt: skip

    # ------------------------------------------------------------------ TauRuns
    async def create_run(
        self, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create a TauRun (with `dry_run`, have the API server check and admit it without
        storing it); raise ConflictError when the name is taken, NotFoundError when the
        namespace does not exist, `refusal`'s kinds for any other refusal."""
        extra = {"dry_run": "All"} if dry_run else {}
        try:
            resp = await self._custom.create_namespaced_custom_object(
                *TAURUN[:2], namespace, TAURUN[2], body, _preload_content=False, **extra
            )
            return dict(await _api.read_json(resp))
        except client.ApiException as err:
            if err.status == 409:
                raise ConflictError(str(err.reason)) from err
            if err.status == 404:
                raise NotFoundError(namespace) from err
            raise refusal(err, "TauRun") from err

    async def dry_run_create(self, obj: dict[str, Any]) -> bool:
        """Have the API server (and its admission webhooks: Kueue's) check an object we are
        about to create, without storing it; `refusal`'s kinds when it would refuse it. A
        404 means its kind is not served (no KubeRay for a RayJob); False (a 409) that one of
        that name exists, for the caller to judge whose it is."""
        kind = str(obj["kind"])
        try:
            await self._create(obj, dry_run=True)
        except client.ApiException as err:
            if err.status == 409:
                return False
            if err.status == 404:
                if (api_status(err).get("details") or {}).get("kind") == "namespaces":
                    raise NotFoundError(str(obj["metadata"]["namespace"])) from err
                msg = f"this cluster cannot create a {kind}: {str(err.reason)[:200]}"
                raise RejectedError(kind, msg, "kind") from err
            raise refusal(err, kind) from err
        return True

    async def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a TauRun, None when it does not exist."""
        return await _api.json_or_none(
            self._custom.get_namespaced_custom_object(
                *TAURUN[:2], namespace, TAURUN[2], name, _preload_content=False
            )
        )

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """List TauRuns in one namespace or in all (from the cache once it is synced)."""
        if self.runs.synced.is_set():
            return self.runs.select(namespace=namespace or None)
        if namespace:
            resp = await self._custom.list_namespaced_custom_object(
                *TAURUN[:2], namespace, TAURUN[2], _preload_content=False
            )
        else:
            resp = await self._custom.list_cluster_custom_object(*TAURUN, _preload_content=False)
        return list((await _api.read_json(resp)).get("items") or [])

    async def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Replace the run's status through the status subresource (merge patch); None if
        the run is gone."""
        return await self._patched_run(self._custom.patch_namespaced_custom_object_status(
            *TAURUN[:2], namespace, TAURUN[2], name, {"status": status},
            _content_type="application/merge-patch+json", _preload_content=False,
        ))  # fmt: skip

    async def annotate_run(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any] | None:
        """Merge annotations into a TauRun (None removes one); None if it is gone."""
        return await self._patched_run(self._custom.patch_namespaced_custom_object(
            *TAURUN[:2], namespace, TAURUN[2], name, {"metadata": {"annotations": annotations}},
            _content_type="application/merge-patch+json", _preload_content=False,
        ))  # fmt: skip

    async def _patched_run(self, call: Awaitable[Any]) -> dict[str, Any] | None:
        """The TauRun a patch wrote, shown in the cache at once; None if the run is gone."""
        written = await _api.json_or_none(call)
        if written is not None:
            self.runs.note(written)
        return written

    # ------------------------------------------------------------------ owned objects
    async def create(self, obj: dict[str, Any]) -> bool:
        """Create a Job, Service, RayJob, NetworkPolicy, ResourceClaimTemplate or ConfigMap;
        False when it already exists as this run's. errors.NameTaken when an object of that
        name exists and its controller is not the run `obj` is owned by (review M4): it is
        never written into, and the run learns why."""
        try:
            created = await self._create(obj)
        except client.ApiException as err:
            if err.status != 409:
                raise
            meta = obj["metadata"]
            existing = await self.read_object(obj["kind"], meta["namespace"], meta["name"])
            if existing is not None:
                _check_owner(existing, obj["kind"], obj)
            return False
        cache = self.labelled.get(str(obj["kind"]))
        labels = (created.get("metadata") or {}).get("labels") or {}
        if cache is not None and marks.RUN_LABEL in labels:
            cache.note(created)  # the next pass sees it even before the watch brings it
        return True

    async def _create(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        ns = obj["metadata"]["namespace"]
        kind = obj["kind"]
        opts: dict[str, Any] = {"_preload_content": False}
        if dry_run:
            opts["dry_run"] = "All"
        if kind == "Job":
            resp = await self._batch.create_namespaced_job(ns, obj, **opts)
        elif kind == "Service":
            resp = await self._core.create_namespaced_service(ns, obj, **opts)
        elif kind == "ConfigMap":
            resp = await self._core.create_namespaced_config_map(ns, obj, **opts)
        elif kind == "RayJob":
            resp = await self._custom.create_namespaced_custom_object(
                *RAYJOB[:2], ns, RAYJOB[2], obj, **opts
            )
        elif kind == "ResourceClaimTemplate":
            resp = await self._custom.create_namespaced_custom_object(
                *CLAIM_TEMPLATES[:2], ns, CLAIM_TEMPLATES[2], obj, **opts
            )
        elif kind == "NetworkPolicy":
            resp = await self._networking.create_namespaced_network_policy(ns, obj, **opts)
        else:
            msg = f"cannot create a {kind}"
            raise ValueError(msg)
        return dict(await _api.read_json(resp))

    async def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of a run's objects by kind and name; None when there is none."""
        raw = {"_preload_content": False}
        if kind == "Job":
            call = self._batch.read_namespaced_job(name, namespace, **raw)
        elif kind == "Service":
            call = self._core.read_namespaced_service(name, namespace, **raw)
        elif kind == "ConfigMap":
            call = self._core.read_namespaced_config_map(name, namespace, **raw)
        elif kind == "RayJob":
            call = self._custom.get_namespaced_custom_object(
                *RAYJOB[:2], namespace, RAYJOB[2], name, **raw
            )
        elif kind == "ResourceClaimTemplate":
            call = self._custom.get_namespaced_custom_object(
                *CLAIM_TEMPLATES[:2], namespace, CLAIM_TEMPLATES[2], name, **raw
            )
        elif kind == "NetworkPolicy":
            call = self._networking.read_namespaced_network_policy(name, namespace, **raw)
        else:
            msg = f"cannot read a {kind}"
            raise ValueError(msg)
        return await _api.json_or_none(call)

    async def write_configmap(self, body: dict[str, Any]) -> None:
        """Merge a ConfigMap's `data` into the stored one, creating it from `body` if missing;
        errors.NameTaken when the stored one is not the run's (never merged into)."""
        meta = body["metadata"]
        existing = await self.read_object("ConfigMap", meta["namespace"], meta["name"])
        if existing is None:
            await self.create(body)
            return
        _check_owner(existing, "ConfigMap", body)
        # The UID precondition: the object checked is the object patched.
        patch = {"metadata": {"uid": existing["metadata"]["uid"]}, "data": body.get("data") or {}}
        resp = await self._core.patch_namespaced_config_map(
            meta["name"], meta["namespace"], patch,
            _preload_content=False, _content_type="application/merge-patch+json",
        )  # fmt: skip
        await _api.read_json(resp)

    async def delete(self, kind: str, namespace: str, name: str, *, owner_uid: str) -> bool:
        """Delete a Job, Service, RayJob, NetworkPolicy or ResourceClaimTemplate (dependents in
        the background) if it is the run `owner_uid`'s; False if it is gone or not the run's
        (an object of that name someone else made is left alone, review M4)."""
        existing = await self.read_object(kind, namespace, name)
        if existing is None:
            return False
        if _controller_uid(existing) != owner_uid:
            log.warning("not deleting an object that is not the run's", kind=kind,
                        object=f"{namespace}/{name}", owner_uid=owner_uid)  # fmt: skip
            return False
        # The UID precondition: the object checked is the object deleted.
        body = {"propagationPolicy": "Background",
                "preconditions": {"uid": existing["metadata"]["uid"]}}  # fmt: skip
        try:
            if kind == "Job":
                await self._batch.delete_namespaced_job(name, namespace, body=body)
            elif kind == "Service":
                await self._core.delete_namespaced_service(name, namespace, body=body)
            elif kind == "RayJob":
                await self._custom.delete_namespaced_custom_object(
                    *RAYJOB[:2], namespace, RAYJOB[2], name, body=body
                )
            elif kind == "NetworkPolicy":
                await self._networking.delete_namespaced_network_policy(name, namespace, body=body)
            elif kind == "ResourceClaimTemplate":
                await self._custom.delete_namespaced_custom_object(
                    *CLAIM_TEMPLATES[:2], namespace, CLAIM_TEMPLATES[2], name, body=body
                )
            else:
                msg = f"cannot delete a {kind}"
                raise ValueError(msg)
        except client.ApiException as err:
            if err.status in (404, 409):  # gone, or replaced since it was read
                return False
            raise
        return True

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """List Jobs, RayJobs or Pods in every namespace carrying the selector (Pods also by
        a field selector, such as `spec.nodeName=N`): from the cache of the run-labelled
        ones once it is synced and the selector asks for the run label."""
        cached = self._select(self.labelled.get(kind), selector, field_selector)
        if cached is not None:
            return cached
        if kind == "Job":
            resp = await self._batch.list_job_for_all_namespaces(
                label_selector=selector, _preload_content=False
            )
        elif kind == "RayJob":
            resp = await self._custom.list_cluster_custom_object(
                *RAYJOB, label_selector=selector, _preload_content=False
            )
        elif kind == "Pod":
            extra = {"field_selector": field_selector} if field_selector else {}
            resp = await self._core.list_pod_for_all_namespaces(
                label_selector=selector, _preload_content=False, **extra
            )
        else:
            msg = f"cannot list {kind}"
            raise ValueError(msg)
        items = list((await _api.read_json(resp)).get("items") or [])
        for item in items:
            item.setdefault("kind", kind)
        return items

    @staticmethod
    def _select(
        cache: informer.Informer[Any] | None, selector: str, field_selector: str
    ) -> list[dict[str, Any]] | None:
        """What a list with these selectors returns, from `cache` (which holds the objects
        carrying the run label); None when the cache cannot answer: not synced, a selector
        not narrower than the run label, or a form only the API server answers."""
        if cache is None or not cache.synced.is_set():
            return None
        try:
            wanted = selectors.parse(selector)
            if not any(r.key == marks.RUN_LABEL and r.op in {selectors.Op.EXISTS,
                       selectors.Op.EQUALS} for r in wanted):  # fmt: skip
                return None
            return cache.select(selector, field_selector=field_selector)
        except selectors.UnsupportedError:
            return None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """List pods of one namespace by label selector."""
        resp = await self._core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        return list((await _api.read_json(resp)).get("items") or [])

    async def list_nodes(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """List nodes, or only those named (only names and annotations are used).

        The whole list comes as metadata only (a PartialObjectMetadataList): a node's status
        (images, conditions, addresses) is most of its bytes, and decoding it for every node
        on every pass cost the controller more CPU than its heartbeats. Once the node cache
        is synced the whole list comes from it, with only the quarantine annotations
        (`trim_node`). The named ones are always read from the API server: a quarantine
        asks for them (`Reconciler.urgent`) the moment it wrote them, before any watch
        could have brought the change."""
        if names is None and self.nodes.synced.is_set():
            return self.nodes.values()
        if names is None:
            return list((await _api.read_json(await self._node_metadata())).get("items") or [])
        out: list[dict[str, Any]] = []
        for name in names:
            resp = await self._core.list_node(
                field_selector=f"metadata.name={name}", _preload_content=False
            )
            out.extend((await _api.read_json(resp)).get("items") or [])
        return out

    # ------------------------------------------------------------------ Kueue
    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """List Workloads, LocalQueues (namespaced or all), WorkloadPriorityClasses or
        ClusterQueues (the first three from their caches once synced)."""
        cache = self.kueue.get(plural)
        if cache is not None and cache.synced.is_set():
            return cache.select(namespace=namespace or None)
        if namespace:
            resp = await self._custom.list_namespaced_custom_object(
                *KUEUE, namespace, plural, _preload_content=False
            )
        else:
            resp = await self._custom.list_cluster_custom_object(
                *KUEUE, plural, _preload_content=False
            )
        return list((await _api.read_json(resp)).get("items") or [])

    async def get_cluster_queue(self, name: str) -> dict[str, Any] | None:
        """A Kueue ClusterQueue, None when there is none."""
        return await _api.json_or_none(
            self._custom.get_cluster_custom_object(
                *KUEUE, "clusterqueues", name, _preload_content=False
            )
        )

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        """A Kueue WorkloadPriorityClass, None when there is none."""
        return await _api.json_or_none(
            self._custom.get_cluster_custom_object(
                *KUEUE, "workloadpriorityclasses", name, _preload_content=False
            )
        )

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod, None when there is none (which run and attempt a run token is)."""
        return await _api.json_or_none(
            self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        )

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A PersistentVolumeClaim, None when there is none."""
        return await _api.json_or_none(
            self._core.read_namespaced_persistent_volume_claim(
                name, namespace, _preload_content=False
            )
        )

    async def pending_workloads(
        self, namespace: str, local_queue: str
    ) -> list[dict[str, Any]] | None:
        """Ask Kueue's visibility API for a LocalQueue's pending Workloads; None when it does
        not answer (then the caller computes positions itself)."""
        if time.monotonic() < self._visibility_down_until:
            return None
        for version in VISIBILITY_VERSIONS:
            path = (
                f"/apis/visibility.kueue.x-k8s.io/{version}/namespaces/{{namespace}}"
                "/localqueues/{name}/pendingworkloads"
            )
            try:
                resp = await self.api.call_api(
                    path, "GET",
                    path_params={"namespace": namespace, "name": local_queue},
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False, _return_http_data_only=True,
                    _request_timeout=2,
                )  # fmt: skip
                data = await _api.read_json(resp)
            except (client.ApiException, TimeoutError, OSError, ValueError):
                continue
            return list(data.get("items") or [])
        self._visibility_down_until = time.monotonic() + VISIBILITY_RETRY_S
        return None


def _controller_uid(obj: dict[str, Any]) -> str | None:
    """The UID of an object's controller owner (None without one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return None


def _check_owner(existing: dict[str, Any], kind: str, written: dict[str, Any]) -> None:
    """errors.NameTaken unless `existing` is controlled by the run `written` (the object we
    are writing) belongs to."""
    owner_uid = _controller_uid(written)
    if owner_uid and _controller_uid(existing) == owner_uid:
        return
    meta = existing.get("metadata") or {}
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    msg = (
        f"a {kind} {where} already exists and is not this run's; TauGrid never writes into"
        " somebody else's object: delete it, or submit under another run name"
    )
    raise errors.NameTaken(msg, field="name")
