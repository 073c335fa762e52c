"""The agent's API-key gate: an aiohttp middleware, separate from the error/metrics one.

With keys enabled every route needs ``Authorization: Bearer <key>`` except
``/healthz`` (liveness for orchestrators), ``/openapi.json`` and the admin API (loopback
and the agent's admin token, never an API key); ``/metrics`` needs a key too (any valid
one). The gate answers 401 ``invalid_api_key`` (with
``WWW-Authenticate: Bearer``) or 429 ``rate_limit_exceeded`` (with ``Retry-After``)
before any handler runs, and for a key limited to some models it reads the body's
``model`` and answers 403 ``model_not_allowed`` for any other. The request's
``KeyGrant`` is left under ``GRANT`` for the handlers (priority ceiling, max tokens,
tokens/min, usage and the response cache's per-key entries).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent.api.http_io import error_response
from agent.auth.keys import KeyGrant, KeyTable
from agent.errors import AgentError, InvalidApiKeyError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VersionOf = Callable[[str], str | None]

#: Paths open without a key.
OPEN_PATHS = frozenset({"/healthz", "/openapi.json"})
#: Blobs of the model store, served to site peers (agent/sync/blob_server.py says why
#: open); the admin API, which checks its own token and loopback (agent/api/admin.py).
OPEN_PREFIXES = ("/v1/blobs/", "/v1/admin/")

# aiohttp >= 3.14 warns on str request keys
GRANT: Any = (
    web.RequestKey("edgefleet_key_grant", KeyGrant)
    if hasattr(web, "RequestKey")
    else "edgefleet.key_grant"
)


def grant_of(request: web.Request) -> KeyGrant | None:
    """The request's key; None when keys are off (or the path is open)."""
    grant: KeyGrant | None = request.get(GRANT)
    return grant


def key_gate(table: KeyTable, version_of: VersionOf) -> Any:
    """The middleware; ``version_of(model_id)`` gives a served model's version."""

    @web.middleware
    async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            not table.enabled
            or request.path in OPEN_PATHS
            or request.path.startswith(OPEN_PREFIXES)
        ):
            return await handler(request)
        try:
            grant = table.authenticate(request.headers.get("Authorization"))
            if grant.key.models and request.method == "POST":
                model = await _body_model(request)
                if model is not None:  # "name@version" pins the version the key must allow
                    name, at, pinned = model.partition("@")
                    grant.check_model(name, pinned if at else version_of(name))
        except AgentError as exc:
            response = error_response(exc)
            if isinstance(exc, InvalidApiKeyError):
                response.headers["WWW-Authenticate"] = 'Bearer realm="edgefleet"'
            return response
        request[GRANT] = grant
        return await handler(request)

    return require_api_key


async def _body_model(request: web.Request) -> str | None:
    """The body's ``model`` when it is a JSON object naming one (else the handler's 400)."""
    try:  # read() keeps the body for the handler and enforces client_max_size
        data = json.loads(await request.read())
    except (ValueError, RecursionError, web.HTTPException):  # RecursionError: [[[[...
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None
