"""Runs a coordinator until SIGTERM/SIGINT, then shuts it down gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
from pathlib import Path

from aiohttp import web
from aiohttp.web_log import AccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from coordinator.api.app_keys import BLOB_BASE_URL_KEY, GRPC_SERVER_KEY, METRICS_KEY, REGISTRY_KEY
from coordinator.app import create_app
from coordinator.config import CoordinatorConfig
from coordinator.errors import ConfigError, ServerStartError
from coordinator.event_loop import running_loop_name
from coordinator.gc_pauses import FREEZE_EVERY_S, GcPauseRecorder, HeapSettler, settle_heap
from coordinator.grpc_threads import RECHECK_S, lower_grpc_threads
from coordinator.identity.ca import CertificateAuthority
from coordinator.loop_lag import LoopLagProbe
from edgefleet.addresses import is_loopback_host
from edgefleet.http_limits import LimitedAppRunner
from edgefleet.tls import (
    CertFiles,
    CertificateReloader,
    TlsError,
    server_context,
    write_atomically,
)

logger = logging.getLogger(__name__)

#: Paths asked hundreds of times a second (clients' route lookups, probes, scrapes): an
#: access-log line each would cost more than answering them. Admin actions are in the
#: audit log; every other request is still logged.
QUIET_PATHS = frozenset({"/v1/route", "/healthz", "/metrics"})


class CoordinatorAccessLogger(AccessLogger):
    """aiohttp's access log without the lines for :data:`QUIET_PATHS`."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if request.path in QUIET_PATHS and response.status < 500:
            return
        super().log(request, response, time)


async def serve(config: CoordinatorConfig, *, stop: asyncio.Event | None = None) -> None:
    """Serve gRPC and HTTP until ``stop`` is set or the process gets SIGTERM/SIGINT."""
    stop = asyncio.Event() if stop is None else stop
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    app = create_app(config)
    gc_pauses = GcPauseRecorder(app[METRICS_KEY].gc_pause_seconds)
    gc_pauses.install()
    runner = LimitedAppRunner(
        app,
        config.http_limits(),
        handle_signals=False,
        access_log_class=CoordinatorAccessLogger,
    )
    try:
        await runner.setup()  # starts the gRPC server too (cleanup_ctx)
        ssl_context, reloader = http_tls(config)
        site = web.TCPSite(runner, config.http_host, config.http_port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            raise ServerStartError(
                f"cannot listen for HTTP on {config.http_host}:{config.http_port}: {exc.strerror}"
            ) from exc
        http_host, http_port = runner.addresses[0][:2]
        app[BLOB_BASE_URL_KEY].listening(
            "https" if ssl_context else "http", config.http_host, http_port
        )
        settle_heap()
        grpc_server = app[GRPC_SERVER_KEY]
        logger.info(
            "coordinator ready: grpc=%s http=%s://%s:%d enroll=%s tls=%s",
            grpc_server.address,
            "https" if ssl_context else "http",
            http_host,
            http_port,
            grpc_server.enroll_address,
            "on" if grpc_server.tls else "off",
        )
        app[METRICS_KEY].event_loop_info.labels(loop=running_loop_name()).set(1)
        lag_probe = LoopLagProbe(app[METRICS_KEY].event_loop_lag_seconds)
        lag_probe.start()
        tasks = [asyncio.create_task(_settle_heap(app), name="heap-settler")]
        if config.grpc_thread_nice:
            tasks.append(asyncio.create_task(_lower_grpc_threads(app, config), name="grpc-nice"))
        if reloader is not None:
            interval = 5.0
            tasks.append(asyncio.create_task(reloader.run(interval), name="tls-reloader"))
        try:
            await stop.wait()
        finally:
            lag_probe.stop()
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        logger.info("shutting down")
    finally:
        gc_pauses.uninstall()
        await runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    logger.info("coordinator stopped")


async def _lower_grpc_threads(app: web.Application, config: CoordinatorConfig) -> None:
    """gRPC's threads behind the event loop, those it starts later too (grpc_threads)."""
    gauge = app[METRICS_KEY].grpc_threads_lowered
    while True:
        gauge.set(lower_grpc_threads(config.grpc_thread_nice))
        await asyncio.sleep(RECHECK_S)


def http_tls(config: CoordinatorConfig) -> tuple[ssl.SSLContext | None, CertificateReloader | None]:
    """The HTTP port's TLS context (None: plain HTTP) and, for operator files, its reloader."""
    if not config.http_tls_enabled:
        if not is_loopback_host(config.http_host):
            logger.warning(
                "HTTP on %s without TLS (http_tls = off): admin tokens travel in plaintext",
                config.http_host,
            )
        return None, None
    try:
        if config.http_tls_cert_file:
            files = CertFiles(
                Path(config.http_tls_cert_file).expanduser(),
                Path(config.http_tls_key_file).expanduser(),
            )
            context = server_context(files)
            return context, CertificateReloader(context, files)
        ca = CertificateAuthority.load_or_create(config.data_path / "ca")
        names = [config.http_host, "localhost", "127.0.0.1", "::1", socket.gethostname()]
        names += [n.strip() for n in config.tls_server_names.split(",") if n.strip()]
        issued = ca.issue_server(names)
        where = config.data_path / "tls"
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        files = CertFiles(where / "http.crt", where / "http.key")
        write_atomically(files.key, issued.key_pem, private=True)
        write_atomically(files.cert, issued.cert_pem)
        return server_context(files), None
    except (OSError, TlsError) as exc:
        raise ConfigError(f"cannot serve HTTPS on the HTTP port: {exc}") from exc


async def _settle_heap(app: web.Application, period_s: float = FREEZE_EVERY_S) -> None:
    """Keep long-lived objects out of the collector's way (``HeapSettler``)."""
    settler = HeapSettler()
    registry = app[REGISTRY_KEY]
    while True:
        await asyncio.sleep(period_s)
        settler.tick(registry.connected_count())
