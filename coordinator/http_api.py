"""The coordinator's HTTP API: fleet listing, health and metrics.

Handlers are thin: they read service objects from the app (``coordinator.state``)
and turn dataclasses into JSON. Errors use the OpenAI body shape::

    {"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.errors import UnknownAgentError
from coordinator.fleet import AgentRecord, AgentStatus
from coordinator.state import CONFIG_KEY, GRPC_SERVER_KEY, METRICS_KEY, REGISTRY_KEY

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A connected agent whose last message is older than this many report intervals
# is flagged "stale" (its stream may be half-dead).
STALE_AFTER_INTERVALS = 3


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn HTTP errors and crashes into OpenAI-style JSON error bodies."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        if exc.status == 404:
            return error_response(
                404,
                f"Invalid URL ({request.method} {request.path})",
                type_="invalid_request_error",
                code="not_found",
            )
        if exc.status == 405:
            return error_response(
                405,
                f"Method {request.method} is not allowed for {request.path}",
                type_="invalid_request_error",
                code="method_not_allowed",
                headers=headers,
            )
        return error_response(
            exc.status,
            exc.text or exc.reason,
            type_="invalid_request_error" if exc.status < 500 else "server_error",
            code=None,
            headers=headers,
        )
    except UnknownAgentError as exc:
        return error_response(
            404, str(exc), type_="invalid_request_error", code="agent_not_found", param="agent_id"
        )
    except Exception:
        logger.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(
            500,
            "The coordinator had an error while processing your request.",
            type_="server_error",
            code="internal_error",
        )


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[METRICS_KEY].http_requests.labels(route=route, status=str(response.status)).inc()
    return response


async def list_agents(request: web.Request) -> web.Response:
    now = datetime.now(UTC)
    interval_ms = request.app[CONFIG_KEY].report_interval_ms
    data = [agent_json(r, now, interval_ms) for r in request.app[REGISTRY_KEY].agents()]
    return web.json_response({"object": "list", "data": data})


async def get_agent(request: web.Request) -> web.Response:
    record = request.app[REGISTRY_KEY].get(request.match_info["agent_id"])
    return web.json_response(
        agent_json(record, datetime.now(UTC), request.app[CONFIG_KEY].report_interval_ms)
    )


async def healthz(request: web.Request) -> web.Response:
    grpc_server = request.app[GRPC_SERVER_KEY]
    return web.json_response(
        {
            "status": "ok",
            "grpc": grpc_server.address if grpc_server.port is not None else None,
            "connected_agents": request.app[REGISTRY_KEY].connected_count(),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(
        body=request.app[METRICS_KEY].exposition(),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


ROUTES = [
    web.get("/v1/agents", list_agents),
    web.get("/v1/agents/{agent_id}", get_agent),
    web.get("/healthz", healthz),
    web.get("/metrics", metrics),
]


def agent_json(record: AgentRecord, now: datetime, report_interval_ms: int) -> dict[str, Any]:
    """The JSON view of one agent in GET /v1/agents."""
    hello = record.hello
    stale_after = timedelta(milliseconds=STALE_AFTER_INTERVALS * report_interval_ms)
    report = record.last_report
    return {
        "object": "agent",
        "agent_id": hello.agent_id,
        "site": hello.site,
        "location": None
        if hello.location is None
        else {"lat": hello.location.lat, "lon": hello.location.lon},
        "http_url": hello.http_url,
        "agent_version": hello.agent_version,
        "status": record.status.value,
        "stale": record.status is AgentStatus.CONNECTED and now - record.last_seen > stale_after,
        "session_id": record.session_id,
        "connected_since": iso_time(record.connected_since),
        "last_seen": iso_time(record.last_seen),
        "hardware": {
            "cpu_count": hello.hardware.cpu_count,
            "memory_bytes": hello.hardware.memory_bytes,
            "accelerators": list(hello.hardware.accelerators),
            "execution_providers": list(hello.hardware.execution_providers),
        },
        "models": [asdict(m) for m in hello.models],
        "load": None
        if report is None
        else {**asdict(report), "timestamp": iso_time(report.timestamp)},
        "bye_reason": record.bye_reason,
    }


def iso_time(value: datetime | None) -> str | None:
    """ISO 8601 UTC text, e.g. '2026-01-02T03:04:05.678Z'."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
