"""The admin HTTP API: join tokens and draining. Thin handlers over the services.

Callers must present ``Authorization: Bearer <admin_token>`` when ``admin_token`` is
configured; without one, only loopback clients are let in.
"""

from __future__ import annotations

import hmac
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.app_keys import CONFIG_KEY, GRPC_SERVER_KEY, REGISTRY_KEY, TOKENS_KEY
from coordinator.config import is_loopback_host
from coordinator.fleet_store import JoinToken
from coordinator.http_api import InvalidParameter, agent_json, error_response, iso_time

logger = logging.getLogger(__name__)


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
    }


def _admin_refusal(request: web.Request) -> web.Response | None:
    expected = request.app[CONFIG_KEY].admin_token
    if expected:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), expected):
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
    if (refusal := _admin_refusal(request)) is not None:
        return refusal
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
    if not isinstance(site, str) or not isinstance(note, str):
        raise InvalidParameter("site", "site and note must be strings")
    created = request.app[TOKENS_KEY].create(
        expires_in=None if expires_in_s is None else timedelta(seconds=expires_in_s),
        max_uses=max_uses,
        site=site,
        note=note,
    )
    data = token_json(created.record, datetime.now(UTC)) | {"token": created.token}
    return web.json_response(data, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    if (refusal := _admin_refusal(request)) is not None:
        return refusal
    now = datetime.now(UTC)
    data = [token_json(t, now) for t in request.app[TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_token(request: web.Request) -> web.Response:
    if (refusal := _admin_refusal(request)) is not None:
        return refusal
    token_id = request.match_info["token_id"]
    request.app[TOKENS_KEY].revoke(token_id)
    return web.json_response({"object": "join_token", "token_id": token_id, "state": "revoked"})


async def _set_draining(request: web.Request, draining: bool) -> web.Response:
    if (refusal := _admin_refusal(request)) is not None:
        return refusal
    agent_id = request.match_info["agent_id"]
    record = request.app[REGISTRY_KEY].set_draining(agent_id, draining)
    kind = "drain" if draining else "resume"
    sent = request.app[GRPC_SERVER_KEY].servicer.send_command(
        agent_id, kind, f"{kind} requested by an operator"
    )
    view = agent_json(record, datetime.now(UTC), request.app[CONFIG_KEY].report_interval_ms)
    return web.json_response(view | {"command_sent": sent})


async def drain_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, True)


async def resume_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, False)


ADMIN_ROUTES = [
    web.post("/v1/admin/tokens", create_token),
    web.get("/v1/admin/tokens", list_tokens),
    web.delete("/v1/admin/tokens/{token_id}", revoke_token),
    web.post("/v1/admin/agents/{agent_id}/drain", drain_agent),
    web.post("/v1/admin/agents/{agent_id}/resume", resume_agent),
]
