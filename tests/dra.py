"""Builders and reads of DRA objects for tests: claim templates, Jobs using them, device
taint rules, and where the scheduler allocated each claim."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from kubernetes_asyncio import client

from devcluster import drapublisher
from tests import kueue, support

RESOURCE = ("resource.k8s.io", "v1")
TEST_RULE_LABEL = "taugrid.dev/test"
"""On the DeviceTaintRules a test makes by hand (they are cluster-scoped): its namespace."""


def claim_template(
    name: str, gpus: int = 1, *, tolerate: tuple[str, int] | None = None
) -> dict[str, Any]:
    """A ResourceClaimTemplate for `gpus` whole GPUs (`exactly`, `ExactCount`), tolerating
    `(key, seconds)` of a NoExecute taint when given."""
    exactly: dict[str, Any] = {
        "deviceClassName": drapublisher.DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": gpus,
    }
    if tolerate is not None:
        key, seconds = tolerate
        exactly["tolerations"] = [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
    }


def dra_job(
    name: str, queue: str, template: str, *, run_for: str = "10m", parallelism: int = 1
) -> dict[str, Any]:
    """`kueue.gpu_job`, its pods getting their GPUs through a claim from `template` instead
    of the extended resource."""
    job = kueue.gpu_job(name, queue, 0, run_for=run_for, parallelism=parallelism)
    pod = job["spec"]["template"]["spec"]
    pod["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    pod["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "claims": [{"name": "gpus"}],
    }
    return job


def taint_rule(
    name: str, node: str, device: str, *, key: str, effect: str, test: str
) -> dict[str, Any]:
    """A DeviceTaintRule on one GPU of one node, labelled with the test that made it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {TEST_RULE_LABEL: test}},
        "spec": {
            "deviceSelector": {"driver": drapublisher.DRIVER, "pool": node, "device": device},
            "taint": {"key": key, "effect": effect},
        },
    }


async def create(api: client.ApiClient, namespace: str | None, plural: str, body: Any) -> Any:
    """Create a resource.k8s.io object (namespaced when `namespace` is given)."""
    custom = client.CustomObjectsApi(api)
    if namespace is None:
        return await custom.create_cluster_custom_object(*RESOURCE, plural, body)
    return await custom.create_namespaced_custom_object(*RESOURCE, namespace, plural, body)


async def allocations(api: client.ApiClient, namespace: str) -> dict[str, tuple[str, str]]:
    """(pool, device) of each allocated claim in `namespace`, keyed by the pod that owns it."""
    custom = client.CustomObjectsApi(api)
    claims = await custom.list_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")
    out: dict[str, tuple[str, str]] = {}
    for claim in claims["items"]:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        owners = claim["metadata"].get("ownerReferences") or [{}]
        for result in results.get("results") or []:
            out[str(owners[0].get("name", ""))] = (result["pool"], result["device"])
    return out


async def devices_of(api: client.ApiClient, namespace: str) -> dict[str, set[tuple[str, str]]]:
    """Every (pool, device) allocated to each pod's claims in `namespace` (several devices
    per claim: a pod of N GPUs)."""
    custom = client.CustomObjectsApi(api)
    claims = await custom.list_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims")
    out: dict[str, set[tuple[str, str]]] = {}
    for claim in claims["items"]:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        owner = str((claim["metadata"].get("ownerReferences") or [{}])[0].get("name", ""))
        for result in results.get("results") or []:
            out.setdefault(owner, set()).add((result["pool"], result["device"]))
    return out


async def rule(api: client.ApiClient, name: str) -> dict[str, Any]:
    """Read one DeviceTaintRule."""
    custom = client.CustomObjectsApi(api)
    return dict(await custom.get_cluster_custom_object(*RESOURCE, "devicetaintrules", name))


async def rules(api: client.ApiClient, selector: str) -> list[dict[str, Any]]:
    """List the DeviceTaintRules matching a label selector."""
    custom = client.CustomObjectsApi(api)
    found = await custom.list_cluster_custom_object(
        *RESOURCE, "devicetaintrules", label_selector=selector
    )
    return list(found["items"])


async def delete_rules(api: client.ApiClient, names: Iterable[str]) -> None:
    """Delete DeviceTaintRules; those already gone are not an error."""
    custom = client.CustomObjectsApi(api)
    for name in names:
        try:
            await custom.delete_cluster_custom_object(*RESOURCE, "devicetaintrules", name)
        except client.ApiException as err:
            if err.status != 404:
                raise


@contextlib.asynccontextmanager
async def cleanup_rules(api: client.ApiClient, test: str) -> AsyncIterator[None]:
    """Delete the DeviceTaintRules labelled with `test` afterwards (they outlive namespaces)."""
    try:
        yield
    finally:
        found = await rules(api, f"{TEST_RULE_LABEL}={test}")
        await delete_rules(api, [r["metadata"]["name"] for r in found])


OURS = "taugrid.dev/quarantined-by=taugrid-controller"
"""The label selector of the controller's own DeviceTaintRules."""


async def ours_on(api: client.ApiClient, nodes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The controller's rules of the given nodes, by name."""
    wanted = set(nodes)
    return {
        r["metadata"]["name"]: r
        for r in await rules(api, OURS)
        if r["metadata"]["annotations"].get("taugrid.dev/node") in wanted
    }


async def delete_ours_on(api: client.ApiClient, nodes: Iterable[str]) -> None:
    """Delete the controller's rules of the given nodes (a test's fleet, afterwards)."""
    await delete_rules(api, list(await ours_on(api, nodes)))


async def evicted_by_kcm(api: client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """Wait for kube-controller-manager's device-taint Event on a pod (the pod itself soon
    vanishes); it records core/v1 Events, read raw (they have no eventTime)."""
    core = client.CoreV1Api(api)

    async def marked() -> dict[str, Any]:
        resp = await core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}", _preload_content=False
        )
        for e in json.loads(await resp.read())["items"]:
            if e.get("reason") == "DeviceTaintManagerEviction":
                return dict(e)
        msg = f"no DeviceTaintManagerEviction Event for {pod}"
        raise AssertionError(msg)

    return await support.eventually(marked, what=f"{pod} evicted by the device taint manager")


async def allocated(api: client.ApiClient, namespace: str, count: int) -> dict[str, Any]:
    """Wait until exactly `count` claims of `namespace` are allocated; return them by pod."""

    async def probe() -> dict[str, tuple[str, str]]:
        found = await allocations(api, namespace)
        assert len(found) == count, found
        return found

    return await support.eventually(probe, what=f"{count} claims allocated")
