"""Pod logs and the TauRunLogs they are kept in: the run store's log calls (`RunStore` is
one: the log keeper reads tails and writes TauRunLogs, the run API streams live logs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client

from controller.kube import _api

TAURUNLOG = ("taugrid.dev", "v1alpha1", "taurunlogs")


class RunLogs:
    """Log reads and TauRunLog writes, through the clients the store sets."""

    _core: client.CoreV1Api
    _custom: client.CustomObjectsApi
    _logs: client.CoreV1Api
    """The client log streams use (a pool of their own: a stream holds its connection)."""

    async def read_log_tail(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int,
        timeout_s: float,
    ) -> bytes:  # fmt: skip
        """The last `tail_lines` lines of a container's log, at most `limit_bytes` (counted
        from the first of those lines, as the kubelet counts), within `timeout_s`."""
        resp = await self._core.read_namespaced_pod_log(
            pod, namespace, container=container, tail_lines=tail_lines,
            limit_bytes=limit_bytes, _preload_content=False, _request_timeout=timeout_s,
        )  # fmt: skip
        return await _api.read_bytes(resp)

    async def get_run_log(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A TauRunLog, None when there is none."""
        return await _api.json_or_none(
            self._custom.get_namespaced_custom_object(
                *TAURUNLOG[:2], namespace, TAURUNLOG[2], name, _preload_content=False
            )
        )

    async def list_run_logs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The TauRunLogs of a namespace with a label selector."""
        resp = await self._custom.list_namespaced_custom_object(
            *TAURUNLOG[:2], namespace, TAURUNLOG[2], label_selector=selector,
            _preload_content=False,
        )  # fmt: skip
        return list((await _api.read_json(resp)).get("items") or [])

    async def create_run_log(self, body: dict[str, Any]) -> bool:
        """Create a TauRunLog; False when one of that name exists already."""
        return await _api.json_or_none(self._custom.create_namespaced_custom_object(
            *TAURUNLOG[:2], body["metadata"]["namespace"], TAURUNLOG[2], body,
            _preload_content=False,
        ), absent=(409,)) is not None  # fmt: skip

    async def replace_run_log(self, body: dict[str, Any], resource_version: str) -> bool:
        """Replace a TauRunLog at the version read; False when it changed since (409)."""
        meta = {**body["metadata"], "resourceVersion": resource_version}
        return await _api.json_or_none(self._custom.replace_namespaced_custom_object(
            *TAURUNLOG[:2], meta["namespace"], TAURUNLOG[2], meta["name"],
            {**body, "metadata": meta}, _preload_content=False,
        ), absent=(409,)) is not None  # fmt: skip

    # ------------------------------------------------------------------ logs
    async def stream_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        follow: bool,
        tail_lines: int | None,
        since_seconds: int | None = None,
    ) -> AsyncIterator[bytes]:
        """Yield a container's log as it is written (through the API server)."""
        given = {"tail_lines": tail_lines, "since_seconds": since_seconds}
        kwargs = {k: v for k, v in given.items() if v is not None}
        resp = await self._logs.read_namespaced_pod_log(
            pod, namespace, container=container, follow=follow, _preload_content=False, **kwargs
        )
        if not 200 <= resp.status <= 299:
            await _api.read_json(resp)  # raises with the API server's message
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        finally:
            resp.release()
