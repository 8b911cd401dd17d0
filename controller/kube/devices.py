"""DRA devices and DeviceTaintRules: device quarantine's view of the API server, and its writes.

`DeviceCache` lists then watches two kinds as raw JSON, trimmed to what the device policy
reads: the ResourceSlices of NVIDIA's driver (field selector `spec.driver`) and every
DeviceTaintRule (ours and others'; the policy tells them apart by our label). kubernetes-
asyncio has no typed client for `resource.k8s.io/v1` DeviceTaintRules yet, so both go
through the generic object calls, which only build `/apis/<group>/<version>/<plural>`.
A cluster that does not serve one of them (no DRA, or a Kubernetes before 1.37) is logged
once and read as empty: device quarantine then simply never applies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import marks
from controller.kube import _api

log = structlog.get_logger()

RESOURCE = ("resource.k8s.io", "v1")


def trim_slice(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep a slice's node, pool and each device's name, UUID and taints."""
    spec = raw.get("spec") or {}
    devices = []
    for d in spec.get("devices") or []:
        attrs = d.get("attributes") or {}
        devices.append(
            {
                "name": d.get("name"),
                "attributes": {k: v for k, v in attrs.items() if k == marks.DRA_UUID_ATTRIBUTE},
                "taints": d.get("taints") or [],
            }
        )
    meta = raw.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name", ""), "resourceVersion": meta.get("resourceVersion")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": (spec.get("pool") or {}).get("name")},
            "devices": devices,
        },
    }


def trim_rule(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep a rule's identity, our marks, selector, taint and EvictionInProgress condition."""
    meta = raw.get("metadata") or {}
    conditions = [
        c
        for c in (raw.get("status") or {}).get("conditions") or []
        if c.get("type") == marks.EVICTION_IN_PROGRESS_CONDITION
    ]
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": meta.get("labels") or {},
            "annotations": {
                k: v for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(marks.PREFIX)
            },
        },
        "spec": raw.get("spec") or {},
        "status": {"conditions": conditions},
    }  # fmt: skip


class _Watched:
    """One cluster-scoped kind, listed then watched, kept by name."""

    def __init__(
        self,
        api: client.ApiClient,
        plural: str,
        trim: Callable[[dict[str, Any]], dict[str, Any]],
        on_change: Callable[[], None],
        field_selector: str = "",
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self.plural = plural
        self._trim = trim
        self._on_change = on_change
        self._selector = {"field_selector": field_selector} if field_selector else {}
        self.items: dict[str, dict[str, Any]] = {}
        self.version = 0
        """Bumped on every change, so readers can reuse what they parsed from `items`."""
        self.synced = asyncio.Event()
        self.served = True
        """False while the API server does not serve the kind (404) or RBAC refuses it (403):
        device quarantine then stays off instead of stopping every quarantine pass."""

    def put(self, raw: dict[str, Any]) -> None:
        """Store an object returned by a write, so the next pass sees it at once."""
        trimmed = self._trim(raw)
        self.items[trimmed["metadata"]["name"]] = trimmed
        self.version += 1
        self._on_change()

    def drop(self, name: str) -> None:
        """Forget an object we deleted."""
        if self.items.pop(name, None) is not None:
            self.version += 1
            self._on_change()

    async def run(self) -> None:
        while True:
            try:
                rv = await self._list()
                if rv is None:
                    await asyncio.sleep(30.0)  # not served: look again now and then
                    continue
                await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001  (any API failure: relist after a pause)
                log.warning("device watch failed; relisting", kind=self.plural, error=str(err))
                await asyncio.sleep(1.0)

    async def _list(self) -> str | None:
        try:
            resp = await self._custom.list_cluster_custom_object(
                *RESOURCE, self.plural, _preload_content=False, **self._selector
            )
            data = await _api.read_json(resp)
        except client.ApiException as err:
            if err.status not in (403, 404):
                raise
            if self.served:
                why = "not served" if err.status == 404 else "not permitted (RBAC)"
                log.warning("device kind unavailable; device quarantine stays off", reason=why,
                            kind=f"{self.plural}.{RESOURCE[0]}/{RESOURCE[1]}")  # fmt: skip
            self.served = False
            self.items = {}
            self.version += 1
            self.synced.set()
            self._on_change()
            return None
        self.served = True
        self.items = {i["metadata"]["name"]: self._trim(i) for i in data.get("items") or []}
        self.version += 1
        self.synced.set()
        self._on_change()
        return str(data["metadata"]["resourceVersion"])

    async def _watch(self, rv: str) -> None:
        while True:
            resp = await self._custom.list_cluster_custom_object(
                *RESOURCE, self.plural, watch=True, resource_version=rv,
                allow_watch_bookmarks=True, timeout_seconds=300, _preload_content=False,
                **self._selector,
            )  # fmt: skip
            if resp.status != 200:
                await _api.read_json(resp)  # raises: relist
            try:
                while raw := await resp.content.readline():
                    if not raw.strip():
                        continue
                    event = json.loads(raw)
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        return
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    name = (obj.get("metadata") or {}).get("name", "")
                    if kind == "DELETED":
                        self.items.pop(name, None)
                    else:
                        self.items[name] = self._trim(obj)
                    self.version += 1
                    self._on_change()
            finally:
                resp.release()


class DeviceCache:
    """The ResourceSlices of NVIDIA's driver and every DeviceTaintRule, kept current."""

    def __init__(self, api: client.ApiClient, on_change: Callable[[], None]) -> None:
        self.slices = _Watched(
            api, "resourceslices", trim_slice, on_change,
            field_selector=f"spec.driver={marks.DRA_DRIVER}",
        )  # fmt: skip
        self.rules = _Watched(api, "devicetaintrules", trim_rule, on_change)

    def synced(self) -> bool:
        """Whether both kinds were listed at least once (or found unavailable)."""
        return self.slices.synced.is_set() and self.rules.synced.is_set()

    def available(self) -> bool:
        """Whether device quarantine can work: both kinds listed and served."""
        return self.slices.served and self.rules.served

    async def run(self) -> None:
        """Keep both kinds current until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.slices.run())
            tasks.create_task(self.rules.run())


class DeviceWriter:
    """Create and delete our DeviceTaintRules (never anyone else's: the caller passes
    only names it read with our label, and each delete is conditional on the UID read)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._custom = client.CustomObjectsApi(api)

    async def create_rule(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create one rule; None when a rule of that name exists already (a pass that raced
        a watch event: the next pass reads it)."""
        try:
            resp = await self._custom.create_cluster_custom_object(
                *RESOURCE, "devicetaintrules", body, _preload_content=False
            )
            return dict(await _api.read_json(resp))
        except client.ApiException as err:
            if err.status == 409:
                return None
            raise

    async def delete_rule(self, name: str, uid: str) -> bool:
        """Delete one rule if it is still the one read (its UID); True when it is gone."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        try:
            resp = await self._custom.delete_cluster_custom_object(
                *RESOURCE, "devicetaintrules", name, body=body, _preload_content=False
            )
            await _api.read_json(resp)
        except client.ApiException as err:
            if err.status == 404:
                return True
            if err.status == 409:
                return False  # re-created meanwhile: not the rule we decided on
            raise
        return True
