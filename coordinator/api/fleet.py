"""The coordinator's HTTP API: fleet listing, route lookup, health and metrics.

Handlers are thin: they read service objects from the app (``coordinator.api.app_keys``)
and turn dataclasses into JSON. Errors use the OpenAI body shape::

    {"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.access.admin_tokens import Role
from coordinator.api.app_keys import (
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    ROUTER_KEY,
)
from coordinator.errors import UnknownAgentError, UnknownTokenRefError
from coordinator.fleet.records import AgentRecord, AgentStatus
from coordinator.routing.scorer import RouteDecision, RouteQuery
from edgefleet.contract import LoadReport, Location

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
    except Exception as exc:
        return exception_response(request, exc)


def exception_response(request: web.Request, exc: Exception) -> web.Response:
    """The OpenAI-style error answer for what a handler raised (re-raises redirects)."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
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
    if isinstance(exc, UnknownAgentError):
        return error_response(
            404, str(exc), type_="invalid_request_error", code="agent_not_found", param="agent_id"
        )
    if isinstance(exc, UnknownTokenRefError):
        return error_response(
            404, str(exc), type_="invalid_request_error", code="token_not_found", param="token_id"
        )
    if isinstance(exc, InvalidParameter):
        return error_response(
            400, str(exc), type_="invalid_request_error", code="invalid_parameter", param=exc.param
        )
    logger.error("unhandled error serving %s %s", request.method, request.path, exc_info=exc)
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
    metrics = request.config_dict[METRICS_KEY]  # config_dict: also under sub-apps (admin)
    metrics.http_requests.labels(route=route, status=str(response.status)).inc()
    return response


# /v1/agents pages: this many agents unless ``limit`` says otherwise, and at most this many.
AGENTS_PAGE_DEFAULT = 500
AGENTS_PAGE_MAX = 1000


async def list_agents(request: web.Request) -> web.Response:
    """One page of agents in id order: ``limit`` of them after the id ``after``.

    The page is chosen on the event loop (records are immutable, so the page is a
    consistent snapshot) and turned into JSON on a worker thread, so that a large page
    does not hold up other requests (/healthz, /v1/route).
    """
    query = request.query
    limit = int(_number(query, "limit", low=1, high=AGENTS_PAGE_MAX) or AGENTS_PAGE_DEFAULT)
    after = query.get("after", "")
    records = request.app[REGISTRY_KEY].agents()  # sorted by agent id
    start = bisect.bisect_right([r.agent_id for r in records], after) if after else 0
    page = records[start : start + limit]
    has_more = start + limit < len(records)
    interval_ms = request.app[CONFIG_KEY].report_interval_ms
    body = await asyncio.to_thread(_agents_page_json, page, has_more, interval_ms)
    return web.Response(body=body, content_type="application/json")


def _agents_page_json(page: list[AgentRecord], has_more: bool, interval_ms: int) -> bytes:
    now = datetime.now(UTC)
    listing = {
        "object": "list",
        "data": [agent_json(r, now, interval_ms) for r in page],
        "first_id": page[0].agent_id if page else None,
        "last_id": page[-1].agent_id if page else None,
        "has_more": has_more,
    }
    return json.dumps(listing).encode()


async def get_agent(request: web.Request) -> web.Response:
    record = request.app[REGISTRY_KEY].get(request.match_info["agent_id"])
    return web.json_response(
        agent_json(record, datetime.now(UTC), request.app[CONFIG_KEY].report_interval_ms)
    )


class InvalidParameter(ValueError):
    """A query parameter is missing or malformed (answered with 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _number(query: Any, name: str, *, low: float, high: float) -> float | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidParameter(name, f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidParameter(name, f"{name} must be within [{low:g}, {high:g}], got {raw}")
    return value


def route_query_from_http(request: web.Request) -> tuple[RouteQuery, str]:
    """Parse GET /v1/route parameters into a RouteQuery and the client IP."""
    q = request.query
    model = q.get("model", "")
    if not model:
        raise InvalidParameter("model", "the model query parameter is required")
    lat = _number(q, "lat", low=-90, high=90)
    lon = _number(q, "lon", low=-180, high=180)
    if (lat is None) != (lon is None):
        raise InvalidParameter("lat" if lat is None else "lon", "give both lat and lon, or neither")
    rtts: dict[str, float] = {}
    for item in ",".join(q.getall("rtt", [])).split(","):
        if not item.strip():
            continue
        agent_id, sep, ms = item.rpartition(":")
        try:
            rtts[agent_id] = float(ms)
        except ValueError:
            sep = ""
        # a time, as the gRPC Route checks it: "nan" scored the agent NaN, answered as
        # "score": NaN (not JSON)
        if not sep or not 0 <= rtts.get(agent_id, -1.0) < math.inf:
            raise InvalidParameter("rtt", f"rtt entries look like AGENT_ID:MS, got {item[:80]!r}")
    exclude = {e.strip() for e in ",".join(q.getall("exclude", [])).split(",") if e.strip()}
    max_wait = _number(q, "max_wait_ms", low=0, high=3_600_000)
    limit = _number(q, "limit", low=0, high=1000)
    model, version = split_model_ref(model, q.get("version") or None)
    query = RouteQuery(
        model=model,
        version=version,
        location=None if lat is None or lon is None else Location(lat=lat, lon=lon),
        site=q.get("site", ""),
        max_wait_ms=int(max_wait or 0),
        exclude=frozenset(exclude),
        client_rtt_ms=rtts,
        limit=int(limit or 0),
    )
    return query, q.get("client_ip") or (request.remote or "")


def split_model_ref(model: str, version: str | None) -> tuple[str, str | None]:
    """``name@version`` -> (name, version); a separate version must agree with it."""
    name, at, pinned = model.partition("@")
    if not at:
        return model, version
    if not name or not pinned:
        raise InvalidParameter("model", f"model {model[:80]!r} must be name or name@version")
    if version is not None and version != pinned:
        raise InvalidParameter("version", f"version {version!r} contradicts model {model!r}")
    return name, pinned


async def route(request: web.Request) -> web.Response:
    query, client_ip = route_query_from_http(request)
    decision = request.app[ROUTER_KEY].route(query, client_ip=client_ip)
    return web.json_response(route_json(query, decision))


def route_json(query: RouteQuery, decision: RouteDecision) -> dict[str, Any]:
    """The public route answer: what a client needs to pick an agent (where, how near,
    how long it would wait, its rank), not the load internals behind the score (queue
    and KV-cache fractions: ``score_parts``), which need a viewer token (/v1/agents)."""
    overflow = decision.overflow
    return {
        "object": "route",
        "model": query.model,
        "version": query.version,
        "agents": [
            {
                "agent_id": a.agent_id,
                "http_url": a.http_url,
                "site": a.site,
                "score": a.score,
                "liveness": a.liveness.value,
                "distance_km": a.distance_km,
                "predicted_wait_ms": a.predicted_wait_ms,
            }
            for a in decision.agents
        ],
        "overflow": None
        if overflow is None
        else {
            "name": overflow.name,
            "kind": overflow.kind.value,
            "url": overflow.url,
            "models": list(overflow.models),
        },
        "excluded": dict(decision.excluded),
        "reason": decision.reason,
    }


async def healthz(request: web.Request) -> web.Response:
    grpc_server = request.app[GRPC_SERVER_KEY]
    return web.json_response(
        {
            "status": "ok",
            "grpc": grpc_server.address if grpc_server.port is not None else None,
            "connected_agents": request.app[REGISTRY_KEY].connected_count(),
            "tls": grpc_server.tls,
            "enroll": grpc_server.enroll_address if grpc_server.port is not None else None,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(
        body=request.app[METRICS_KEY].exposition(),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def openapi(request: web.Request) -> web.Response:
    from coordinator.api.openapi import openapi_document

    return web.json_response(openapi_document())


ROUTES = [
    web.get("/v1/agents", list_agents),
    web.get("/v1/agents/{agent_id}", get_agent),
    web.get("/v1/route", route),
    web.get("/healthz", healthz),
    web.get("/metrics", metrics),
    web.get("/openapi.json", openapi),
]
# The role each route of the main app needs (None: public); the admin API's routes
# declare theirs in coordinator.api.admin.ADMIN_ROUTES. Together: admin_api.route_roles().
ROUTE_ROLES: dict[tuple[str, str], Role | None] = {
    ("GET", "/v1/agents"): Role.VIEWER,
    ("GET", "/v1/agents/{agent_id}"): Role.VIEWER,
    ("GET", "/metrics"): Role.VIEWER,
    # What a client needs to pick an agent; no load internals (see route_json).
    ("GET", "/v1/route"): None,
    ("GET", "/healthz"): None,
    ("GET", "/openapi.json"): None,
}


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
        "liveness": record.liveness.value,
        "draining": record.draining,
        "enrolled": record.enrolled,
        "session_id": record.session_id,
        "connected_since": iso_time(record.connected_since),
        "last_seen": iso_time(record.last_seen),
        "hardware": {
            "cpu_count": hello.hardware.cpu_count,
            "memory_bytes": hello.hardware.memory_bytes,
            "execution_providers": list(hello.hardware.execution_providers),
        },
        "models": [asdict(m) for m in hello.models],
        "load": None if report is None else load_json(report),
        "healthy": not record.unhealthy_reason,
        "unhealthy_reason": record.unhealthy_reason or None,
        "contract_minor": hello.contract_minor,
        "desired_state": {
            "version": record.desired.version,
            # The generation of each section the coordinator set, and the agent applied.
            "generations": record.desired.generations()._asdict(),
            "applied": None if report is None else report.applied._asdict(),
        },
        "bye_reason": record.bye_reason,
    }


def load_json(report: LoadReport) -> dict[str, Any]:
    """A load report as JSON: its figures, what it applied, and the model inventory
    (per-interval model stats are the rollouts' to aggregate, not shown here)."""
    view = report._asdict()
    view["applied"] = report.applied._asdict()
    view["inventory"] = [
        {**item._asdict(), "self_check": None if item.self_check is None
         else item.self_check._asdict()}
        for item in report.inventory
    ]  # fmt: skip
    view.pop("model_stats", None)
    return view


def iso_time(value: datetime | None) -> str | None:
    """ISO 8601 UTC text, e.g. '2026-01-02T03:04:05.678Z'."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
