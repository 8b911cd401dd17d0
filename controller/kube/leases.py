"""The Lease used for leader election (the `leading.LeaseStore` seam)."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from controller import leading, marks, timestamps


def _record(lease: Any) -> leading.LeaseRecord:
    spec = lease.spec
    annotations = lease.metadata.annotations or {}
    return leading.LeaseRecord(
        holder=spec.holder_identity or "",
        duration_s=float(spec.lease_duration_seconds or 0),
        renew_time=spec.renew_time,
        acquire_time=spec.acquire_time,
        transitions=int(spec.lease_transitions or 0),
        leader_url=annotations.get(marks.LEADER_URL_ANNOTATION, ""),
        version=lease.metadata.resource_version or "",
        state=tuple(
            sorted(
                (k, v)
                for k, v in annotations.items()
                if k.startswith(marks.PREFIX) and k != marks.LEADER_URL_ANNOTATION
            )
        ),
    )


class KubeLeaseStore:
    """Read and conditionally write one Lease."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, *, timeout_s: float = 5.0
    ) -> None:
        """`timeout_s` bounds each call: a read and a write fit in the renew deadline, so a
        stuck API server makes this replica step down in time rather than hang."""
        self._api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s

    async def read(self) -> leading.LeaseRecord | None:
        """Return the Lease, None when it does not exist."""
        try:
            lease = await self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.timeout_s
            )
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return _record(lease)

    async def write(
        self, record: leading.LeaseRecord, *, create: bool
    ) -> leading.LeaseRecord | None:
        """Create or replace the Lease; None when another replica changed it first (409)."""
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": {
                    **dict(record.state),
                    marks.LEADER_URL_ANNOTATION: record.leader_url,
                },
            },
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": max(1, round(record.duration_s)),
                "renewTime": timestamps.rfc3339_micro(record.renew_time),
                "acquireTime": timestamps.rfc3339_micro(record.acquire_time),
                "leaseTransitions": record.transitions,
            },
        }
        try:
            if create:
                lease = await self._api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self.timeout_s
                )
            else:
                body["metadata"]["resourceVersion"] = record.version
                lease = await self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.timeout_s
                )
        except client.ApiException as err:
            if err.status in (409, 404):
                return None
            raise
        return _record(lease)

    async def save_state(self, values: dict[str, str]) -> None:
        """Merge fleet-state annotations into the Lease (the leader calls this)."""
        body = {"metadata": {"annotations": values}}
        await self._api.patch_namespaced_lease(
            self.name, self.namespace, body,
            _content_type="application/merge-patch+json", _request_timeout=self.timeout_s,
        )  # fmt: skip
