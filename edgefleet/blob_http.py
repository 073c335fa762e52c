"""``GET``/``HEAD /v1/blobs/sha256/{hex}``: the blob protocol, one implementation.

The coordinator's blob server and an agent's peer blob server speak the same protocol;
this module is it, and each side keeps only its own concerns (who may read, metrics,
the agent's 503 "fetching" answer, its error body format):

- a strong ``ETag`` that is the quoted sha256 (blobs are content-addressed and never
  change), ``Accept-Ranges: bytes``;
- ``If-None-Match`` (a list, ``*``, weak comparison as RFC 9110 13.1.2 asks) -> 304;
- ONE byte range: ``bytes=a-b``, ``bytes=a-``, ``bytes=-n`` -> 206 with
  ``Content-Range``; a range that selects no byte of the blob, or a backwards
  ``bytes=5-3``, -> 416 with ``Content-Range: bytes */size`` (raised as
  :class:`RangeNotSatisfiable`, so that each side answers in its own error format);
  a header that is not one valid byte range (another unit, several ranges, garbage)
  is ignored and the whole blob sent, as RFC 9110 14.2 allows;
- ``If-Range`` with anything but the blob's strong ETag (another tag, a weak tag, a
  date) -> the range is ignored and the whole blob sent;
- the body sent with ``sendfile(2)`` (the kernel copies file to socket: the server spends
  almost no CPU on a blob, which matters on a 2-core edge box serving its site's peers),
  in pieces so that progress is counted; where the transport cannot (TLS), in 1 MiB
  chunks read off the event loop and written through aiohttp; ``HEAD`` gets the headers.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

CHUNK = 1 << 20
# Bytes per sendfile call (progress is counted after each).
SENDFILE_PIECE = 8 << 20
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
# More digits than this is a number beyond any file (and int() of thousands of digits
# would raise); such a number counts as _HUGE.
_MAX_DIGITS = 18
_HUGE = 10**_MAX_DIGITS


class RangeNotSatisfiable(Exception):
    """The one requested range selects no byte of the blob: answer 416 with ``headers``
    (they carry ``Content-Range: bytes */size``) and ``message`` in the side's format."""

    def __init__(self, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})


def strong_etag(sha256: str) -> str:
    return f'"{sha256}"'


def etag_listed(header: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` value names ``etag`` (``*``, or the tag weak or strong)."""
    if not header.strip():
        return False
    tags = [t.strip() for t in header.split(",")]
    bare = etag.removeprefix("W/")
    return "*" in tags or bare in tags or f"W/{bare}" in tags


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= _MAX_DIGITS else _HUGE


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) for one ``bytes=`` range of a ``size``-byte blob.

    None: not one valid byte range (ignore it, send the whole blob). Raises
    :class:`RangeNotSatisfiable` when the range is valid but selects no byte."""
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    unsatisfiable = RangeNotSatisfiable(
        f"range {header.strip()[:80]!r} is not satisfiable for a {size}-byte blob"
    )
    if not first:  # the last n bytes
        n = _number(last)
        if n == 0 or size == 0:
            raise unsatisfiable
        return max(0, size - n), size
    start = _number(first)
    if start >= size:
        raise unsatisfiable
    if last and _number(last) < start:
        raise unsatisfiable  # "bytes=5-3": both servers have always answered 416
    end = size if not last else min(_number(last) + 1, size)
    return start, end


async def _send_by_chunks(
    response: web.StreamResponse,
    handle: Any,
    offset: int,
    left: int,
    on_bytes: Callable[[int], None] | None,
) -> None:
    handle.seek(offset)
    while left > 0:
        chunk = await asyncio.to_thread(handle.read, min(CHUNK, left))
        if not chunk:
            return  # the file shrank under us: the client sees a short body
        left -= len(chunk)
        await response.write(chunk)
        if on_bytes is not None:
            on_bytes(len(chunk))


async def _sendfile(
    response: web.StreamResponse,
    transport: asyncio.Transport,
    handle: Any,
    offset: int,
    left: int,
    on_bytes: Callable[[int], None] | None,
) -> None:
    """The kernel copies the file to the socket, in pieces (progress between them); where
    it cannot (no ``sendfile``), by chunks through aiohttp before the first byte."""
    loop = asyncio.get_running_loop()
    start = offset
    while left > 0:
        try:
            sent = await loop.sendfile(
                transport, handle, offset, min(SENDFILE_PIECE, left), fallback=False
            )
        except RuntimeError:  # SendfileNotAvailableError too: raised before any byte
            if offset != start:
                raise
            await _send_by_chunks(response, handle, offset, left, on_bytes)
            return
        if not sent:
            return  # the file shrank under us: the client sees a short body
        offset += sent
        left -= sent
        if on_bytes is not None:
            on_bytes(sent)


def plan(headers: Mapping[str, str], etag: str, size: int) -> tuple[int, tuple[int, int]]:
    """(status, [start, end)) for a ``GET`` of a ``size``-byte blob: 304, 200 or 206.

    Raises :class:`RangeNotSatisfiable` (without headers) for 416."""
    if etag_listed(headers.get("If-None-Match", ""), etag):
        return 304, (0, 0)
    wanted = headers.get("Range")
    if_range = headers.get("If-Range")
    if wanted is not None and (if_range is None or if_range.strip() == etag):
        span = byte_range(wanted, size)
        if span is not None:
            return 206, span
    return 200, (0, size)


async def send_blob(
    request: web.Request,
    path: Path,
    sha256: str,
    *,
    extra_headers: Mapping[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with the blob at ``path`` (named by ``sha256``).

    Raises FileNotFoundError when there is no such file (before anything is sent) and
    :class:`RangeNotSatisfiable` for 416 (its ``headers`` are the ones to answer with).
    ``extra_headers`` go on every answer (``Cache-Control``); ``on_bytes(n)`` is called
    for every chunk of ``n`` body bytes written."""
    handle = path.open("rb")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        etag = strong_etag(sha256)
        headers = {"ETag": etag, "Accept-Ranges": "bytes", **(extra_headers or {})}
        try:
            status, (start, end) = plan(request.headers, etag, size)
        except RangeNotSatisfiable as exc:
            exc.headers = headers | {"Content-Range": f"bytes */{size}"}
            raise
        if status == 304:
            return web.Response(status=304, headers=headers)
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = end - start
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the client went away")
        if transport.get_extra_info("sslcontext") is not None:
            # TLS: the kernel cannot; read off the loop and write through aiohttp (whose
            # flow control asyncio's own sendfile fallback breaks: it resumes a writer that
            # aiohttp never paused)
            await _send_by_chunks(response, handle, start, end - start, on_bytes)
        else:
            await _sendfile(response, transport, handle, start, end - start, on_bytes)
        await response.write_eof()
        return response
