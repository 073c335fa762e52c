"""Join tokens over HTTP: create (the secret shown once), list, revoke."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from coordinator.api.app_keys import (
    LIFECYCLE_KEY,
    TOKENS_KEY,
)
from coordinator.api.common import (
    InvalidParameter,
    int_field,
    json_body,
    location_from,
)
from coordinator.api.views import token_json

TEN_YEARS_S = 10 * 365 * 86_400


async def create_token(request: web.Request) -> web.Response:
    body = await json_body(request)
    expires_in_s = int_field(body, "expires_in_s", 86_400, 1, TEN_YEARS_S)
    max_uses = int_field(body, "max_uses", 1, 1, 1_000_000)
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
        created = await request.config_dict[TOKENS_KEY].create(
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
    data = [token_json(t, now) for t in await request.config_dict[TOKENS_KEY].list()]
    return web.json_response({"object": "list", "data": data})


async def revoke_token(request: web.Request) -> web.Response:
    """Revoke a join token (no new enrollments); ``?agents=true`` revokes the agents
    enrolled with it too (their sessions end at once)."""
    token_id = request.match_info["token_id"]
    await request.config_dict[TOKENS_KEY].revoke(token_id)
    data: dict[str, Any] = {"object": "join_token", "token_id": token_id, "state": "revoked"}
    if request.query.get("agents", "").lower() in ("1", "true", "yes"):
        lifecycle = request.config_dict[LIFECYCLE_KEY]
        data["revoked_agents"] = await lifecycle.revoke_agents_of_token(token_id)
    return web.json_response(data)
