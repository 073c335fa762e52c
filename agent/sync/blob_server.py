"""``GET``/``HEAD /v1/blobs/sha256/{hex}``: this agent's store, served to site peers.

The same protocol as the coordinator's blob server: one ``Range`` (``bytes=a-b``,
``bytes=a-``, ``bytes=-n``) answered 206 with ``Content-Range`` (416 when it cannot be
satisfied), a strong ``ETag`` that is the quoted sha256, ``If-None-Match`` (304) and
``If-Range``. Only complete, verified blobs are ever served (``.part`` files live
elsewhere). The receiver checks every hash; blobs are named by the sha256 in signed
manifests, so this route asks for no API key (``models.serve_blobs = false`` turns it off).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from agent.api.http_io import error_body
from agent.errors import ModelNotFoundError, RequestError
from agent.sync.fetch import FETCHING_HEADER
from agent.sync.store import ModelStore
from edgefleet.model_signing import SHA256_PATTERN

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 1 << 20


class RangeNotSatisfiable(RequestError):
    status = 416
    code = "range_not_satisfiable"


def _range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) for a single byte range; None for a header we do not honour."""
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:
        n = int(last)
        if n == 0:
            raise RangeNotSatisfiable(f"empty suffix range of a {size}-byte blob")
        return max(0, size - n), size
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    if start >= size or end <= start:
        raise RangeNotSatisfiable(f"range {header.strip()!r} is outside the {size}-byte blob")
    return start, end


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
            size = path.stat().st_size
        except FileNotFoundError:
            if fetching(hex_):
                body = error_body("this agent is fetching the blob; ask again", "server_error")
                headers = {FETCHING_HEADER: "1", "Retry-After": "1"}
                return web.json_response(body, status=503, headers=headers)
            raise ModelNotFoundError(f"no blob {hex_} here") from None
        etag = f'"{hex_}"'
        headers = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": "immutable"}
        if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
            return web.Response(status=304, headers=headers)
        span = (0, size)
        status = 200
        wanted = request.headers.get("Range")
        if_range = request.headers.get("If-Range")
        if wanted and (if_range is None or if_range.strip() == etag):
            try:
                chosen = _range(wanted, size)
            except RangeNotSatisfiable as exc:
                body = error_body(exc.message, exc.error_type, code=exc.code)
                headers["Content-Range"] = f"bytes */{size}"
                return web.json_response(body, status=416, headers=headers)
            if chosen is not None:
                span, status = chosen, 206
                headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{size}"
        start, end = span
        response = web.StreamResponse(status=status, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = end - start
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        with open(path, "rb") as fh:
            fh.seek(start)
            left = end - start
            while left > 0:
                chunk = fh.read(min(_CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                await response.write(chunk)
        await response.write_eof()
        return response

    return serve_blob
