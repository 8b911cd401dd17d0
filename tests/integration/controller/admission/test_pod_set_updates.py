"""Our Ready entry, with its podSetUpdates, against Kueue's own validation on the real API server.

The entry is built by `entries.check_state_body` and applied by `AdmissionStore`, as the gate
does, on a Workload of two pod sets (made directly, so one test covers a multi-pod-set
shape). The check is one no controller answers (its Active condition set by hand), so the
test alone writes it. Kueue's webhook must refuse what its validation forbids: a pod set the
Workload has not, a label key Kubernetes rejects, and any change to the updates of an entry
that stays Ready; a refusal names Kueue's webhook, so the test fails if it is not running.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import marks, timestamps
from controller.admission import entries, policy, views
from controller.kube import admission as kube_admission
from devcluster import cluster
from tests import kueue, support

pytestmark = pytest.mark.cluster

KUEUE = ("kueue.x-k8s.io", "v1beta2")
POD_SETS = ("driver", "workers")
WEBHOOK = "vworkload.kb.io"
"""Kueue's validating webhook for Workloads (and their status)."""


def workload(name: str, namespace: str, queue: str) -> dict[str, Any]:
    """A Workload of two CPU-only pod sets in `queue` (no Job behind it)."""

    def pod_set(ps: str, count: int) -> dict[str, Any]:
        container = {"name": "c", "image": "registry.example/x@sha256:" + "0" * 64,
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}  # fmt: skip
        spec = {"restartPolicy": "Never", "containers": [container]}
        return {"name": ps, "count": count, "template": {"spec": spec}}

    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": queue, "podSets": [pod_set("driver", 1), pod_set("workers", 2)]},
    }


@pytest_asyncio.fixture
async def waiting(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, namespace: str
) -> AsyncIterator[tuple[str, str]]:
    """An Active check no controller answers, a queue that waits on it, and a Workload with
    quota reserved and the check Pending; yields (check, Workload name)."""
    del dev_cluster  # the cluster is up; `k8s` talks to it
    custom = client.CustomObjectsApi(k8s)
    check = f"manual-{namespace}"[:63]
    await custom.create_cluster_custom_object(*KUEUE, "admissionchecks", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": check}, "spec": {"controllerName": "taugrid.dev/test-manual"},
    })  # fmt: skip
    try:
        active = {"type": "Active", "status": "True", "reason": "Test", "message": "set by hand",
                  "lastTransitionTime": timestamps.rfc3339(dt.datetime.now(dt.UTC))}  # fmt: skip
        await custom.patch_cluster_custom_object_status(
            *KUEUE, "admissionchecks", check, {"status": {"conditions": [active]}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        queue = await kueue.create_queues(k8s, namespace, gpus=0, checks=(check,))
        await custom.create_namespaced_custom_object(
            *KUEUE, namespace, "workloads", workload("two-sets", namespace, queue)
        )

        async def pending() -> None:
            wl = await get(k8s, namespace, "two-sets")
            reserved = support.condition(wl, "QuotaReserved") or {}
            assert reserved.get("status") == "True", "no quota reserved yet"
            assert entry(wl, check)["state"] == "Pending"

        await support.eventually(pending, what="quota reserved and the check Pending")
        yield check, "two-sets"
    finally:
        await kueue.delete_queues(k8s, namespace)
        try:
            await custom.delete_cluster_custom_object(*KUEUE, "admissionchecks", check)
        except client.ApiException as err:
            if err.status != 404:
                raise


async def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    return dict(await custom.get_namespaced_custom_object(*KUEUE, namespace, "workloads", name))


def entry(wl: dict[str, Any], check: str) -> dict[str, Any]:
    """The Workload's entry for `check` (AssertionError: not listed yet)."""
    for c in (wl.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == check:
            return dict(c)
    msg = f"no {check} entry yet"
    raise AssertionError(msg)


async def apply(
    api: client.ApiClient, namespace: str, name: str, body: dict[str, Any]
) -> dict[str, Any] | client.ApiException:
    """Apply `body` as the gate does, on the Workload as it is now; return what the API server
    wrote, or its refusal. A conflict (changed since read) is tried again."""

    store = kube_admission.AdmissionStore(api)

    async def once() -> dict[str, Any] | client.ApiException:
        wl = await get(api, namespace, name)
        try:
            written = await store.apply_check_state(
                namespace, name, wl["metadata"]["resourceVersion"], body
            )
        except client.ApiException as err:
            return err
        assert written is not None, "changed since read: again"
        return written

    return await support.eventually(once, what=f"an answer to applying {body}")


def refusal(answer: dict[str, Any] | client.ApiException, *words: str) -> str:
    """The webhook's refusal message; fails the test when the write was accepted."""
    if not isinstance(answer, client.ApiException):
        pytest.fail(f"Kueue accepted what its validation forbids: {entry_of(answer)}")
    body = str(answer.reason)
    # Kueue's webhook denies (403 Forbidden) with the field path; the CRD schema would say 422.
    assert answer.status == 403, body
    assert WEBHOOK in body, f"not Kueue's webhook: {body}"
    assert "denied the request" in body, body
    for w in words:
        assert w in body, body
    return body


def entry_of(wl: dict[str, Any]) -> list[dict[str, Any]]:
    return list((wl.get("status") or {}).get("admissionChecks") or [])


async def test_kueue_takes_our_ready_entry_and_refuses_what_its_validation_forbids(
    k8s: client.ApiClient, waiting: tuple[str, str], namespace: str
) -> None:
    """Kueue refuses an update of a pod set the Workload lacks and an invalid label key, takes
    our Ready entry (one update per pod set, each once), holds it immutable, and admits."""
    check, name = waiting
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ready = policy.Decision(views.CheckState.READY, "fits on healthy nodes", since=now)
    ours = entries.check_state_body(check, ready, list(POD_SETS))

    unknown = {**ours, "podSetUpdates": [*ours["podSetUpdates"], {"name": "launcher"}]}
    refusal(await apply(k8s, namespace, name, unknown),
            "podSetUpdates[2].name", "Unsupported value", "launcher")  # fmt: skip

    bad_label = {**ours, "podSetUpdates": [{"name": "driver", "labels": {"@abc": "x"}}]}
    refusal(await apply(k8s, namespace, name, bad_label), "podSetUpdates[0].labels")

    written = await apply(k8s, namespace, name, ours)
    assert not isinstance(written, client.ApiException), written.body
    taken = entry(written, check)
    assert taken["state"] == "Ready"
    assert [u["name"] for u in taken["podSetUpdates"]] == list(POD_SETS)
    assert taken["podSetUpdates"] == ours["podSetUpdates"]
    for update in taken["podSetUpdates"]:
        assert update["labels"] == {marks.GATE_PASSED_LABEL: "true"}
        assert update["annotations"][marks.GATE_PASSED_AT_ANNOTATION] == timestamps.rfc3339(now)

    later = policy.Decision(views.CheckState.READY, "fits on healthy nodes",
                            since=now + dt.timedelta(seconds=1))  # fmt: skip
    changed = entries.check_state_body(check, later, list(POD_SETS))
    refusal(await apply(k8s, namespace, name, changed), "podSetUpdates", "immutable")

    async def admitted() -> None:
        wl = await get(k8s, namespace, name)
        cond = support.condition(wl, "Admitted") or {}
        assert cond.get("status") == "True", wl.get("status")
        assert entry(wl, check)["podSetUpdates"] == ours["podSetUpdates"]

    await support.eventually(admitted, what="the Workload admitted with our updates")
