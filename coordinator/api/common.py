"""What every HTTP handler shares: the OpenAI-shaped error body and middlewares, strict
JSON bodies, parameter checks.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from coordinator.access.admin_tokens import Caller
from coordinator.api.app_keys import (
    METRICS_KEY,
    STORE_HEALTH_KEY,
)
from coordinator.errors import (
    ProtocolError,
    StoreError,
    UnknownAgentError,
    UnknownTokenRefError,
)
from coordinator.rpc.convert import location_checked
from coordinator.store.health import RETRY_AFTER_S
from coordinator.store.interface import StoreUnavailableError
from edgefleet.contract import Location
from edgefleet.json_strings import lone_surrogate_at
from edgefleet.openai_errors import openai_error

logger = logging.getLogger(__name__)


CALLER_KEY = web.RequestKey("caller", Caller)


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


def int_field(
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
        raise InvalidParameter(name, f"{name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise InvalidParameter(name, f"{name} must be within [{low}, {high}], got {shown(value)}")
    return int(value)


def shown(value: Any) -> str:
    """A request's value in an error message, cut short."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return text if len(text) <= 60 else text[:57] + "..."


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON, beyond a double
        raise ValueError(f"the number {text[:40]} is beyond a double")
    return value


def no_constant(name: str) -> Any:
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
            await request.text(), parse_constant=no_constant, parse_float=finite_float
        )
    except ValueError as exc:
        raise InvalidParameter(
            "body", f"the request body must be a JSON object ({str(exc)[:100]})"
        ) from None
    except RecursionError:  # [[[[... deeper than the interpreter's recursion limit
        raise InvalidParameter("body", "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidParameter("body", "the request body must be a JSON object")
    # "\ud800" reads as a str neither protobuf (the agents' keys section) nor a store takes
    if (where := lone_surrogate_at(body)) is not None:
        raise InvalidParameter(
            where, f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff): not a character"
        )
    return body


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = openai_error(message, type_, param=param, code=code)
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn HTTP errors and crashes into OpenAI-style JSON error bodies."""
    try:
        return await handler(request)
    except Exception as exc:
        return exception_response(request, exc)


def exception_response(request: web.Request, exc: Exception) -> web.Response:
    """The OpenAI-style error answer for what a handler raised (re-raises redirects)."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        if exc.status == 404:
            return error_response(
                404,
                f"Invalid URL ({request.method} {request.path})",
                type_="invalid_request_error",
                code="not_found",
            )
        if exc.status == 405:
            return error_response(
                405,
                f"Method {request.method} is not allowed for {request.path}",
                type_="invalid_request_error",
                code="method_not_allowed",
                headers=headers,
            )
        return error_response(
            exc.status,
            exc.text or exc.reason,
            type_="invalid_request_error" if exc.status < 500 else "server_error",
            code=None,
            headers=headers,
        )
    if isinstance(exc, UnknownAgentError):
        return error_response(
            404, str(exc), type_="invalid_request_error", code="agent_not_found", param="agent_id"
        )
    if isinstance(exc, UnknownTokenRefError):
        return error_response(
            404, str(exc), type_="invalid_request_error", code="token_not_found", param="token_id"
        )
    if isinstance(exc, InvalidParameter):
        return error_response(
            400, str(exc), type_="invalid_request_error", code="invalid_parameter", param=exc.param
        )
    if isinstance(exc, StoreError):
        return store_unavailable(request, exc)
    logger.error("unhandled error serving %s %s", request.method, request.path, exc_info=exc)
    return error_response(
        500,
        "The coordinator had an error while processing your request.",
        type_="server_error",
        code="internal_error",
    )


def store_unavailable(request: web.Request, exc: StoreError) -> web.Response:
    """503 for a request that needed the fleet database while it was away or too slow
    (the store's calls end within their timeouts: this never waits longer)."""
    logger.warning("%s %s: the fleet database is unavailable: %s", request.method,
                   request.path, exc)  # fmt: skip
    if isinstance(exc, StoreUnavailableError):  # known at once, not at the next probe
        request.config_dict[STORE_HEALTH_KEY].failed(exc)
    return error_response(
        503,
        f"The fleet database is unavailable, so this request could not be completed; "
        f"retry in {RETRY_AFTER_S} s. Route lookups and connected agents are not affected. "
        f"({str(exc)[:300]})",
        type_="server_error",
        code="store_unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    metrics = request.config_dict[METRICS_KEY]  # config_dict: also under sub-apps (admin)
    metrics.http_requests.labels(route=route, status=str(response.status)).inc()
    return response


class InvalidParameter(ValueError):
    """A query parameter is missing or malformed (answered with 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def query_number(query: Any, name: str, *, low: float, high: float) -> float | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidParameter(name, f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidParameter(name, f"{name} must be within [{low:g}, {high:g}], got {raw}")
    return value
