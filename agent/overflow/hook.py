"""Where the agent's API turns a local refusal into a forward (agent/api/app.py calls
:func:`forwardable` and :func:`forward`)."""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from agent.api.content_check import (
    MODERATED,
    MODERATION_HEADER,
    check_overflow_answer,
    chunk_text,
)
from agent.api.http_io import CLIENT_GONE, stream_error_event
from agent.auth.middleware import grant_of
from agent.engine.residency import ModelLoadFailedError, ModelUnavailableError
from agent.errors import AgentError, KeyRateLimitError, ModelNotFoundError, OverloadedError
from agent.overflow.forwarder import OverflowRequest
from agent.overflow.policy import (
    ALLOW_CLOUD_HEADER,
    hop_honoured,
    may_leave_site,
    request_allows_cloud,
)
from agent.overflow.service import OverflowService, overflow_record

log = logging.getLogger(__name__)

OVERFLOW = web.AppKey("overflow", OverflowService)
# The forwarded request (its legs, served-by, first-token time), for the request record.
OVERFLOW_REQUEST = web.RequestKey("edgefleet_overflow", OverflowRequest)
SERVED_BY_HEADER = "X-Edgefleet-Served-By"


def forward_reason(service: OverflowService, exc: AgentError) -> str | None:
    """Why ``exc`` may be forwarded (None: it may not)."""
    if isinstance(exc, ModelNotFoundError | ModelUnavailableError | ModelLoadFailedError):
        reason = "model_not_loaded"  # not here, or not loadable here now
    elif isinstance(exc, OverloadedError) and not isinstance(exc, KeyRateLimitError):
        reason = exc.reason
    else:
        return None
    return reason if reason in service.forward_reasons else None


def forwardable(request: web.Request, exc: AgentError) -> bool:
    service = request.app.get(OVERFLOW)
    return service is not None and forward_reason(service, exc) is not None


async def forward(
    request: web.Request, endpoint: str, exc: AgentError, keys_enabled: bool
) -> web.StreamResponse:
    """Answer the request from an overflow target, or raise ``exc`` (the local refusal)
    when none may take it."""
    service = request.app[OVERFLOW]
    reason = forward_reason(service, exc) or ""
    if hop_honoured(request.headers.get("X-Edgefleet-Hop")):
        service.book.refused.labels("hop").inc()
        raise exc  # a peer's forward is never forwarded again
    raw: dict[str, Any] = json.loads(await request.read())  # validated by read_json already
    allows = request_allows_cloud(raw, request.headers.get(ALLOW_CLOUD_HEADER))
    req = OverflowRequest(
        endpoint=endpoint,
        body=raw,
        model=str(raw.get("model", "")),
        may_leave_site=may_leave_site(
            service.policy_allows_cloud, grant_of(request), keys_enabled, allows
        ),
        authorization=request.headers.get("Authorization"),
        reason=reason,
    )
    request[OVERFLOW_REQUEST] = req
    forwarder = service.forwarder
    # what comes back goes through the same output check as the engine's
    moderation = request.get(MODERATED)
    if moderation is not None and not moderation.checks_output:
        moderation = None
    try:
        if not raw.get("stream"):
            answer = await forwarder.complete(req, exc)
            headers = {SERVED_BY_HEADER: req.served_by}
            if moderation is not None:
                answer = await check_overflow_answer(moderation, answer)
                if (flagged := moderation.flagged_header()) is not None:
                    headers[MODERATION_HEADER] = flagged
            return web.json_response(answer, headers=headers)
        events = forwarder.stream(req, exc)
        if moderation is not None:
            events = moderation.screen_chunks(events, chunk_text)
        first = await anext(events)  # before it, every failure still gets a status code
    except AgentError as error:
        if error is exc:
            service.book.refused.labels(reason if req.may_leave_site else "not_allowed").inc()
        raise
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            SERVED_BY_HEADER: req.served_by,
        }
    )
    await response.prepare(request)
    try:
        await response.write(f"data: {json.dumps(first)}\n\n".encode())
        try:
            async for chunk in events:
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        except ConnectionResetError:
            raise
        except Exception as error:
            log.warning("overflow stream %s ended by %s", request.path, error)
            await response.write(stream_error_event(error))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        request[CLIENT_GONE] = True
        await events.aclose()  # type: ignore[attr-defined]
    return response


def record_fields(request: web.Request) -> dict[str, Any] | None:
    """The overflow part of the request's record (None: served here); cost computed
    here, once, and the usage book summed from it."""
    req = request.get(OVERFLOW_REQUEST)
    if req is None or not req.legs:
        return None
    fields = overflow_record(req)
    request.app[OVERFLOW].book.add(fields)
    grant = grant_of(request)
    if grant is not None:
        # the key's usage: what pools and providers used (a peer counts its own part)
        beyond = [leg for leg in fields["overflow"] if leg["kind"] != "peer"]
        prompt = sum(leg["prompt_tokens"] for leg in beyond)
        completion = sum(leg["completion_tokens"] for leg in beyond)
        if prompt or completion:
            grant.settle(prompt, completion, 0)
    return fields
