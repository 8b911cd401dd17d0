"""This replica's own pod: the leader label the leader-only Service selects."""

from __future__ import annotations

from kubernetes_asyncio import client

from controller import marks
from controller.kube import _api


class PodLabel:
    """Set or remove `taugrid.dev/leader` on one pod (the `leading.PodLabel` seam).

    The chart grants `patch pods` in the install namespace only, and its
    ValidatingAdmissionPolicy lets the controller change nothing but this label, and only on
    the pod its own token is bound to.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name

    async def set_leader(self, leading: bool) -> None:
        """Merge-patch the label: "true" while leading, removed (null) otherwise."""
        body = {"metadata": {"labels": {marks.LEADER_LABEL: "true" if leading else None}}}
        resp = await self._core.patch_namespaced_pod(
            self.name, self.namespace, body,
            _content_type="application/merge-patch+json", _preload_content=False,
        )  # fmt: skip
        await _api.read_json(resp)
