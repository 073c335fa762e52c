"""Read timeouts and a connection cap for both processes' aiohttp servers.

aiohttp bounds sizes (``client_max_size``, header line and field sizes) but not time,
and it accepts every connection. What it offers and what is added here:

- headers: aiohttp's ``keepalive_timeout`` timer starts when a connection opens and again
  after each response, and closes the connection if a request's headers are not complete
  by then. Set to ``header_timeout_s``, it bounds a slow (or never finished) request head
  and an idle keep-alive connection alike.
- body: nothing in aiohttp; :func:`body_deadline` (a middleware) reads the whole body
  before the handler runs, within ``body_timeout_s``, and answers 408 otherwise. The
  handler then reads the cached bytes. ``lingering_time`` bounds what aiohttp reads of
  an unread body after the response.
- connections: nothing in aiohttp; :class:`LimitedAppRunner` builds a server that
  answers 503 and closes a connection accepted beyond ``max_connections``.

What aiohttp answers itself, before any handler or middleware runs (a header line over
8,190 bytes, a request line it cannot parse, a connection beyond the cap), is in the APIs'
own error format (OpenAI's ``{"error": {...}}``), not aiohttp's plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

from edgefleet.openai_errors import openai_error

log = logging.getLogger(__name__)


def error_body(status: int, message: str) -> bytes:
    """An error in the OpenAI format both APIs answer in."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps(openai_error(message, kind)).encode()


_BUSY_BODY = error_body(503, "too many connections; retry later")
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n".encode()
    + b"\r\n"
    + _BUSY_BODY
)
# What aiohttp reads of an unread request body after the response, at most (s).
LINGERING_S = 2.0


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Time and connection bounds of one HTTP server."""

    # A request's head (request line and headers) must arrive within this many seconds of
    # the connection opening or of the previous response; idle keep-alive connections close
    # after it too.
    header_timeout_s: float = 10.0
    # A request's body must arrive within this many seconds of its head (else 408).
    body_timeout_s: float = 30.0
    # Open connections at most; those beyond get 503 and are closed.
    max_connections: int = 1024


def body_deadline(timeout_s: float) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware that reads a request's body within ``timeout_s`` or answers 408."""

    @web.middleware
    async def middleware(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        declared = request.content_length
        too_large = declared is not None and declared > request.client_max_size
        # a body declared too large is the handler's to refuse (413), unread
        if request.body_exists and not too_large:
            try:
                async with asyncio.timeout(timeout_s):
                    await request.read()  # cached: the handler's read()/json() get it
            except TimeoutError:
                raise web.HTTPRequestTimeout(
                    text=f"request body not received within {timeout_s:g} s"
                ) from None
        return await handler(request)

    return middleware


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's request handler, its own error answers in the APIs' error format."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if already sent
        if status >= 500 or not message:  # never a traceback, whatever aiohttp's debug says
            message = HTTPStatus(status).phrase
        response = web.Response(
            status=status, body=error_body(status, message), content_type="application/json"
        )
        response.force_close()
        return response


class ConnectionCappedServer(Server):
    """aiohttp's server, answering 503 to connections beyond ``max_connections``."""

    def __init__(self, base: Server, max_connections: int) -> None:
        # the same construction aiohttp's AppRunner gave ``base`` (its loop and handler
        # arguments live in private attributes)
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        self.max_connections = max_connections
        self.refused = 0

    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        if len(self._connections) >= self.max_connections:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "HTTP connections at the cap (%d): refused %d so far",
                    self.max_connections,
                    self.refused,
                )
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(handler, transport)


class LimitedAppRunner(web.AppRunner):
    """``web.AppRunner`` with :class:`HttpLimits` applied to the server it builds."""

    def __init__(self, app: web.Application, limits: HttpLimits, **kwargs: Any) -> None:
        # innermost, so the app's own error middleware formats the 408
        app.middlewares.append(body_deadline(limits.body_timeout_s))
        kwargs.setdefault("keepalive_timeout", limits.header_timeout_s)
        kwargs.setdefault("lingering_time", LINGERING_S)
        super().__init__(app, **kwargs)
        self.limits = limits

    async def _make_server(self) -> Server:
        return ConnectionCappedServer(await super()._make_server(), self.limits.max_connections)
