"""The admin HTTP API: join tokens, draining, and the agent lifecycle (set, revoke,
remove). Thin handlers over the services.

Every admin route lives in one sub-application (``create_admin_app``, mounted at
``ADMIN_PREFIX``) whose middleware checks the caller before any handler runs: a
route added there cannot forget the check. Callers must present
``Authorization: Bearer <admin_token>`` when ``admin_token`` is configured (compared
in constant time; 401 otherwise); without one, only loopback clients are let in (403).
Handlers read the coordinator's services through ``request.config_dict``.
"""

from __future__ import annotations

import hmac
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.app_keys import (
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    LIFECYCLE_KEY,
    REGISTRY_KEY,
    TOKENS_KEY,
)
from coordinator.config import is_loopback_host
from coordinator.errors import ProtocolError
from coordinator.fleet_store import JoinToken, StoredAgent
from coordinator.http_api import (
    Handler,
    InvalidParameter,
    agent_json,
    error_response,
    iso_time,
)
from coordinator.proto_convert import location_checked
from coordinator.tokens import check_http_url
from edgefleet.contract import Location

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/v1/admin"


def token_json(token: JoinToken, now: datetime) -> dict[str, Any]:
    return {
        "object": "join_token",
        "token_id": token.token_id,
        "created_at": iso_time(token.created_at),
        "expires_at": iso_time(token.expires_at),
        "max_uses": token.max_uses,
        "uses": token.uses,
        "site": token.site,
        "note": token.note,
        "state": token.state(now),
        "location": _location_json(token.location),
        "http_url": token.http_url,
    }


def _location_json(location: Location | None) -> dict[str, float] | None:
    return None if location is None else {"lat": location.lat, "lon": location.lon}


def stored_agent_json(agent: StoredAgent | None, agent_id: str) -> dict[str, Any]:
    """What the operator fixed for an agent, and its enrollment state."""
    if agent is None:
        return {"object": "agent_record", "agent_id": agent_id, "removed": True}
    return {
        "object": "agent_record",
        "agent_id": agent.agent_id,
        "enrolled": agent.enrolled,
        "token_id": agent.token_id,
        "site": agent.site,
        "location": _location_json(agent.location),
        "http_url": agent.http_url,
        "cert_serial": agent.cert_serial,
        "cert_not_after": iso_time(agent.cert_not_after),
        "revoked": agent.revoked,
        "revoked_at": iso_time(agent.revoked_at),
        "removed": False,
    }


def location_from(lat: Any, lon: Any) -> Location | None:
    """A Location from optional lat/lon values; raises InvalidParameter."""
    if lat is None and lon is None:
        return None
    for name, value in (("lat", lat), ("lon", lon)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidParameter(name, f"{name} must be a number (give lat and lon together)")
    try:
        return location_checked(float(lat), float(lon), "location")
    except ProtocolError as exc:
        raise InvalidParameter("location", str(exc)) from exc


def _token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison; any text (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape")
    )


@web.middleware
async def require_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The admin sub-application's gate: refuse before the handler runs."""
    refusal = _admin_refusal(request)
    if refusal is not None:
        return refusal
    return await handler(request)


def _admin_refusal(request: web.Request) -> web.Response | None:
    expected = request.config_dict[CONFIG_KEY].admin_token
    if expected:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and _token_matches(given.strip(), expected):
            return None
        logger.warning("refused admin request %s %s from %s", request.method, request.path,
                       request.remote)  # fmt: skip
        return error_response(
            401,
            "The admin API needs Authorization: Bearer <admin_token>.",
            type_="authentication_error",
            code="invalid_admin_token",
        )
    if is_loopback_host(request.remote or ""):
        return None
    logger.warning("refused admin request %s %s from %s (not loopback, no admin_token set)",
                   request.method, request.path, request.remote)  # fmt: skip
    return error_response(
        403,
        "The admin API is only open to loopback clients unless admin_token is set.",
        type_="permission_error",
        code="admin_loopback_only",
    )


def _int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InvalidParameter(name, f"{name} must be an integer, got {value!r}")
    return int(value)


async def create_token(request: web.Request) -> web.Response:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise InvalidParameter("body", "the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidParameter("body", "the request body must be a JSON object")
    expires_in_s = _int(body, "expires_in_s", 86_400)
    max_uses = _int(body, "max_uses", 1)
    if expires_in_s is not None and expires_in_s <= 0:
        raise InvalidParameter("expires_in_s", "expires_in_s must be positive (or null)")
    if max_uses is None or max_uses < 1:
        raise InvalidParameter("max_uses", "max_uses must be at least 1")
    site, note = body.get("site", ""), body.get("note", "")
    http_url = body.get("http_url", "")
    if not isinstance(site, str) or not isinstance(note, str) or not isinstance(http_url, str):
        raise InvalidParameter("site", "site, note and http_url must be strings")
    location = location_from(body.get("lat"), body.get("lon"))
    try:
        created = request.config_dict[TOKENS_KEY].create(
            expires_in=None if expires_in_s is None else timedelta(seconds=expires_in_s),
            max_uses=max_uses,
            site=site,
            note=note,
            location=location,
            http_url=http_url,
        )
    except ValueError as exc:
        raise InvalidParameter("http_url", str(exc)) from exc
    data = token_json(created.record, datetime.now(UTC)) | {"token": created.token}
    return web.json_response(data, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    now = datetime.now(UTC)
    data = [token_json(t, now) for t in request.config_dict[TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_token(request: web.Request) -> web.Response:
    """Revoke a join token (no new enrollments); ``?agents=true`` revokes the agents
    enrolled with it too (their sessions end at once)."""
    token_id = request.match_info["token_id"]
    request.config_dict[TOKENS_KEY].revoke(token_id)
    data: dict[str, Any] = {"object": "join_token", "token_id": token_id, "state": "revoked"}
    if request.query.get("agents", "").lower() in ("1", "true", "yes"):
        data["revoked_agents"] = request.config_dict[LIFECYCLE_KEY].revoke_agents_of_token(token_id)
    return web.json_response(data)


async def set_agent(request: web.Request) -> web.Response:
    """Fix an agent's site, location (lat + lon) and/or URL: PATCH body, fields optional."""
    agent_id = request.match_info["agent_id"]
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise InvalidParameter("body", "the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidParameter("body", "the request body must be a JSON object")
    site, http_url = body.get("site"), body.get("http_url")
    if site is not None and not isinstance(site, str):
        raise InvalidParameter("site", "site must be a string")
    if http_url is not None:
        if not isinstance(http_url, str):
            raise InvalidParameter("http_url", "http_url must be a string")
        if http_url:
            try:
                check_http_url(http_url)
            except ValueError as exc:
                raise InvalidParameter("http_url", str(exc)) from exc
    location = location_from(body.get("lat"), body.get("lon"))
    result = request.config_dict[LIFECYCLE_KEY].set_fixed(
        agent_id, site=site, location=location, http_url=http_url
    )
    view = stored_agent_json(result.stored, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def revoke_agent(request: web.Request) -> web.Response:
    agent_id = request.match_info["agent_id"]
    result = request.config_dict[LIFECYCLE_KEY].revoke(agent_id)
    view = stored_agent_json(result.stored, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def remove_agent(request: web.Request) -> web.Response:
    agent_id = request.match_info["agent_id"]
    result = request.config_dict[LIFECYCLE_KEY].remove(agent_id)
    view = stored_agent_json(None, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def _set_draining(request: web.Request, draining: bool) -> web.Response:
    agent_id = request.match_info["agent_id"]
    record = request.config_dict[REGISTRY_KEY].set_draining(agent_id, draining)
    kind = "drain" if draining else "resume"
    sent = request.config_dict[GRPC_SERVER_KEY].servicer.send_command(
        agent_id, kind, f"{kind} requested by an operator"
    )
    interval_ms = request.config_dict[CONFIG_KEY].report_interval_ms
    view = agent_json(record, datetime.now(UTC), interval_ms)
    return web.json_response(view | {"command_sent": sent})


async def drain_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, True)


async def resume_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, False)


# Relative to ADMIN_PREFIX.
ADMIN_ROUTES = [
    web.post("/tokens", create_token),
    web.get("/tokens", list_tokens),
    web.delete("/tokens/{token_id}", revoke_token),
    web.post("/agents/{agent_id}/drain", drain_agent),
    web.post("/agents/{agent_id}/resume", resume_agent),
    web.patch("/agents/{agent_id}", set_agent),
    web.post("/agents/{agent_id}/revoke", revoke_agent),
    web.delete("/agents/{agent_id}", remove_agent),
]


def create_admin_app() -> web.Application:
    """The admin routes behind ``require_admin``; mount with ``add_subapp(ADMIN_PREFIX, ...)``."""
    admin = web.Application(middlewares=[require_admin])
    admin.add_routes(ADMIN_ROUTES)
    return admin
