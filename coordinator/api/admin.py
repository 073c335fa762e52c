"""Who may call which HTTP route, and the admin HTTP API: join tokens, API keys, draining,
the agent lifecycle (set, revoke, remove), admin tokens, the audit log. Thin handlers over
the services.

Roles (``coordinator.access.admin_tokens.Role``): viewer < operator < admin. Every route of the
coordinator's HTTP server, the admin API's included, names the role it needs in ONE
table, ``route_roles()``: the public app's routes in ``http_api.ROUTE_ROLES`` and the
admin routes in ``ADMIN_ROUTES`` below (each an ``AdminRoute`` with its role; to add an
admin route, add one line there). The ``authorize`` middleware on the main app checks
the caller before any handler runs, and a route missing from the table is refused
(fail closed; a test enumerates the router so none is missing).

Callers present ``Authorization: Bearer <token>`` (an admin token, or the bootstrap
token), or the dashboard's session cookie (coordinator.api.dashboard: state-changing requests
with it must carry the coordinator's own Origin). A missing or unknown token gets 401
``invalid_admin_token``, a token whose role is too low 403 ``insufficient_role``. Being
on loopback grants nothing.

Every admin action (any request that is not GET/HEAD on a guarded route) is appended
to the audit log with its outcome, and so are refusals (rate-capped, see
``coordinator.access.audit``).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.access.admin_tokens import Caller, Role
from coordinator.access.api_keys import MAX_TOKENS_PER_REQUEST, PRIORITIES
from coordinator.access.audit import MAX_PAGE, to_jsonl
from coordinator.api.app_keys import (
    ADMIN_TOKENS_KEY,
    API_KEYS_KEY,
    AUDIT_KEY,
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    KEY_DISTRIBUTOR_KEY,
    LIFECYCLE_KEY,
    RECORDS_KEY,
    REGISTRY_KEY,
    ROLLOUTS_KEY,
    ROUTE_ROLES_KEY,
    TOKENS_KEY,
)
from coordinator.api.dashboard import (
    DASHBOARD_ROUTE_ROLES,
    EVENTS_KEY,
    fleet_events,
    fleet_series,
    same_origin,
    session_caller,
)
from coordinator.api.fleet import (
    ROUTE_ROLES,
    Handler,
    InvalidParameter,
    agent_json,
    error_response,
    exception_response,
    iso_time,
)
from coordinator.api.models import (
    AGENT_ROUTES,
    BLOB_ROUTE,
    agent_may_read,
    delete_model,
    deploy_model,
    deprecate_model,
    list_models,
    missing_blobs,
    publish_model,
    show_model,
    upload_blob,
)
from coordinator.errors import ProtocolError, UnknownApiKeyError
from coordinator.identity.join_tokens import check_http_url
from coordinator.rollouts.engine import RolloutEngine, RolloutError
from coordinator.rpc.convert import location_checked
from coordinator.store.interface import ApiKeyRecord, JoinToken, StoredAgent
from coordinator.store.rollouts import PolicyError, Rollout, RolloutPolicy, RolloutState
from edgefleet.contract import Location

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/v1/admin"
CALLER_KEY = web.RequestKey("caller", Caller)
READ_METHODS = frozenset({"GET", "HEAD"})
TEN_YEARS_S = 10 * 365 * 86_400


@dataclass(frozen=True, slots=True)
class AdminRoute:
    """One admin route: method, path relative to ADMIN_PREFIX, handler, needed role."""

    method: str
    path: str
    handler: Handler
    role: Role
    summary: str

    def route_def(self) -> web.RouteDef:
        if self.method == "GET":
            return web.get(self.path, self.handler)  # and HEAD
        return web.route(self.method, self.path, self.handler)


# ------------------------------------------------------------------ authorization


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    return given.strip()


def _route_key(request: web.Request) -> tuple[str, str] | None:
    """(method, canonical path) of the matched route; None for 404/405 answers."""
    route = request.match_info.route
    resource = route.resource
    if resource is None or request.match_info.http_exception is not None:
        return None
    method = "GET" if route.method == "HEAD" else route.method
    return method, resource.canonical


@web.middleware
async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The gate: the caller's role must reach the route's (``route_roles()``)."""
    key = _route_key(request)
    if key is None:  # no such route (404) or method (405): the handler says so
        return await handler(request)
    roles = request.config_dict[ROUTE_ROLES_KEY]
    if key not in roles:
        logger.error("route %s %s declares no role: refused", *key)
        return _refuse(request, 403, "This route declares no role.", "route_without_role")
    needed = roles[key]
    if needed is None:
        return await handler(request)
    token = _bearer(request)
    if token is not None:
        caller = request.config_dict[ADMIN_TOKENS_KEY].check(token)
    else:  # the dashboard's session cookie; state changes only from its own origin
        caller = session_caller(request)
        if caller is not None and request.method not in READ_METHODS and not same_origin(request):
            request[CALLER_KEY] = caller
            return _refuse(
                request,
                403,
                "A request signed in by the dashboard's session cookie must come from the "
                "dashboard's own origin (Origin header).",
                "cross_origin",
            )
    if caller is None and key in AGENT_ROUTES and agent_may_read(request):
        return await handler(request)  # an agent with its own credential (model_http)
    if caller is None:
        return _refuse(
            request,
            401,
            f"This route needs Authorization: Bearer <admin token> (role {needed.label} or above).",
            "invalid_admin_token",
            type_="authentication_error",
        )
    request[CALLER_KEY] = caller
    if caller.role < needed:
        return _refuse(
            request,
            403,
            f"This route needs role {needed.label}; the token {caller.name!r} has role "
            f"{caller.role.label}.",
            "insufficient_role",
        )
    if request.method in READ_METHODS:
        return await handler(request)
    try:
        response: web.StreamResponse = await handler(request)
    except Exception as exc:  # answered here so that the audit sees the outcome
        response = exception_response(request, exc)
    _audit(request, caller, response.status)
    return response


def _target(request: web.Request) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(request.match_info.items()))


def _audit(request: web.Request, caller: Caller, status: int) -> None:
    request.config_dict[AUDIT_KEY].append(
        action=f"{request.method} {request.match_info.route.resource.canonical}"
        if request.match_info.route.resource is not None
        else f"{request.method} {request.path}",
        outcome="ok" if status < 400 else "failed",
        status=status,
        actor_id=caller.token_id,
        actor_name=caller.name,
        role=caller.role.label,
        target=_target(request),
        peer=request.remote or "",
    )


def _refuse(
    request: web.Request,
    status: int,
    message: str,
    code: str,
    *,
    type_: str = "permission_error",
) -> web.Response:
    caller = request.get(CALLER_KEY)
    logger.warning("refused %s %s from %s: %s", request.method, request.path, request.remote,
                   code)  # fmt: skip
    request.config_dict[AUDIT_KEY].append_refusal(
        action=f"{request.method} {request.path}",
        outcome="refused",
        status=status,
        actor_id="" if caller is None else caller.token_id,
        actor_name="" if caller is None else caller.name,
        role="" if caller is None else caller.role.label,
        peer=request.remote or "",
        detail=code,
    )
    return error_response(status, message, type_=type_, code=code)


# ------------------------------------------------------------------ handlers


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


def _int(
    body: Mapping[str, Any], name: str, default: int | None, low: int, high: int
) -> int | None:
    """An optional integer field within [low, high] (an integral JSON number such as 1e3
    counts); raises InvalidParameter."""
    value = body.get(name, default)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())  # NaN and inf too
    ):
        raise InvalidParameter(name, f"{name} must be an integer, got {_shown(value)}")
    if not low <= value <= high:
        raise InvalidParameter(name, f"{name} must be within [{low}, {high}], got {_shown(value)}")
    return int(value)


def _shown(value: Any) -> str:
    """A request's value in an error message, cut short."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return text if len(text) <= 60 else text[:57] + "..."


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON, beyond a double
        raise ValueError(f"the number {text[:40]} is beyond a double")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body ({} when there is none); 400 otherwise."""
    # body_exists, not can_read_body: the server's body_deadline middleware has already
    # read the body (cached for json()), and can_read_body is False once it was read.
    if not request.body_exists:
        return {}
    # Strict JSON: Python's json reads NaN and Infinity (not JSON) and turns 1e400 into
    # inf; no handler or store is ever handed a non-finite number.
    try:
        body = json.loads(
            await request.text(), parse_constant=_no_constant, parse_float=_finite_float
        )
    except ValueError as exc:
        raise InvalidParameter(
            "body", f"the request body must be a JSON object ({str(exc)[:100]})"
        ) from None
    if not isinstance(body, dict):
        raise InvalidParameter("body", "the request body must be a JSON object")
    return body


async def create_token(request: web.Request) -> web.Response:
    body = await json_body(request)
    expires_in_s = _int(body, "expires_in_s", 86_400, 1, TEN_YEARS_S)
    max_uses = _int(body, "max_uses", 1, 1, 1_000_000)
    if max_uses is None:
        raise InvalidParameter("max_uses", "max_uses must be within 1 and 1000000")
    site, note = body.get("site", ""), body.get("note", "")
    http_url = body.get("http_url", "")
    if not isinstance(site, str) or not isinstance(note, str) or not isinstance(http_url, str):
        raise InvalidParameter("site", "site, note and http_url must be strings")
    if len(site) > 256 or len(note) > 1024 or len(http_url) > 2048:
        raise InvalidParameter("site", "site (256), note (1024) or http_url (2048) is too long")
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
    body = await json_body(request)
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
    request.config_dict[EVENTS_KEY].on_change(agent_id)
    view = agent_json(record, datetime.now(UTC), interval_ms)
    return web.json_response(view | {"command_sent": sent})


async def drain_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, True)


async def resume_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, False)


async def mint_admin_token(request: web.Request) -> web.Response:
    body = await json_body(request)
    role_text, name = body.get("role"), body.get("name")
    if not isinstance(role_text, str):
        raise InvalidParameter("role", "role must be viewer, operator or admin")
    if not isinstance(name, str):
        raise InvalidParameter("name", "name must be a string")
    try:
        role = Role.parse(role_text)
    except ValueError as exc:
        raise InvalidParameter("role", str(exc)) from None
    caller = request[CALLER_KEY]
    try:
        created = request.config_dict[ADMIN_TOKENS_KEY].mint(
            role, name, created_by=f"{caller.name} ({caller.token_id})"
        )
    except ValueError as exc:
        raise InvalidParameter("name", str(exc)) from None
    return web.json_response(created.record.json() | {"token": created.token}, status=201)


async def list_admin_tokens(request: web.Request) -> web.Response:
    data = [t.json() for t in request.config_dict[ADMIN_TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_admin_token(request: web.Request) -> web.Response:
    record = request.config_dict[ADMIN_TOKENS_KEY].revoke(request.match_info["token_id"])
    return web.json_response(record.json())


async def whoami(request: web.Request) -> web.Response:
    caller = request[CALLER_KEY]
    return web.json_response(
        {"object": "caller", "token_id": caller.token_id, "name": caller.name,
         "role": caller.role.label}
    )  # fmt: skip


def _since(request: web.Request) -> datetime | None:
    raw = request.query.get("since", "")
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidParameter("since", f"since must be an ISO 8601 time, got {raw!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _query_int(request: web.Request, name: str, default: int, high: int) -> int:
    raw = request.query.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidParameter(name, f"{name} must be an integer, got {raw!r}") from None
    if not 0 <= value <= high:
        raise InvalidParameter(name, f"{name} must be within [0, {high}]")
    return value


async def audit_log(request: web.Request) -> web.StreamResponse:
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "jsonl"):
        raise InvalidParameter("format", "format must be json or jsonl")
    entries = request.config_dict[AUDIT_KEY].entries(
        since=_since(request),
        after_seq=_query_int(request, "after_seq", 0, 2**62),
        limit=_query_int(request, "limit", 1000 if fmt == "json" else MAX_PAGE, MAX_PAGE),
    )
    if fmt == "json":
        return web.json_response({"object": "list", "data": [e.json() for e in entries]})
    return web.Response(text="".join(to_jsonl(entries)), content_type="application/jsonl")


async def request_records(request: web.Request) -> web.Response:
    records = request.config_dict[RECORDS_KEY].list(
        agent_id=request.query.get("agent_id") or None,
        after_seq=_query_int(request, "after_seq", 0, 2**62),
        limit=_query_int(request, "limit", 1000, 10_000),
    )
    return web.json_response({"object": "list", "data": records})


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
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= sys.float_info.max  # NaN, inf and ints beyond a double too
    ):
        raise InvalidParameter(name, f"{name} must be a finite number >= 0 (0: unlimited)")
    return float(value)


def _key_not_found(exc: UnknownApiKeyError) -> web.Response:
    return error_response(
        404, str(exc), type_="invalid_request_error", code="api_key_not_found", param="key_id"
    )


async def mint_key(request: web.Request) -> web.Response:
    """Mint an API key; the secret is in this response only."""
    body = await json_body(request)
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
    # The wire's limit (ApiKey.max_tokens_per_request is a uint32): a larger cap was
    # stored, then failed every conversion of the keys section for an agent (a 500 here,
    # and every agent's session ended at its first message, at every reconnect).
    max_tokens = _int(body, "max_tokens_per_request", 0, 0, MAX_TOKENS_PER_REQUEST) or 0
    expires_in_s = _int(body, "expires_in_s", None, 1, TEN_YEARS_S)  # null: never
    requests_per_minute = _number(body, "requests_per_minute")
    tokens_per_minute = _number(body, "tokens_per_minute")
    try:
        minted = request.config_dict[API_KEYS_KEY].mint(
            name=name,
            models=models,
            allow_cloud=allow_cloud,
            max_priority=priority,
            max_tokens_per_request=max_tokens,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
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


# The admin API (paths relative to ADMIN_PREFIX) and the role each route needs.
# Role rules (README "Admin roles"): reading is viewer; steering agents and rollouts,
# models and overflow targets is operator; keys, join tokens, agent revocation and
# admin tokens are admin.


# ------------------------------------------------------------------ model rollouts


class RolloutsUnavailable(Exception):
    """This coordinator runs without the rollout engine (no model catalog installed)."""


def _rollouts(request: web.Request) -> RolloutEngine:
    engine = request.config_dict.get(ROLLOUTS_KEY)
    if engine is None:
        raise RolloutsUnavailable
    return engine


def _rollout_error(exc: RolloutsUnavailable | PolicyError | RolloutError) -> web.Response:
    if isinstance(exc, RolloutsUnavailable):
        return error_response(503, "Model rollouts are not enabled on this coordinator.",
                              type_="server_error", code="rollouts_unavailable")  # fmt: skip
    if isinstance(exc, PolicyError):
        return error_response(400, str(exc), type_="invalid_request_error",
                              code="invalid_parameter", param=exc.param)  # fmt: skip
    return error_response(exc.status, str(exc), type_="invalid_request_error", code=exc.code,
                          param="rollout_id" if exc.status == 404 else None)  # fmt: skip


_SUMMARY_FIELDS = (
    "object", "rollout_id", "model", "version", "previous_version", "state", "step", "steps",
    "step_name", "moved", "agents", "created_at", "updated_at", "finished_at", "created_by",
    "detail",
)  # fmt: skip


def rollout_summary(rollout: Rollout) -> dict[str, Any]:
    full = rollout.json()
    return {k: full[k] for k in _SUMMARY_FIELDS}


async def start_rollout(request: web.Request) -> web.Response:
    """Start a rollout: the body is a rollout policy (coordinator.store.rollouts)."""
    body = await json_body(request)
    caller = request[CALLER_KEY]
    try:
        rollout = _rollouts(request).start(
            RolloutPolicy.from_json(body), created_by=f"{caller.name} ({caller.token_id})"
        )
    except (RolloutsUnavailable, PolicyError, RolloutError) as exc:
        return _rollout_error(exc)
    return web.json_response(rollout.json(), status=201)


async def list_rollouts(request: web.Request) -> web.Response:
    raw = [s for s in request.query.get("state", "").split(",") if s]
    try:
        states = tuple(RolloutState(s) for s in raw)
    except ValueError:
        allowed = ", ".join(s.value for s in RolloutState)
        raise InvalidParameter("state", f"state must be among {allowed}") from None
    limit = _query_int(request, "limit", 100, 1000)
    try:
        found = _rollouts(request).rollouts(states, limit)
    except RolloutsUnavailable as exc:
        return _rollout_error(exc)
    return web.json_response({"object": "list", "data": [rollout_summary(r) for r in found]})


async def show_rollout(request: web.Request) -> web.Response:
    """One rollout in full, with its current step's gate as it stands now."""
    try:
        engine = _rollouts(request)
        rollout = engine.get(request.match_info["rollout_id"])
    except (RolloutsUnavailable, RolloutError) as exc:
        return _rollout_error(exc)
    view = rollout.json()
    view["gate"] = engine.gate(rollout).json() if rollout.state.active else None
    return web.json_response(view)


async def _rollout_action(request: web.Request, action: str) -> web.Response:
    rollout_id = request.match_info["rollout_id"]
    try:
        engine = _rollouts(request)
        if action == "pause":
            rollout = engine.pause(rollout_id)
        elif action == "resume":
            rollout = engine.resume(rollout_id)
        else:
            body = await json_body(request)
            rollback, reason = body.get("rollback", True), body.get("reason", "")
            if not isinstance(rollback, bool):
                raise InvalidParameter("rollback", "rollback must be true or false")
            if not isinstance(reason, str) or len(reason) > 1024:
                raise InvalidParameter("reason", "reason must be a string of <= 1024 characters")
            caller = request[CALLER_KEY]
            reason = f"aborted by {caller.name}" + (f": {reason}" if reason else "")
            rollout = engine.abort(rollout_id, rollback=rollback, reason=reason)
    except (RolloutsUnavailable, RolloutError) as exc:
        return _rollout_error(exc)
    return web.json_response(rollout_summary(rollout))


async def pause_rollout(request: web.Request) -> web.Response:
    """Pause: no further step moves and the soak clock stops; moved agents stay."""
    return await _rollout_action(request, "pause")


async def resume_rollout(request: web.Request) -> web.Response:
    return await _rollout_action(request, "resume")


async def abort_rollout(request: web.Request) -> web.Response:
    """Abort; moved agents go back to their previous version unless ``rollback`` is false."""
    return await _rollout_action(request, "abort")


# ------------------------------------------------------------------ the route table


ADMIN_ROUTES: list[AdminRoute] = [
    AdminRoute("GET", "/whoami", whoami, Role.VIEWER, "The caller's token name and role"),
    AdminRoute("POST", "/keys", mint_key, Role.ADMIN, "Mint an API key (the secret shown once)"),
    AdminRoute("GET", "/keys", list_keys, Role.VIEWER, "List API keys (no secrets)"),
    AdminRoute("GET", "/keys/{key_id}", show_key, Role.VIEWER,
               "One API key, with each agent's share of its rate limits"),
    AdminRoute("DELETE", "/keys/{key_id}", revoke_key, Role.ADMIN,
               "Revoke an API key (pushed to every connected agent at once)"),
    AdminRoute("POST", "/tokens", create_token, Role.ADMIN, "Create a join token (shown once)"),
    AdminRoute("GET", "/tokens", list_tokens, Role.VIEWER, "List join tokens (no secrets)"),
    AdminRoute("DELETE", "/tokens/{token_id}", revoke_token, Role.ADMIN, "Revoke a join token"),
    AdminRoute("POST", "/agents/{agent_id}/drain", drain_agent, Role.OPERATOR, "Drain an agent"),
    AdminRoute("POST", "/agents/{agent_id}/resume", resume_agent, Role.OPERATOR,
               "Resume a drained agent"),
    AdminRoute("PATCH", "/agents/{agent_id}", set_agent, Role.ADMIN,
               "Fix an agent's site, location or URL (it reconnects with them)"),
    AdminRoute("POST", "/agents/{agent_id}/revoke", revoke_agent, Role.ADMIN,
               "Revoke an agent: end its session, refuse its certificate and credential"),
    AdminRoute("DELETE", "/agents/{agent_id}", remove_agent, Role.ADMIN,
               "Remove a (revoked) agent's record"),
    AdminRoute("POST", "/admin-tokens", mint_admin_token, Role.ADMIN,
               "Mint an admin token with a role (shown once)"),
    AdminRoute("GET", "/admin-tokens", list_admin_tokens, Role.ADMIN, "List admin tokens"),
    AdminRoute("DELETE", "/admin-tokens/{token_id}", revoke_admin_token, Role.ADMIN,
               "Revoke an admin token"),
    AdminRoute("GET", "/audit", audit_log, Role.VIEWER, "The audit log (json or jsonl)"),
    AdminRoute("GET", "/request-records", request_records, Role.VIEWER,
               "Per-request records sent by agents"),
    AdminRoute("GET", "/models", list_models, Role.VIEWER,
               "The model catalog: every published version, the rules, the signing key"),
    AdminRoute("POST", "/models", publish_model, Role.OPERATOR,
               "Publish a version (its files uploaded first); the manifest is signed"),
    AdminRoute("POST", "/model-blobs/missing", missing_blobs, Role.OPERATOR,
               "Which of these sha256 the blob store lacks"),
    AdminRoute("PUT", "/model-blobs/sha256/{sha256}", upload_blob, Role.OPERATOR,
               "Upload one file (kept only if its bytes hash to the sha256)"),
    AdminRoute("GET", "/models/{name}/{version}", show_model, Role.VIEWER,
               "One version: files, signed manifest, agents desiring and loading it"),
    AdminRoute("POST", "/models/{name}/{version}/deprecate", deprecate_model, Role.OPERATOR,
               "Mark a version deprecated (or not)"),
    AdminRoute("DELETE", "/models/{name}/{version}", delete_model, Role.OPERATOR,
               "Delete a version (refused while any agent desires or loads it)"),
    AdminRoute("POST", "/models/{name}/{version}/deploy", deploy_model, Role.OPERATOR,
               "Every agent the selector matches (empty: all) runs this version"),
    AdminRoute("POST", "/rollouts", start_rollout, Role.OPERATOR,
               "Start a model rollout (canary, waves, soak, gates)"),
    AdminRoute("GET", "/rollouts", list_rollouts, Role.VIEWER, "List model rollouts"),
    AdminRoute("GET", "/rollouts/{rollout_id}", show_rollout, Role.VIEWER,
               "One rollout: plan, state, step stats and its gate now"),
    AdminRoute("POST", "/rollouts/{rollout_id}/pause", pause_rollout, Role.OPERATOR,
               "Pause a rollout (no step moves; the soak clock stops)"),
    AdminRoute("POST", "/rollouts/{rollout_id}/resume", resume_rollout, Role.OPERATOR,
               "Resume a paused rollout"),
    AdminRoute("POST", "/rollouts/{rollout_id}/abort", abort_rollout, Role.OPERATOR,
               "Abort a rollout (moved agents go back unless rollback is false)"),
    AdminRoute("GET", "/fleet/series", fleet_series, Role.VIEWER,
               "The fleet's last hour at 10 s resolution (merged TTFT histograms)"),
    AdminRoute("GET", "/fleet/events", fleet_events, Role.VIEWER,
               "Live fleet events (server-sent events: changed agents, series points)"),
]  # fmt: skip


def route_roles() -> dict[tuple[str, str], Role | None]:
    """(method, full canonical path) -> the role needed (None: public), for every route."""
    table: dict[tuple[str, str], Role | None] = dict(ROUTE_ROLES) | DASHBOARD_ROUTE_ROLES
    # Blobs: viewer tokens, or agents with their own credential (AGENT_ROUTES).
    table[("GET", BLOB_ROUTE)] = Role.VIEWER
    for route in ADMIN_ROUTES:
        table[(route.method, ADMIN_PREFIX + route.path)] = route.role
    return table


def create_admin_app() -> web.Application:
    """The admin routes; mount with ``add_subapp(ADMIN_PREFIX, ...)`` on an app that has
    the ``authorize`` middleware and ``ROUTE_ROLES_KEY``."""
    admin = web.Application()
    admin.add_routes([route.route_def() for route in ADMIN_ROUTES])
    return admin
