"""What aiohttp answers by itself, before any handler runs (edgefleet/http_limits.py): in
the APIs' error format, not aiohttp's plain text. Real sockets against a LimitedAppRunner,
the server both the agent and the coordinator run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from edgefleet.http_limits import HttpLimits, LimitedAppRunner


@pytest_asyncio.fixture
async def server() -> AsyncIterator[int]:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/v1/route", hello)
    limits = HttpLimits(header_timeout_s=5, body_timeout_s=5, max_connections=2)
    runner = LimitedAppRunner(app, limits)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize(
    ("request_bytes", "says"),
    [
        (b"GET /v1/route?model=" + b"m" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "8190"),
        (b"GET /v1/route HTTP/1.1\r\nX-Big: " + b"h" * 20_000 + b"\r\n\r\n", "8190"),
        (b"\x16\x03\x01 not http at all\r\n\r\n", "https traffic on an http port"),
    ],
    ids=["long-url", "long-header", "not-http"],
)
async def test_what_aiohttp_refuses_is_answered_in_the_api_error_format(
    server: int, request_bytes: bytes, says: str
) -> None:
    status, headers, body = await _raw(server, request_bytes)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert says in error["message"].lower()
    assert set(error) == {"message", "type", "param", "code"}


async def test_a_connection_beyond_the_cap_gets_503_in_the_api_error_format(server: int) -> None:
    held = [await asyncio.open_connection("127.0.0.1", server) for _ in range(2)]
    try:
        await asyncio.sleep(0.1)
        status, headers, body = await _raw(server, b"GET /v1/route HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and headers["retry-after"] == "1"
        assert int(headers["content-length"]) == len(body)
        assert json.loads(body)["error"]["type"] == "server_error"
    finally:
        for _, writer in held:
            writer.close()


async def test_honest_requests_still_answered(server: int) -> None:
    status, _, body = await _raw(
        server, b"GET /v1/route HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 200 and json.loads(body) == {"ok": True}
