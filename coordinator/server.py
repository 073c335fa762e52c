"""Runs a coordinator until SIGTERM/SIGINT, then shuts it down gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from coordinator.app import create_app
from coordinator.app_keys import GRPC_SERVER_KEY, METRICS_KEY, REGISTRY_KEY
from coordinator.config import CoordinatorConfig
from coordinator.errors import ServerStartError
from coordinator.gc_pauses import GcPauseRecorder, HeapSettler, settle_heap
from edgefleet.http_limits import LimitedAppRunner

logger = logging.getLogger(__name__)


async def serve(config: CoordinatorConfig, *, stop: asyncio.Event | None = None) -> None:
    """Serve gRPC and HTTP until ``stop`` is set or the process gets SIGTERM/SIGINT."""
    stop = asyncio.Event() if stop is None else stop
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    app = create_app(config)
    gc_pauses = GcPauseRecorder(app[METRICS_KEY].gc_pause_seconds)
    gc_pauses.install()
    runner = LimitedAppRunner(app, config.http_limits(), handle_signals=False)
    try:
        await runner.setup()  # starts the gRPC server too (cleanup_ctx)
        site = web.TCPSite(runner, config.http_host, config.http_port)
        try:
            await site.start()
        except OSError as exc:
            raise ServerStartError(
                f"cannot listen for HTTP on {config.http_host}:{config.http_port}: {exc.strerror}"
            ) from exc
        http_host, http_port = runner.addresses[0][:2]
        settle_heap()
        grpc_server = app[GRPC_SERVER_KEY]
        logger.info(
            "coordinator ready: grpc=%s http=http://%s:%d enroll=%s tls=%s",
            grpc_server.address,
            http_host,
            http_port,
            grpc_server.enroll_address,
            "on" if grpc_server.tls else "off",
        )
        settler = asyncio.create_task(_settle_heap(app), name="heap-settler")
        try:
            await stop.wait()
        finally:
            settler.cancel()
            await asyncio.wait([settler])
        logger.info("shutting down")
    finally:
        gc_pauses.uninstall()
        await runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    logger.info("coordinator stopped")


async def _settle_heap(app: web.Application, period_s: float = 5.0) -> None:
    """Keep long-lived session objects out of the collector's way as the fleet grows."""
    settler = HeapSettler()
    registry = app[REGISTRY_KEY]
    while True:
        await asyncio.sleep(period_s)
        settler.tick(registry.connected_count())
