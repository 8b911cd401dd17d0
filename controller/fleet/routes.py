"""The fleet's routes: heartbeats (`api`), the on-call API (`oncall`)."""

from __future__ import annotations

from aiohttp import web

from controller.fleet import api, oncall, relaying


def add_routes(app: web.Application) -> None:
    """Register the fleet routes."""
    app.router.add_post("/v1/heartbeats", api.post_heartbeat)
    app.router.add_post(relaying.PATH, api.post_peer_heartbeats)
    app.router.add_get("/v1/nodes", oncall.list_nodes)
    app.router.add_get("/v1/nodes/{name}", oncall.get_node)
    app.router.add_post("/v1/nodes/{name}/quarantine", oncall.post_quarantine)
    app.router.add_delete("/v1/nodes/{name}/quarantine", oncall.delete_quarantine)
    app.router.add_get("/v1/nodes/{name}/gpus", oncall.get_agent_gpus)
    app.router.add_post("/v1/nodes/{name}/diag", oncall.post_agent_diag)
    app.router.add_post("/v1/nodes/{name}/agent/release", oncall.post_agent_release)
    app.router.add_get("/v1/fleet", oncall.get_fleet)
    app.router.add_post("/v1/fleet/breaker/reset", oncall.reset_breaker)
    app.router.add_put("/v1/fleet/mode", oncall.put_mode)
