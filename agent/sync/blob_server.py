"""``GET``/``HEAD /v1/blobs/sha256/{hex}``: this agent's store, served to site peers.

The protocol (strong ``ETag``, ``If-None-Match``, ``If-Range``, one byte ``Range``, 416)
is :mod:`edgefleet.blob_http`, shared with the coordinator's blob server; here: which
store, the 503 "fetching" answer, and errors in the agent's OpenAI format. Only complete,
verified blobs are ever served (``.part`` files live elsewhere). The receiver checks every
hash; blobs are named by the sha256 in signed manifests, so this route asks for no API
key (``models.serve_blobs = false`` turns it off).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from agent.api.http_io import error_body
from agent.errors import ModelNotFoundError, RequestError
from agent.sync.fetch import FETCHING_HEADER
from agent.sync.store import ModelStore
from edgefleet.blob_http import RangeNotSatisfiable, send_blob
from edgefleet.model_signing import SHA256_PATTERN

_BLOB_HEADERS = {"Cache-Control": "immutable"}


class RangeNotSatisfiableError(RequestError):
    status = 416
    code = "range_not_satisfiable"


def blob_handler(
    store: Callable[[], ModelStore | None],
    fetching: Callable[[str], bool] = lambda _: False,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``fetching(hex)``: whether this agent is downloading that blob now (a peer asking
    gets 503 with ``X-Edgefleet-Fetching: 1`` and waits instead of going elsewhere)."""

    async def serve_blob(request: web.Request) -> web.StreamResponse:
        hex_ = request.match_info["hex"]
        current = store()
        if current is None or not SHA256_PATTERN.fullmatch(hex_):
            raise ModelNotFoundError(f"no blob {hex_[:80]!r} here")
        path = current.stored_blob(hex_)
        try:
            return await send_blob(request, path, hex_, extra_headers=_BLOB_HEADERS)
        except FileNotFoundError:
            if fetching(hex_):
                body = error_body("this agent is fetching the blob; ask again", "server_error")
                headers = {FETCHING_HEADER: "1", "Retry-After": "1"}
                return web.json_response(body, status=503, headers=headers)
            raise ModelNotFoundError(f"no blob {hex_} here") from None
        except RangeNotSatisfiable as exc:
            error = RangeNotSatisfiableError(exc.message)
            body = error_body(error.message, error.error_type, code=error.code)
            return web.json_response(body, status=error.status, headers=exc.headers)

    return serve_blob
