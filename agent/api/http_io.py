"""Reading hostile request bodies and writing OpenAI-style JSON, errors and SSE."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from agent.errors import (
    AgentError,
    EngineRestartedError,
    InvalidRequestError,
    OverloadedError,
    PayloadTooLargeError,
)
from edgefleet.json_strings import lone_surrogate_at
from edgefleet.openai_errors import openai_error

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

# error.code of the event that ends a stream broken after its first event, by cause; an
# AgentError keeps the code it has in a JSON error body, so one cause has one code
STREAM_ERROR_CODES: dict[str, str] = {
    "engine_error": "inference failed inside the engine for this request",
    "engine_restarted": "the engine's loop failed and restarted; every request in it was "
    "dropped (retry it)",
    "engine_unavailable": "the engine failed too often and stopped; this agent is unhealthy",
    "request_timeout": "the request ran past its timeout (X-Request-Timeout or the default)",
    "overloaded": "the agent shed the request (e.g. it is shutting down or overloaded)",
    "invalid_request": "the engine refused the request after the stream had started",
    "invalid_constrained_output": "a constrained request's output (from an overflow target) "
    "did not parse or validate against its response_format or tools",
    "internal_error": "an unexpected error in the agent (details only in its log)",
}

# status recorded for a request whose client went away mid-response (nginx's 499)
CLIENT_CLOSED = 499
# request key set when that happened; aiohttp >= 3.14 warns on str request keys
CLIENT_GONE: Any = (
    web.RequestKey("edgefleet_client_gone", bool)
    if hasattr(web, "RequestKey")
    else "edgefleet.client_gone"
)


# pydantic names the branch of a union that failed ("str", "list[int]", "constrained-str")
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|constrained-.*)$")


def _describe_validation(exc: ValidationError) -> InvalidRequestError:
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    path = [p for p in loc if not _UNION_BRANCH.match(p)]
    param = ".".join(path) or None
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {first['msg']}."
    return InvalidRequestError(message, param=param)


async def read_json(request: web.Request, model: type[M], limit: int) -> M:
    """Parse and validate a JSON body; every way it can be wrong becomes a 400 or 413."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(
            f"request body is {request.content_length} bytes; the limit is {limit} bytes"
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes") from exc
    if not raw:
        raise InvalidRequestError("request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid UTF-8 ({exc.reason})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError:  # [[[[... deeper than the interpreter's recursion limit
        raise InvalidRequestError("request body is nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than int() converts (4,300)
        raise InvalidRequestError(f"request body is not usable JSON: {str(exc)[:100]}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError(f"request body must be a JSON object, got {type(data).__name__}")
    if (where := lone_surrogate_at(data)) is not None:  # "\ud800": no tokenizer takes it
        raise InvalidRequestError(
            f"Invalid value for '{where}': a lone UTF-16 surrogate (\\ud800-\\udfff) is not "
            "a character",
            param=where,
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _describe_validation(exc) from exc


def json_response(
    body: BaseModel, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=body.model_dump_json(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return openai_error(message, error_type, param=param, code=code)


def stream_error_event(exc: Exception) -> bytes:
    """The SSE event that ends a stream broken after it started (the status line is out).

    OpenAI's shape, ``data: {"error": {"message", "type", "param", "code"}}``, for every
    exception: an :class:`AgentError` with its own message and code, anything else as
    ``internal_error`` without details. ``data: [DONE]`` follows it.
    """
    if isinstance(exc, AgentError):
        code = exc.code or ("invalid_request" if exc.status < 500 else "internal_error")
        body = error_body(exc.message, exc.error_type, param=exc.param, code=code)
    else:
        body = error_body("internal server error", "server_error", code="internal_error")
    return f"data: {json.dumps(body)}\n\n".encode()


def error_response(exc: AgentError) -> web.Response:
    response = web.json_response(
        error_body(exc.message, exc.error_type, param=exc.param, code=exc.code),
        status=exc.status,
    )
    retry_after = getattr(exc, "retry_after", None)  # overloaded, model not loaded yet
    if isinstance(exc, OverloadedError) or isinstance(retry_after, int | float):
        # up, never down: a client that waits exactly this long is served
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after or 1)))
    elif isinstance(exc, EngineRestartedError):
        response.headers["Retry-After"] = "1"  # the loop is already running again
    return response


async def stream_sse(
    request: web.Request,
    events: AsyncIterator[BaseModel],
    headers: dict[str, str] | None = None,
    *,
    with_usage: bool = False,
) -> web.StreamResponse:
    """Send ``events`` as server-sent events, then ``data: [DONE]``.

    Any error after the stream has started is sent as :func:`stream_error_event` (the
    status line is already out), and the stream still ends with ``[DONE]``.
    """
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **(headers or {}),
        }
    )
    # OpenAI sends a "usage" key in chunks only when stream_options.include_usage is set
    exclude = None if with_usage else {"usage"}
    first = await anext(events)  # errors before the first event still get a status code
    await response.prepare(request)
    try:
        await response.write(f"data: {first.model_dump_json(exclude=exclude)}\n\n".encode())
        try:
            async for event in events:
                data = f"data: {event.model_dump_json(exclude=exclude)}\n\n"
                await response.write(data.encode())
        except ConnectionResetError:
            raise
        except Exception as exc:
            if isinstance(exc, AgentError):
                log.warning("stream %s ended by %s: %s", request.path, exc.code, exc.message)
            else:
                log.exception("stream %s failed", request.path)
            await response.write(stream_error_event(exc))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        # the client went away: closing the events cancels its sequence at once
        request[CLIENT_GONE] = True
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
    return response
