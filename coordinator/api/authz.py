"""Who may call which route: the ``authorize`` middleware over the route table
(``coordinator.api.routes``), with the audit of every admin action and refusal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from coordinator.access.admin_tokens import Caller, Role
from coordinator.api.app_keys import (
    ADMIN_TOKENS_KEY,
    AUDIT_KEY,
    ROUTE_ROLES_KEY,
)
from coordinator.api.common import CALLER_KEY, Handler, error_response, exception_response
from coordinator.api.dashboard import (
    same_origin,
    session_caller,
)
from coordinator.api.models import (
    AGENT_ROUTES,
    agent_may_read,
    peer_may_read,
)

logger = logging.getLogger(__name__)


ADMIN_PREFIX = "/v1/admin"


READ_METHODS = frozenset({"GET", "HEAD"})


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
        return await _refuse(request, 403, "This route declares no role.", "route_without_role")
    needed = roles[key]
    if needed is None:
        return await handler(request)
    token = _bearer(request)
    if token is not None:
        caller = await request.config_dict[ADMIN_TOKENS_KEY].check(token)
    else:  # the dashboard's session cookie; state changes only from its own origin
        caller = await session_caller(request)
        if caller is not None and request.method not in READ_METHODS and not same_origin(request):
            request[CALLER_KEY] = caller
            return await _refuse(
                request,
                403,
                "A request signed in by the dashboard's session cookie must come from the "
                "dashboard's own origin (Origin header).",
                "cross_origin",
            )
    if caller is None and key in AGENT_ROUTES and await agent_may_read(request):
        return await handler(request)  # an agent with its own credential (model_http)
    if caller is None and key in AGENT_ROUTES and peer_may_read(request):
        return await handler(request)  # a peer coordinator (catalog/replication.py)
    if caller is None:
        return await _refuse(
            request,
            401,
            f"This route needs Authorization: Bearer <admin token> (role {needed.label} or above).",
            "invalid_admin_token",
            type_="authentication_error",
        )
    request[CALLER_KEY] = caller
    if caller.role < needed:
        return await _refuse(
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
    await _audit(request, caller, response.status)
    return response


def _target(request: web.Request) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(request.match_info.items()))


async def _audit(request: web.Request, caller: Caller, status: int) -> None:
    await request.config_dict[AUDIT_KEY].append(
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


async def _refuse(
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
    await request.config_dict[AUDIT_KEY].append_refusal(
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
