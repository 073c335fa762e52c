"""The audit log and the agents' request records over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web

from coordinator.access.audit import MAX_PAGE, to_jsonl
from coordinator.api.app_keys import (
    AUDIT_KEY,
    RECORDS_KEY,
)
from coordinator.api.common import InvalidParameter


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
    entries = await request.config_dict[AUDIT_KEY].entries(
        since=_since(request),
        after_seq=_query_int(request, "after_seq", 0, 2**62),
        limit=_query_int(request, "limit", 1000 if fmt == "json" else MAX_PAGE, MAX_PAGE),
    )
    if fmt == "json":
        return web.json_response({"object": "list", "data": [e.json() for e in entries]})
    return web.Response(text="".join(to_jsonl(entries)), content_type="application/jsonl")


async def request_records(request: web.Request) -> web.Response:
    records = await request.config_dict[RECORDS_KEY].list(
        agent_id=request.query.get("agent_id") or None,
        after_seq=_query_int(request, "after_seq", 0, 2**62),
        limit=_query_int(request, "limit", 1000, 10_000),
    )
    return web.json_response({"object": "list", "data": records})
