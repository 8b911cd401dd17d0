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
import functools
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes_asyncio import client

from controller import marks
from controller.kube import _api, informer

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


class DeviceKind(informer.Informer[Any]):
    """One cluster-scoped kind, listed then watched, kept by name (the informer; our own
    writes shown at once by `Informer.put` and `Informer.gone`). A kind the API server does
    not serve (404) or RBAC refuses (403) is read as empty: device quarantine then stays off
    instead of stopping every quarantine pass."""

    def __init__(
        self,
        api: client.ApiClient,
        plural: str,
        trim: Callable[[dict[str, Any]], dict[str, Any]],
        on_change: Callable[[], None],
        field_selector: str = "",
    ) -> None:
        custom = client.CustomObjectsApi(api)
        selector = {"field_selector": field_selector} if field_selector else {}
        super().__init__(
            functools.partial(custom.list_cluster_custom_object, *RESOURCE, plural, **selector),
            trim, kind=f"{plural}.{RESOURCE[0]}/{RESOURCE[1]}", on_change=on_change,
            optional=True,
        )  # fmt: skip


class DeviceCache:
    """The ResourceSlices of NVIDIA's driver and every DeviceTaintRule, kept current."""

    def __init__(self, api: client.ApiClient, on_change: Callable[[], None]) -> None:
        self.slices = DeviceKind(
            api, "resourceslices", trim_slice, on_change,
            field_selector=f"spec.driver={marks.DRA_DRIVER}",
        )  # fmt: skip
        self.rules = DeviceKind(api, "devicetaintrules", trim_rule, on_change)

    def synced(self) -> bool:
        """Whether both kinds were listed at least once (or found unavailable)."""
        return self.slices.synced.is_set() and self.rules.synced.is_set()

    def available(self) -> bool:
        """Whether device quarantine can work: both kinds listed and served (the API server
        serves them and RBAC lets us read them)."""
        return not self.slices.absent and not self.rules.absent

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
