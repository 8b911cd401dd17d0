"""Build the kubernetes_asyncio client from a kubeconfig or the in-cluster ServiceAccount."""

from __future__ import annotations

import pathlib

from kubernetes_asyncio import client, config

from shared import kubetoken


async def make_client(kubeconfig: str = "", *, qps_pool: int = 64) -> client.ApiClient:
    """Return an ApiClient; the connection pool is sized for bursts of patches and reviews."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        rotated = kubetoken.token_file(pathlib.Path(kubeconfig))
        if rotated is not None:  # a token renewed on disk before it expires
            cfg.refresh_api_key_hook = kubetoken.refresh_hook(rotated)
    else:
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = qps_pool
    return client.ApiClient(configuration=cfg)
