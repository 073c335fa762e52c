"""The operator dashboard served by the coordinator: static files, cookie sessions, the
fleet time series and a live event stream (SSE).

Sign-in: ``POST /v1/dashboard/session`` with ``{"token": "<admin token>"}`` checks the
token (``AdminTokens.check``) and answers a random session id in an ``HttpOnly;
SameSite=Strict`` cookie (``Secure`` over HTTPS). The sign-in is kept in the database
(``DashboardSessions``: a hash of the session id, the admin token's id and the expiry,
never the session id or the token), so it survives a coordinator restart or kill and every
coordinator sharing the database honours it; the token never reaches the page's script,
localStorage or a URL. Each request with the cookie reads the sign-in and the token's
record, so signing out or revoking the admin token ends the session at once, on every
coordinator. The ``authorize``
middleware (coordinator.api.authz) takes the session as it takes a bearer token, and for
every state-changing request made with the cookie also requires an ``Origin`` header equal
to the coordinator's own origin (SameSite=Strict plus an Origin check: CSRF-safe).

Static files (``coordinator/api/static/``: vanilla JS and CSS, no build step, nothing from
a CDN; the map and chart libraries and the world atlas vendored under ``static/vendor/``
with their licences and a manifest of hashes) are served with a Content-Security-Policy
limited to the coordinator's origin (no inline script or style, no eval).

Live data: ``FleetEvents`` takes every accepted load report (the fleet series and the
"changed agents" set) and every liveness change; a flusher sends the changed agents'
rows to each SSE subscriber every FLUSH_S, each row stamped with the time the
coordinator received the report (the dashboard measures paint latency against it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from pathlib import Path

from aiohttp import web

from coordinator.access.admin_tokens import AdminTokens, Caller, Role
from coordinator.api.app_keys import AUDIT_KEY
from coordinator.api.common import InvalidParameter, error_response, json_body
from coordinator.api.events import EVENTS_KEY
from coordinator.errors import SignInsFullError
from coordinator.identity.peer_rate_limit import PeerRateLimiter
from coordinator.store.changes import ChangeTable

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
COOKIE = "edgefleet_session"
SESSION_PATH = "/v1/dashboard/session"
MAX_SESSIONS = 10_000

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".svg": "image/svg+xml", ".json": "application/json"}  # fmt: skip


_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in _TYPES}
# Third-party files the page uses (map, charts), committed with their licences and
# MANIFEST.json (sha256 of each; python -m devtools.dashboard_vendor writes them).
VENDOR_DIR = STATIC_DIR / "vendor"
_VENDOR_FILES = {
    p.name: p
    for p in (VENDOR_DIR.iterdir() if VENDOR_DIR.is_dir() else ())
    if p.is_file() and p.suffix in _TYPES and p.name != "MANIFEST.json"
}


# ------------------------------------------------------------------ sessions


def session_hash(session_id: str) -> str:
    """What the database keeps of a session id: its SHA-256 (hex)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).hexdigest()


class DashboardSessions:
    """Dashboard sign-ins, kept in the store (table ``dashboard_sessions``): the SHA-256
    of the session id, the id of the admin token signed in with (``AdminTokens.kept_id``)
    and the expiry, by the database's clock. Neither the session id nor the token is
    kept, so the table grants nothing to whoever reads it. A sign-in outlives the
    coordinator that made it (a restart, a SIGKILL) and is honoured by every coordinator
    sharing the database.

    Nothing is cached in the process: each request with the cookie reads its row and the
    token's record (two reads by primary key), so a sign-out, an expiry or a revocation
    of the token takes effect at once on every coordinator. Expired rows are deleted at
    each sign-in, a revoked token's rows when it is revoked (``end_token``). At most
    MAX_SESSIONS live sign-ins: a sign-in beyond them first ends the older sign-ins of
    its own token, and is refused (SignInsFullError) when that does not make room."""

    def __init__(self, store: ChangeTable, tokens: AdminTokens, *, ttl_s: float) -> None:
        self._store = store
        self._tokens = tokens
        self.ttl_s = ttl_s
        self.sign_in_limiter = PeerRateLimiter(10 / 60.0, 10)

    async def open(self, token: str) -> tuple[str, Caller] | None:
        """Sign in with an admin token: a new session id and its caller; None when the
        token is not a valid one. SignInsFullError when no room can be made."""
        caller = await self._tokens.check(token)
        if caller is None:
            return None
        token_id = self._tokens.kept_id(caller)
        await self._store.delete_dashboard_sessions(expired=True)
        if await self._store.count_dashboard_sessions() >= MAX_SESSIONS:
            ended = await self._store.delete_dashboard_sessions(token_id=token_id)
            logger.warning("dashboard sign-ins full: ended %d of token %s", ended, caller.token_id)
            if await self._store.count_dashboard_sessions() >= MAX_SESSIONS:
                raise SignInsFullError(f"the database keeps {MAX_SESSIONS} dashboard sign-ins")
        session_id = secrets.token_urlsafe(32)
        await self._store.create_dashboard_session(session_hash(session_id), token_id, self.ttl_s)
        return session_id, caller

    async def caller(self, session_id: str) -> Caller | None:
        """The caller a session id stands for, read now; None when it is not a live
        sign-in or its token is no longer valid."""
        kept = await self._store.get_dashboard_session(session_hash(session_id))
        if kept is None:  # never made, signed out or expired
            return None
        return await self._tokens.check_id(kept.token_id)  # None once the token is revoked

    async def close(self, session_id: str) -> bool:
        """Sign out; False when there was no such sign-in."""
        return await self._store.delete_dashboard_session(session_hash(session_id))

    async def end_token(self, token_id: str) -> int:
        """End every sign-in of a (revoked) minted admin token; how many."""
        return await self._store.delete_dashboard_sessions(token_id=token_id)

    async def count(self) -> int:
        """Live sign-ins in the database (of every coordinator sharing it)."""
        return await self._store.count_dashboard_sessions()


def same_origin(request: web.Request) -> bool:
    """The request's Origin header names this coordinator (scheme://host[:port])."""
    origin = request.headers.get("Origin")
    return origin is not None and origin == f"{request.scheme}://{request.host}"


SESSIONS_KEY = web.AppKey("dashboard_sessions", DashboardSessions)


async def session_caller(request: web.Request) -> Caller | None:
    """The caller of the request's dashboard session cookie, if it holds a live one."""
    session_id = request.cookies.get(COOKIE)
    sessions = request.config_dict.get(SESSIONS_KEY)
    if not session_id or sessions is None:
        return None
    return await sessions.caller(session_id)


# ------------------------------------------------------------------ live events


# ------------------------------------------------------------------ handlers


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return SECURITY_HEADERS | (extra or {})


async def dashboard_file(request: web.Request) -> web.StreamResponse:
    """A static file of the dashboard (index.html for the folder itself)."""
    name = request.match_info.get("name", "") or "index.html"
    # Only the files of the folder, by their exact names (nothing built from the request).
    files = _VENDOR_FILES if request.path.startswith("/dashboard/vendor/") else _FILES
    path = files.get(name)
    if path is None:
        return error_response(
            404, f"Invalid URL (GET {request.path})", type_="invalid_request_error",
            code="not_found",
        )  # fmt: skip
    body = await asyncio.to_thread(path.read_bytes)
    headers = {"Content-Type": f"{_TYPES[path.suffix]}; charset=utf-8"}
    if path.suffix != ".html":
        # Scripts, styles and the atlas: kept by the browser but asked again each time
        # (a 304 while the bytes are the same), so a reload parses cached code and an
        # upgrade is seen at once. The page itself is never stored.
        etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
        headers |= {"Cache-Control": "no-cache", "ETag": etag}
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=_headers(headers))
    return web.Response(body=body, headers=_headers(headers))


async def sign_in(request: web.Request) -> web.Response:
    """Exchange an admin token for a session cookie (sign-in)."""
    sessions = request.config_dict[SESSIONS_KEY]
    if "Origin" in request.headers and not same_origin(request):
        return error_response(403, "Sign-in from another origin is refused.",
                              type_="permission_error", code="cross_origin")  # fmt: skip
    wait = sessions.sign_in_limiter.try_acquire(request.remote or "")
    if wait > 0:
        return error_response(
            429, "Too many sign-in attempts; try again later.", type_="rate_limit_error",
            code="rate_limited", headers={"Retry-After": str(max(1, round(wait)))},
        )  # fmt: skip

    body = await json_body(request)
    token = body.get("token")
    if not isinstance(token, str) or not token or len(token) > 1024:
        raise InvalidParameter("token", "token must be an admin token (a non-empty string)")
    try:
        opened = await sessions.open(token.strip())
    except SignInsFullError:
        return error_response(503, "Too many dashboard sign-ins; try again later.",
                              type_="server_error", code="too_many_sign_ins")  # fmt: skip
    audit = request.config_dict[AUDIT_KEY]
    if opened is None:
        await audit.append_refusal(
            action="POST /v1/dashboard/session", outcome="refused", status=401, actor_id="",
            actor_name="", role="", peer=request.remote or "", detail="invalid_admin_token",
        )  # fmt: skip
        return error_response(401, "That is not a valid admin token.",
                              type_="authentication_error", code="invalid_admin_token")  # fmt: skip
    session_id, caller = opened
    await audit.append(
        action="POST /v1/dashboard/session", outcome="ok", status=201,
        actor_id=caller.token_id, actor_name=caller.name, role=caller.role.label,
        target="dashboard sign-in", peer=request.remote or "",
    )  # fmt: skip
    response = web.json_response(
        {"object": "dashboard_session", "name": caller.name, "role": caller.role.label,
         "token_id": caller.token_id, "expires_in_s": int(sessions.ttl_s)},
        status=201, headers={"Cache-Control": "no-store"},
    )  # fmt: skip
    response.set_cookie(
        COOKIE, session_id, httponly=True, samesite="Strict", secure=request.secure, path="/",
        max_age=int(sessions.ttl_s),
    )  # fmt: skip
    return response


async def sign_out(request: web.Request) -> web.Response:
    """End the session of the request's cookie (if any) and clear the cookie."""
    if "Origin" in request.headers and not same_origin(request):
        return error_response(403, "Sign-out from another origin is refused.",
                              type_="permission_error", code="cross_origin")  # fmt: skip
    session_id = request.cookies.get(COOKIE, "")
    closed = bool(session_id) and await request.config_dict[SESSIONS_KEY].close(session_id)
    response = web.json_response({"object": "dashboard_session", "signed_out": closed})
    response.del_cookie(COOKIE, path="/")
    return response


async def fleet_series(request: web.Request) -> web.Response:
    """The fleet's last hour at 10 s resolution, and the bucket still filling."""
    series = request.config_dict[EVENTS_KEY].series
    return web.json_response(
        {"object": "fleet_series", "step_s": 10, "points": series.points(),
         "current": series.current()}
    )  # fmt: skip


async def agent_series(request: web.Request) -> web.Response:
    """One agent's last hour at 10 s resolution (its own reports: tokens/s, requests and
    failures/s, queue, TTFT), and the step still filling; 404 for an agent the
    coordinator neither knows nor has a history of."""
    agent_id = request.match_info["agent_id"]
    events = request.config_dict[EVENTS_KEY]
    if agent_id not in events.agent_series and not events.knows(agent_id):
        return error_response(404, f"No agent {agent_id!r}.", type_="invalid_request_error",
                              code="agent_not_found")  # fmt: skip
    points, current = events.agent_series.history(agent_id)
    return web.json_response(
        {"object": "agent_series", "agent_id": agent_id, "step_s": 10, "points": points,
         "current": current}
    )  # fmt: skip


async def fleet_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``agents`` (rows of changed agents, each with the report's
    receive time) and ``point`` (each closed 10 s bucket of the fleet series). A client
    that does not send ``Accept: text/event-stream`` gets the ``ready`` event only."""
    events = request.config_dict[EVENTS_KEY]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                 "X-Accel-Buffering": "no"}
    )  # fmt: skip
    await response.prepare(request)
    await response.write(b"retry: 2000\nevent: ready\ndata: {}\n\n")
    if "text/event-stream" not in request.headers.get("Accept", ""):
        # Not an event-stream client (EventSource always says it is): the first event
        # only, so that a plain HTTP client is not held open forever.
        await response.write_eof()
        return response
    queue = events.subscribe()
    try:
        while True:
            message = await queue.get()
            if message is None:
                break
            await response.write(message)
    except ConnectionResetError:  # the page went away
        pass
    finally:
        events.unsubscribe(queue)
    return response


# Public routes of the dashboard (the authorize middleware passes them: role None).
DASHBOARD_ROUTES = [
    web.get("/dashboard/", dashboard_file),
    web.get("/dashboard/{name}", dashboard_file),
    web.get("/dashboard/vendor/{name}", dashboard_file),
    web.post(SESSION_PATH, sign_in),
    web.delete(SESSION_PATH, sign_out),
]
DASHBOARD_ROUTE_ROLES: dict[tuple[str, str], Role | None] = {
    ("GET", "/dashboard/"): None,
    ("GET", "/dashboard/{name}"): None,
    ("GET", "/dashboard/vendor/{name}"): None,
    ("POST", SESSION_PATH): None,
    ("DELETE", SESSION_PATH): None,
}
