"""Agents over HTTP: the fleet listing and one agent's view, and what an operator does to
an agent (set, revoke, remove, drain, resume).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
from datetime import UTC, datetime

from aiohttp import web

from coordinator.api.app_keys import (
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    LIFECYCLE_KEY,
    REGISTRY_KEY,
    STORE_KEY,
    WARMTH_KEY,
)
from coordinator.api.common import (
    InvalidParameter,
    error_response,
    json_body,
    location_from,
    query_number,
)
from coordinator.api.events import EVENTS_KEY
from coordinator.api.views import agent_json, stored_agent_json
from coordinator.errors import UnknownAgentError
from coordinator.fleet.records import AgentRecord
from coordinator.identity.join_tokens import check_http_url
from coordinator.store.interface import StoreUnavailableError


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
    result = await request.config_dict[LIFECYCLE_KEY].set_fixed(
        agent_id, site=site, location=location, http_url=http_url
    )
    view = stored_agent_json(result.stored, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def revoke_agent(request: web.Request) -> web.Response:
    agent_id = request.match_info["agent_id"]
    result = await request.config_dict[LIFECYCLE_KEY].revoke(agent_id)
    view = stored_agent_json(result.stored, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def remove_agent(request: web.Request) -> web.Response:
    agent_id = request.match_info["agent_id"]
    result = await request.config_dict[LIFECYCLE_KEY].remove(agent_id)
    view = stored_agent_json(None, agent_id)
    return web.json_response(view | {"session_ended": result.session_ended})


async def _set_draining(request: web.Request, draining: bool) -> web.Response:
    agent_id = request.match_info["agent_id"]
    registry = request.config_dict[REGISTRY_KEY]
    kind = "drain" if draining else "resume"
    try:
        record: AgentRecord | None = registry.set_draining(agent_id, draining)
    except UnknownAgentError:
        # Not seen by this coordinator (its session is on another one, since this one
        # started): the flag goes to the store, and the change feed tells the others.
        if not await request.config_dict[STORE_KEY].set_draining(agent_id, draining):
            raise
        record = None
    # Answered once the flag is in the store, so a confirmed drain survives a crash.
    limit_s = request.config_dict[CONFIG_KEY].store_statement_timeout_s
    if record is not None and not await registry.flush(limit_s):
        raise StoreUnavailableError(
            f"agent {agent_id}: the {kind} is in effect on this "
            "coordinator but not yet saved; it is written when the database is back"
        )
    sent = request.config_dict[GRPC_SERVER_KEY].servicer.send_command(
        agent_id, kind, f"{kind} requested by an operator"
    )
    await request.config_dict[LIFECYCLE_KEY].publish(agent_id, kind)
    if record is None:
        stored = await request.config_dict[STORE_KEY].get_agent(agent_id)
        return web.json_response(stored_agent_json(stored, agent_id) | {"command_sent": sent})
    interval_ms = request.config_dict[CONFIG_KEY].report_interval_ms
    request.config_dict[EVENTS_KEY].on_change(agent_id)
    view = agent_json(record, datetime.now(UTC), interval_ms)
    return web.json_response(view | {"command_sent": sent})


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


async def _model_command(request: web.Request, kind: str) -> web.Response:
    """Tell an agent to load or unload one model's weights now (an agent that loads
    models on demand: it keeps serving the model either way)."""
    agent_id, model = request.match_info["agent_id"], request.match_info["model"]
    if not MODEL_NAME.fullmatch(model):
        raise InvalidParameter("model", "model must be a model name (letters, digits, . _ -)")
    record = request.config_dict[REGISTRY_KEY].get(agent_id)
    if record is None:
        raise UnknownAgentError(f"agent {agent_id!r} is not connected to this coordinator")
    served = {m.name for m in record.served} | {m.name for m in record.hello.models}
    if model not in served:
        return error_response(
            404, f"agent {agent_id} does not serve model {model!r} (it serves: "
            f"{', '.join(sorted(served)) or 'none'})", type_="invalid_request_error",
            code="model_not_found", param="model",
        )  # fmt: skip
    sent = request.config_dict[GRPC_SERVER_KEY].servicer.send_command(
        agent_id, kind, f"{kind} requested by an operator", model
    )
    if not sent:
        return error_response(
            409, f"agent {agent_id} has no session on this coordinator now: nothing was sent",
            type_="invalid_request_error", code="agent_not_connected",
        )  # fmt: skip
    warmth = request.config_dict.get(WARMTH_KEY)
    if warmth is not None:  # an operator's unload holds the coordinator's warm loads back
        warmth.operator_command(agent_id, model, load=kind == "load_model")
    return web.json_response(
        {"agent_id": agent_id, "model": model, "command": kind, "command_sent": True},
        status=202,
    )


async def load_model_on_agent(request: web.Request) -> web.Response:
    return await _model_command(request, "load_model")


async def unload_model_on_agent(request: web.Request) -> web.Response:
    return await _model_command(request, "unload_model")


async def drain_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, True)


async def resume_agent(request: web.Request) -> web.Response:
    return await _set_draining(request, False)


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
    limit = int(query_number(query, "limit", low=1, high=AGENTS_PAGE_MAX) or AGENTS_PAGE_DEFAULT)
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
