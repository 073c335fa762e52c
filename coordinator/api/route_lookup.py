"""``GET /v1/route``: a client's question in, the ranked agents out (no load internals)."""

from __future__ import annotations

import math
from typing import Any

import orjson
from aiohttp import web

from coordinator.api.app_keys import (
    KEY_DISTRIBUTOR_KEY,
    ROUTER_KEY,
)
from coordinator.api.common import InvalidParameter, query_number
from coordinator.routing.scorer import RouteDecision, RouteQuery
from edgefleet.contract import Location


def route_query_from_http(request: web.Request) -> tuple[RouteQuery, str]:
    """Parse GET /v1/route parameters into a RouteQuery and the client IP."""
    q = request.query
    model = q.get("model", "")
    if not model:
        raise InvalidParameter("model", "the model query parameter is required")
    lat = query_number(q, "lat", low=-90, high=90)
    lon = query_number(q, "lon", low=-180, high=180)
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
    max_wait = query_number(q, "max_wait_ms", low=0, high=3_600_000)
    limit = query_number(q, "limit", low=0, high=1000)
    model, version = split_model_ref(model, q.get("version") or None)
    moderation = _key_blocks(request)
    query = RouteQuery(
        model=model,
        version=version,
        location=None if lat is None or lon is None else Location(lat=lat, lon=lon),
        site=q.get("site", ""),
        max_wait_ms=int(max_wait or 0),
        exclude=frozenset(exclude),
        client_rtt_ms=rtts,
        limit=int(limit or 0),
        moderation=moderation,
    )
    return query, q.get("client_ip") or (request.remote or "")


def _key_blocks(request: web.Request) -> bool:
    """A lookup may present the client's API key (``Authorization: Bearer ef-...``, what
    it sends to agents); when the key's policy blocks a moderation category, only agents
    that enforce it are answered (KeyDistributor.needs_content_safety)."""
    authorization = request.headers.get("Authorization", "")
    return request.config_dict[KEY_DISTRIBUTOR_KEY].needs_content_safety(authorization)


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
    # orjson: the standard library's encoder was about a tenth of a lookup's CPU (the
    # answer's floats); same JSON, without the spaces after separators
    return web.Response(
        body=orjson.dumps(route_json(query, decision)), content_type="application/json"
    )


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
