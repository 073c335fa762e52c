"""``/healthz`` and ``/metrics``."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from coordinator.api.app_keys import (
    CHANGES_KEY,
    CLUSTER_KEY,
    GRPC_SERVER_KEY,
    LIVE_VIEW_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    ROLLOUTS_KEY,
    STORE_HEALTH_KEY,
)


async def healthz(request: web.Request) -> web.Response:
    """The coordinator's health: ``status`` "ok", or "degraded" while the fleet database
    is away or slow (route lookups and sessions carry on from memory; ``store`` says more).
    Answered from memory: it never waits for the database."""
    grpc_server = request.app[GRPC_SERVER_KEY]
    store = request.app[STORE_HEALTH_KEY]
    rollouts = request.app.get(ROLLOUTS_KEY)
    return web.json_response(
        {
            "status": store.status,
            "store": store.json(),
            "grpc": grpc_server.address if grpc_server.port is not None else None,
            "connected_agents": request.app[REGISTRY_KEY].connected_count(),
            "tls": grpc_server.tls,
            "enroll": grpc_server.enroll_address if grpc_server.port is not None else None,
            "coordinator": request.app[CLUSTER_KEY].json()
            | {
                "change_feed": request.app[CHANGES_KEY].json(),
                # the other coordinators' agents, routed here too
                "live_view": request.app[LIVE_VIEW_KEY].json(),
                # the rollout engine runs here (this coordinator leads): issue 24
                "rollout_engine_active": rollouts is not None and rollouts.active,
            },
        }
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[METRICS_KEY].exposition(),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )
