"""Assembles one coordinator: fleet registry, gRPC server and HTTP API in one app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from coordinator.config import CoordinatorConfig
from coordinator.grpc_service import CoordinatorServicer, GrpcServer
from coordinator.http_api import ROUTES, count_requests, openai_errors
from coordinator.metrics import CoordinatorMetrics
from coordinator.registry import FleetRegistry, InMemoryFleetRegistry
from coordinator.state import CONFIG_KEY, GRPC_SERVER_KEY, METRICS_KEY, REGISTRY_KEY


def create_app(
    config: CoordinatorConfig, *, registry: FleetRegistry | None = None
) -> web.Application:
    """Build the coordinator's web.Application.

    Starting the app (AppRunner.setup / a test server) also starts the gRPC
    server; cleaning it up ends agent sessions and stops the gRPC server.
    """
    fleet: FleetRegistry = InMemoryFleetRegistry() if registry is None else registry
    metrics = CoordinatorMetrics(fleet)
    servicer = CoordinatorServicer(
        fleet,
        metrics,
        report_interval_ms=config.report_interval_ms,
        hello_timeout_s=config.hello_timeout_s,
    )
    app = web.Application(middlewares=[count_requests, openai_errors])
    app[CONFIG_KEY] = config
    app[REGISTRY_KEY] = fleet
    app[METRICS_KEY] = metrics
    app[GRPC_SERVER_KEY] = GrpcServer(config, servicer)
    app.add_routes(ROUTES)
    app.cleanup_ctx.append(_grpc_server)
    return app


async def _grpc_server(app: web.Application) -> AsyncIterator[None]:
    server = app[GRPC_SERVER_KEY]
    await server.start()
    try:
        yield
    finally:
        await server.stop()
