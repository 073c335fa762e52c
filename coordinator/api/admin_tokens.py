"""Admin tokens over HTTP: mint (the secret shown once), list, revoke, and ``whoami``."""

from __future__ import annotations

from aiohttp import web

from coordinator.access.admin_tokens import Role
from coordinator.api.app_keys import (
    ADMIN_TOKENS_KEY,
)
from coordinator.api.common import CALLER_KEY, InvalidParameter, json_body
from coordinator.api.dashboard import SESSIONS_KEY


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
        created = await request.config_dict[ADMIN_TOKENS_KEY].mint(
            role, name, created_by=f"{caller.name} ({caller.token_id})"
        )
    except ValueError as exc:
        raise InvalidParameter("name", str(exc)) from None
    return web.json_response(created.record.json() | {"token": created.token}, status=201)


async def list_admin_tokens(request: web.Request) -> web.Response:
    data = [t.json() for t in await request.config_dict[ADMIN_TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_admin_token(request: web.Request) -> web.Response:
    record = await request.config_dict[ADMIN_TOKENS_KEY].revoke(request.match_info["token_id"])
    # Its dashboard sign-ins end now (each request checks the token too).
    await request.config_dict[SESSIONS_KEY].end_token(record.token_id)
    return web.json_response(record.json())


async def whoami(request: web.Request) -> web.Response:
    caller = request[CALLER_KEY]
    return web.json_response(
        {"object": "caller", "token_id": caller.token_id, "name": caller.name,
         "role": caller.role.label}
    )  # fmt: skip
