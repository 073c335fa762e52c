"""edgefleet.blob_http: the blob protocol both blob servers speak, tested on its own.

The parsing and conditional checks directly, then ``send_blob`` behind a real aiohttp
server: whole file, ranges (a-b, a-, -n), 416 with ``Content-Range: bytes */size``,
If-Range mismatch -> whole file, If-None-Match lists -> 304, HEAD, the byte counter,
a missing file, and a blob of several chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from edgefleet.blob_http import (
    SENDFILE_PIECE,
    RangeNotSatisfiable,
    byte_range,
    etag_listed,
    plan,
    send_blob,
    strong_etag,
)

SIZE = 1000


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("header", "span"),
    [
        ("bytes=0-9", (0, 10)),
        ("bytes=10-19", (10, 20)),
        ("  bytes=10-19  ", (10, 20)),
        ("bytes=990-", (990, 1000)),
        ("bytes=0-", (0, 1000)),
        ("bytes=990-5000", (990, 1000)),  # the end is clamped to the blob
        ("bytes=999-999", (999, 1000)),
        ("bytes=-10", (990, 1000)),  # suffix: the last 10 bytes
        ("bytes=-1", (999, 1000)),
        ("bytes=-5000", (0, 1000)),  # a suffix longer than the blob is all of it
        ("bytes=0-" + "9" * 5000, (0, 1000)),  # a huge end: no ValueError from int()
        ("bytes=-" + "9" * 5000, (0, 1000)),
    ],
)
def test_byte_range_satisfiable(header: str, span: tuple[int, int]) -> None:
    assert byte_range(header, SIZE) == span


@pytest.mark.parametrize(
    "header",
    [
        "bytes=1000-",  # starts at the end
        "bytes=5000-6000",
        "bytes=" + "9" * 5000 + "-",
        "bytes=-0",  # an empty suffix
        "bytes=20-10",  # backwards
    ],
)
def test_byte_range_unsatisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable, match=f"not satisfiable for a {SIZE}-byte blob"):
        byte_range(header, SIZE)


def test_byte_range_of_an_empty_blob_is_never_satisfiable() -> None:
    for header in ("bytes=0-", "bytes=0-0", "bytes=-1"):
        with pytest.raises(RangeNotSatisfiable):
            byte_range(header, 0)


@pytest.mark.parametrize(
    "header",
    ["", "bytes=-", "bytes=0-1,5-9", "items=0-9", "bytes=a-b", "bytes 0-9", "bytes=0--9"],
)
def test_byte_range_ignores_what_is_not_one_byte_range(header: str) -> None:
    assert byte_range(header, SIZE) is None


def test_etag_listed() -> None:
    etag = strong_etag("ab" * 32)
    assert etag == f'"{"ab" * 32}"'
    assert etag_listed(etag, etag)
    assert etag_listed(f'"x", {etag} ,"y"', etag)
    assert etag_listed(f"W/{etag}", etag)  # If-None-Match compares weakly
    assert etag_listed("*", etag)
    assert not etag_listed('"x", "y"', etag)
    assert not etag_listed("", etag)
    assert not etag_listed("  ", etag)


def test_plan() -> None:
    etag = strong_etag("cd" * 32)
    assert plan({}, etag, SIZE) == (200, (0, SIZE))
    assert plan({"Range": "bytes=5-9"}, etag, SIZE) == (206, (5, 10))
    assert plan({"Range": "bytes=5-9", "If-Range": etag}, etag, SIZE) == (206, (5, 10))
    # If-Range with another tag, a weak tag or a date: the whole blob
    for if_range in ('"other"', f"W/{etag}", "Mon, 30 Nov 2026 10:00:00 GMT"):
        assert plan({"Range": "bytes=5-9", "If-Range": if_range}, etag, SIZE) == (200, (0, SIZE))
    # If-None-Match wins over Range
    assert plan({"Range": "bytes=5-9", "If-None-Match": etag}, etag, SIZE)[0] == 304
    assert plan({"Range": "bytes=0-1,4-5"}, etag, SIZE) == (200, (0, SIZE))
    with pytest.raises(RangeNotSatisfiable):
        plan({"Range": f"bytes={SIZE}-"}, etag, SIZE)
    # an unsatisfiable range under a mismatched If-Range is not looked at
    assert plan({"Range": f"bytes={SIZE}-", "If-Range": '"x"'}, etag, SIZE)[0] == 200


# ------------------------------------------------------------------ send_blob over HTTP


class Served:
    def __init__(self, client: TestClient[web.Request, web.Application], data: bytes) -> None:
        self.client = client
        self.data = data
        self.sha = hashlib.sha256(data).hexdigest()
        self.counted: list[int] = []

    @property
    def url(self) -> str:
        return f"/v1/blobs/sha256/{self.sha}"

    async def total_counted(self, expected: int) -> int:
        """What ``on_bytes`` counted, once it reaches ``expected`` (the server counts a
        piece after the kernel has taken it, so the client can have read it first)."""
        for _ in range(200):
            if sum(self.counted) >= expected:
                break
            await asyncio.sleep(0.01)
        return sum(self.counted)


async def _serve(tmp_path: Path, data: bytes) -> AsyncIterator[Served]:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    sha = hashlib.sha256(data).hexdigest()
    (blobs / sha).write_bytes(data)
    served: list[Served] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        hex_ = request.match_info["hex"]
        try:
            return await send_blob(
                request,
                blobs / hex_,
                hex_,
                extra_headers={"Cache-Control": "immutable"},
                on_bytes=served[0].counted.append,
            )
        except FileNotFoundError:
            return web.json_response({"error": "missing"}, status=404)
        except RangeNotSatisfiable as exc:
            return web.json_response({"error": exc.message}, status=416, headers=exc.headers)

    app = web.Application()
    app.router.add_get("/v1/blobs/sha256/{hex}", handler)
    async with TestClient(TestServer(app)) as client:
        served.append(Served(client, data))
        yield served[0]


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Served]:
    async for served in _serve(tmp_path, os.urandom(SIZE)):
        yield served


async def test_whole_blob(small: Served) -> None:
    response = await small.client.get(small.url)
    assert response.status == 200
    assert await response.read() == small.data
    assert response.headers["ETag"] == f'"{small.sha}"'
    assert response.headers["Accept-Ranges"] == "bytes"
    assert response.headers["Cache-Control"] == "immutable"
    assert response.headers["Content-Length"] == str(SIZE)
    assert response.content_type == "application/octet-stream"
    assert "Content-Range" not in response.headers
    assert await small.total_counted(SIZE) == SIZE


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [("bytes=10-19", 10, 19), ("bytes=990-", 990, 999), ("bytes=-25", 975, 999)],
)
async def test_ranges(small: Served, header: str, first: int, last: int) -> None:
    response = await small.client.get(small.url, headers={"Range": header})
    assert response.status == 206
    assert await response.read() == small.data[first : last + 1]
    assert response.headers["Content-Range"] == f"bytes {first}-{last}/{SIZE}"
    assert response.headers["Content-Length"] == str(last + 1 - first)
    assert await small.total_counted(last + 1 - first) == last + 1 - first


async def test_unsatisfiable(small: Served) -> None:
    for header in (f"bytes={SIZE}-", "bytes=-0", "bytes=50-40"):
        response = await small.client.get(small.url, headers={"Range": header})
        assert response.status == 416
        assert response.headers["Content-Range"] == f"bytes */{SIZE}"
        assert response.headers["ETag"] == f'"{small.sha}"'
        assert response.headers["Cache-Control"] == "immutable"
        assert "not satisfiable" in (await response.json())["error"]
    assert small.counted == []


async def test_if_range_mismatch_sends_the_whole_blob(small: Served) -> None:
    headers = {"Range": "bytes=0-9", "If-Range": '"something-else"'}
    response = await small.client.get(small.url, headers=headers)
    assert response.status == 200 and await response.read() == small.data
    headers = {"Range": "bytes=0-9", "If-Range": f'"{small.sha}"'}
    response = await small.client.get(small.url, headers=headers)
    assert response.status == 206 and await response.read() == small.data[:10]


async def test_if_none_match(small: Served) -> None:
    for header in (f'"{small.sha}"', f'"nope", "{small.sha}"', f'W/"{small.sha}"', "*"):
        response = await small.client.get(small.url, headers={"If-None-Match": header})
        assert response.status == 304, header
        assert response.headers["ETag"] == f'"{small.sha}"'
        assert await response.read() == b""
    response = await small.client.get(small.url, headers={"If-None-Match": '"nope"'})
    assert response.status == 200 and await response.read() == small.data


async def test_ignored_range_headers_send_the_whole_blob(small: Served) -> None:
    for header in ("bytes=0-1,5-9", "items=0-9", "bytes=x-"):
        response = await small.client.get(small.url, headers={"Range": header})
        assert response.status == 200 and await response.read() == small.data


async def test_head(small: Served) -> None:
    response = await small.client.head(small.url)
    assert response.status == 200
    assert response.headers["Content-Length"] == str(SIZE)
    assert response.headers["ETag"] == f'"{small.sha}"'
    assert await response.read() == b""
    response = await small.client.head(small.url, headers={"Range": "bytes=-10"})
    assert response.status == 206
    assert response.headers["Content-Range"] == f"bytes {SIZE - 10}-{SIZE - 1}/{SIZE}"
    assert response.headers["Content-Length"] == "10"
    assert small.counted == []


async def test_missing_blob(small: Served) -> None:
    response = await small.client.get(f"/v1/blobs/sha256/{'0' * 64}")
    assert response.status == 404


async def test_a_blob_of_several_pieces(tmp_path: Path) -> None:
    """Sent by sendfile in pieces, each counted once the kernel took it."""
    piece = SENDFILE_PIECE
    data = os.urandom(2 * piece + 12345)
    async for served in _serve(tmp_path, data):
        response = await served.client.get(served.url)
        assert response.status == 200 and await response.read() == data
        assert await served.total_counted(len(data)) == len(data)
        assert served.counted == [piece, piece, 12345]
        first = piece - 5
        headers = {"Range": f"bytes={first}-{first + piece + 9}"}
        response = await served.client.get(served.url, headers=headers)
        assert response.status == 206
        assert await response.read() == data[first : first + piece + 10]


async def test_a_blob_over_tls(tmp_path: Path) -> None:
    """Over TLS (peers and the coordinator serve blobs over mutual TLS) the kernel cannot
    sendfile: the blob goes in chunks through aiohttp, with a slowly reading client (over
    TLS asyncio's own sendfile fallback resumed a writer aiohttp had never paused: the
    runbook test in CI got a 500 after 16 MiB; that race is not reproduced here)."""
    from coordinator.identity.ca import CertificateAuthority
    from edgefleet.tls import fleet_client_context, server_context
    from tests.certs import write_agent_cert

    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    files = write_agent_cert(ca, tmp_path, "edge-a")
    data = os.urandom(3 * SENDFILE_PIECE + 4321)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / sha).write_bytes(data)
    counted: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        return await send_blob(request, tmp_path / sha, sha, on_bytes=counted.append)

    app = web.Application()
    app.router.add_get("/b", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(files)).start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}/b"
    try:
        async with aiohttp.ClientSession() as http:
            context = fleet_client_context(ca.cert_pem)
            async with http.get(url, ssl=context) as response:
                assert response.status == 200
                got = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    got += chunk
                    await asyncio.sleep(0.002)  # a slow reader: the server must pause
                assert bytes(got) == data
            async with http.get(url, ssl=context, headers={"Range": "bytes=-100"}) as response:
                assert response.status == 206 and await response.read() == data[-100:]
        for _ in range(200):
            if sum(counted) >= len(data) + 100:
                break
            await asyncio.sleep(0.01)
        assert sum(counted) == len(data) + 100
    finally:
        await runner.cleanup()
