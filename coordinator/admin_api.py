"""The admin HTTP API: join tokens, API keys and draining. Thin handlers over the services.

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

from coordinator.api_keys import PRIORITIES
from coordinator.app_keys import (
    API_KEYS_KEY,
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    KEY_DISTRIBUTOR_KEY,
    REGISTRY_KEY,
    TOKENS_KEY,
)
from coordinator.config import is_loopback_host
from coordinator.errors import UnknownApiKeyError
from coordinator.fleet_store import ApiKeyRecord, JoinToken
from coordinator.http_api import (
    Handler,
    InvalidParameter,
    agent_json,
    error_response,
    iso_time,
)

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
    }


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
    if not isinstance(site, str) or not isinstance(note, str):
        raise InvalidParameter("site", "site and note must be strings")
    created = request.config_dict[TOKENS_KEY].create(
        expires_in=None if expires_in_s is None else timedelta(seconds=expires_in_s),
        max_uses=max_uses,
        site=site,
        note=note,
    )
    data = token_json(created.record, datetime.now(UTC)) | {"token": created.token}
    return web.json_response(data, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    now = datetime.now(UTC)
    data = [token_json(t, now) for t in request.config_dict[TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_token(request: web.Request) -> web.Response:
    token_id = request.match_info["token_id"]
    request.config_dict[TOKENS_KEY].revoke(token_id)
    return web.json_response({"object": "join_token", "token_id": token_id, "state": "revoked"})


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


def api_key_json(key: ApiKeyRecord, now: datetime) -> dict[str, Any]:
    """An API key as the admin API and CLI show it (never the secret nor its digest)."""
    return {
        "object": "api_key",
        "key_id": key.key_id,
        "name": key.name,
        "created_at": iso_time(key.created_at),
        "expires_at": iso_time(key.expires_at),
        "revoked_at": iso_time(key.revoked_at),
        "state": key.state(now),
        "models": list(key.models),
        "allow_cloud": key.allow_cloud,
        "max_priority": key.max_priority,
        "max_tokens_per_request": key.max_tokens_per_request,
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        "usage": {
            "requests": key.requests,
            "prompt_tokens": key.prompt_tokens,
            "completion_tokens": key.completion_tokens,
            "rejected": key.rejected,
        },
    }


def _number(body: dict[str, Any], name: str) -> float:
    value = body.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidParameter(name, f"{name} must be a number >= 0 (0: unlimited)")
    return float(value)


def _key_not_found(exc: UnknownApiKeyError) -> web.Response:
    return error_response(
        404, str(exc), type_="invalid_request_error", code="api_key_not_found", param="key_id"
    )


async def mint_key(request: web.Request) -> web.Response:
    """Mint an API key; the secret is in this response only."""
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise InvalidParameter("body", "the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidParameter("body", "the request body must be a JSON object")
    name, models = body.get("name", ""), body.get("models", [])
    if not isinstance(name, str):
        raise InvalidParameter("name", "name must be a string")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise InvalidParameter("models", "models must be a list of 'name' or 'name@version'")
    priority = body.get("max_priority", "normal")
    if priority not in PRIORITIES:
        raise InvalidParameter("max_priority", "max_priority must be high, normal or low")
    allow_cloud = body.get("allow_cloud", False)
    if not isinstance(allow_cloud, bool):
        raise InvalidParameter("allow_cloud", "allow_cloud must be true or false")
    max_tokens = _int(body, "max_tokens_per_request", 0) or 0
    expires_in_s = _int(body, "expires_in_s", None)
    if expires_in_s is not None and expires_in_s <= 0:
        raise InvalidParameter("expires_in_s", "expires_in_s must be positive (or null)")
    try:
        minted = request.config_dict[API_KEYS_KEY].mint(
            name=name,
            models=models,
            allow_cloud=allow_cloud,
            max_priority=priority,
            max_tokens_per_request=max_tokens,
            requests_per_minute=_number(body, "requests_per_minute"),
            tokens_per_minute=_number(body, "tokens_per_minute"),
            expires_in=None if expires_in_s is None else timedelta(seconds=expires_in_s),
        )
    except ValueError as exc:
        raise InvalidParameter("body", str(exc)) from None
    pushed = request.config_dict[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    data = api_key_json(minted.record, datetime.now(UTC))
    return web.json_response(data | {"secret": minted.secret, "agents_updated": pushed}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    now = datetime.now(UTC)
    data = [api_key_json(k, now) for k in request.config_dict[API_KEYS_KEY].list_all()]
    return web.json_response({"object": "list", "data": data})


async def show_key(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    try:
        record = request.config_dict[API_KEYS_KEY].get(key_id)
    except UnknownApiKeyError as exc:
        return _key_not_found(exc)
    shares = request.config_dict[KEY_DISTRIBUTOR_KEY].shares_of(key_id)
    view = api_key_json(record, datetime.now(UTC))
    view["agent_shares"] = {
        agent: {"requests_per_minute": rpm, "tokens_per_minute": tpm}
        for agent, (rpm, tpm) in sorted(shares.items())
    }
    return web.json_response(view)


async def revoke_key(request: web.Request) -> web.Response:
    """Revoke a key; every connected agent gets the new key set at once."""
    try:
        record = request.config_dict[API_KEYS_KEY].revoke(request.match_info["key_id"])
    except UnknownApiKeyError as exc:
        return _key_not_found(exc)
    pushed = request.config_dict[KEY_DISTRIBUTOR_KEY].refresh(force=True)
    data = api_key_json(record, datetime.now(UTC))
    return web.json_response(data | {"agents_updated": pushed})


# Relative to ADMIN_PREFIX.
ADMIN_ROUTES = [
    web.post("/keys", mint_key),
    web.get("/keys", list_keys),
    web.get("/keys/{key_id}", show_key),
    web.delete("/keys/{key_id}", revoke_key),
    web.post("/tokens", create_token),
    web.get("/tokens", list_tokens),
    web.delete("/tokens/{token_id}", revoke_token),
    web.post("/agents/{agent_id}/drain", drain_agent),
    web.post("/agents/{agent_id}/resume", resume_agent),
]


def create_admin_app() -> web.Application:
    """The admin routes behind ``require_admin``; mount with ``add_subapp(ADMIN_PREFIX, ...)``."""
    admin = web.Application(middlewares=[require_admin])
    admin.add_routes(ADMIN_ROUTES)
    return admin
