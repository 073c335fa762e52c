"""The blob fetcher against real HTTP servers: mutual TLS, sources that lie about ranges
or lengths, a cancelled download and the bandwidth cap.

The fetcher receives on threads (blocking sockets, ``http.client``); these tests are
what the fleet tests do not reach: an https source with client certificates (peers serve
their stores over mutual TLS), answers that must be refused before a byte is written, and
that a cancelled fetch stops writing before it returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from agent.errors import ModelSyncError
from agent.sync.fetch import FETCHING_HEADER, BlobFetcher, BlobSource
from agent.sync.store import ModelStore
from coordinator.identity.ca import CertificateAuthority
from edgefleet.blob_http import send_blob
from edgefleet.tls import agent_client_context, server_context
from tests.certs import write_agent_cert

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Blob:
    def __init__(self, directory: Path, size: int) -> None:
        self.data = os.urandom(size)
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.path = directory / self.sha256
        self.path.write_bytes(self.data)


@pytest.fixture
def blob(tmp_path: Path) -> Blob:
    return Blob(tmp_path, 3 * (1 << 20) + 12345)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """``await serve(handler, ssl_context=None)``: the base URL of a real server."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler, ssl_context: object = None) -> str:
        app = web.Application()
        app.router.add_get("/v1/blobs/sha256/{hex}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()  # type: ignore[arg-type]
        runners.append(runner)
        scheme = "https" if ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{runner.addresses[0][1]}/v1/blobs"

    yield start
    for runner in runners:
        await runner.cleanup()


def blob_handler(blob: Blob) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.match_info["hex"] != blob.sha256:
            raise web.HTTPNotFound()
        return await send_blob(request, blob.path, blob.sha256)

    return handler


def ignore(n: int, kind: str) -> None:
    pass


async def test_over_mutual_tls_with_the_fleet_ca(
    tmp_path: Path, blob: Blob, serve: Callable[..., Awaitable[str]]
) -> None:
    """A peer serving over mutual TLS: an agent with the fleet's certificate gets the blob;
    one with a certificate of another CA is refused by the peer; one that does not trust
    the peer's CA refuses the peer. Neither failure leaves anything in the store."""
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    server = server_context(
        write_agent_cert(ca, tmp_path, "peer"), ca.cert_pem, client_certs="required"
    )
    base = await serve(blob_handler(blob), server)
    source = [BlobSource(base, "peer")]

    fleet = agent_client_context(write_agent_cert(ca, tmp_path, "agent"), ca.cert_pem)
    fetcher = BlobFetcher(ModelStore(tmp_path / "store"), ssl=fleet)
    got: list[int] = []
    await fetcher.fetch(blob.sha256, len(blob.data), source, lambda n, kind: got.append(n))
    await fetcher.close()
    assert fetcher.store.blob(blob.sha256).read_bytes() == blob.data
    assert sum(got) == len(blob.data)

    other = CertificateAuthority.load_or_create(tmp_path / "other-ca")
    contexts = {
        "a certificate the peer does not trust": agent_client_context(
            write_agent_cert(other, tmp_path, "stranger"), ca.cert_pem
        ),
        "a peer it does not trust": agent_client_context(
            write_agent_cert(ca, tmp_path, "agent2"), other.cert_pem
        ),
    }
    for case, context in contexts.items():
        fetcher = BlobFetcher(ModelStore(tmp_path / f"store-{len(case)}"), ssl=context)
        with pytest.raises(ModelSyncError, match="could not be fetched") as raised:
            await fetcher.fetch(blob.sha256, len(blob.data), source, ignore)
        await fetcher.close()
        assert base in str(raised.value), case
        assert not fetcher.store.has_blob(blob.sha256, len(blob.data)), case


async def test_a_range_answered_from_elsewhere_is_refused(
    tmp_path: Path, blob: Blob, serve: Callable[..., Awaitable[str]]
) -> None:
    """A resume asks for ``bytes=N-``; a source that answers 206 from another offset would
    splice the wrong bytes after the kept ones. It is refused before a byte is written,
    the kept part stays as it was, and the next source completes the blob."""

    async def liar(request: web.Request) -> web.StreamResponse:
        size = len(blob.data)
        body = blob.data[1000:]  # not where the client asked
        return web.Response(
            status=206,
            body=body,
            headers={"Content-Range": f"bytes 1000-{size - 1}/{size}", "ETag": f'"{blob.sha256}"'},
        )

    lying = await serve(liar)
    honest = await serve(blob_handler(blob))
    store = ModelStore(tmp_path / "store")
    kept = 1 << 20
    part = store.partial(blob.sha256)
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(blob.data[:kept])

    fetcher = BlobFetcher(store)
    with pytest.raises(ModelSyncError, match="Content-Range"):
        await fetcher.fetch(blob.sha256, len(blob.data), [BlobSource(lying, "coordinator")], ignore)
    assert part.read_bytes() == blob.data[:kept]

    sources = [BlobSource(lying, "peer"), BlobSource(honest, "coordinator")]
    await fetcher.fetch(blob.sha256, len(blob.data), sources, ignore)
    await fetcher.close()
    assert store.blob(blob.sha256).read_bytes() == blob.data


async def test_a_body_longer_than_listed_is_refused(
    tmp_path: Path, blob: Blob, serve: Callable[..., Awaitable[str]]
) -> None:
    """The manifest lists each file's size: a source announcing more (or, streaming
    without a length, sending more) is wrong, and nothing of it is kept."""

    async def announces_more(request: web.Request) -> web.StreamResponse:
        return web.Response(body=blob.data + b"extra")

    async def streams_more(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(blob.data)
        await response.write(b"extra")
        await response.write_eof()
        return response

    for handler in (announces_more, streams_more):
        store = ModelStore(tmp_path / f"store-{handler.__name__}")
        fetcher = BlobFetcher(store)
        base = await serve(handler)
        with pytest.raises(ModelSyncError, match="more than the"):
            await fetcher.fetch(
                blob.sha256, len(blob.data), [BlobSource(base, "coordinator")], ignore
            )
        await fetcher.close()
        assert not store.partial(blob.sha256).exists(), handler.__name__
        assert not store.has_blob(blob.sha256, len(blob.data)), handler.__name__


async def test_a_cancelled_fetch_stops_writing_before_it_returns(
    tmp_path: Path, serve: Callable[..., Awaitable[str]]
) -> None:
    """Cancelling a fetch (a newer desired state, the agent stopping) returns promptly even
    while the receiving thread waits on a slow source, and nothing is written after: the
    next fetch resumes from exactly what is in the part."""
    blob = Blob(tmp_path, 4 << 20)
    release = asyncio.Event()

    async def stalls(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"ETag": f'"{blob.sha256}"'})
        response.content_length = len(blob.data)
        await response.prepare(request)
        await response.write(blob.data[: 1 << 20])
        await release.wait()  # the rest never comes while the test waits
        await response.write(blob.data[1 << 20 :])
        return response

    base = await serve(stalls)
    store = ModelStore(tmp_path / "store")
    fetcher = BlobFetcher(store)
    arrived: list[int] = []
    sources = [BlobSource(base, "coordinator")]
    task = asyncio.create_task(
        fetcher.fetch(blob.sha256, len(blob.data), sources, lambda n, kind: arrived.append(n))
    )
    deadline = time.monotonic() + 20
    while sum(arrived) < (1 << 20) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert sum(arrived) == 1 << 20
    began = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - began < 5, "cancelling waited for the source"
    part = store.partial(blob.sha256)
    kept = part.read_bytes()
    assert kept == blob.data[: len(kept)] and len(kept) == 1 << 20
    release.set()
    await asyncio.sleep(0.3)
    assert part.read_bytes() == kept, "written to after the cancelled fetch returned"

    resumed = await serve(blob_handler(blob))
    await fetcher.fetch(blob.sha256, len(blob.data), [BlobSource(resumed, "coordinator")], ignore)
    await fetcher.close()
    assert store.blob(blob.sha256).read_bytes() == blob.data


async def test_the_bandwidth_cap_holds_over_concurrent_downloads(
    tmp_path: Path, serve: Callable[..., Awaitable[str]]
) -> None:
    """Two blobs at once under a 1 MB/s cap shared by both: 3 MB cannot arrive in under
    2 s (the bucket holds one second's worth to start). Only a lower bound is checked."""
    blobs = [Blob(tmp_path, 1_500_000) for _ in range(2)]

    async def handler(request: web.Request) -> web.StreamResponse:
        for b in blobs:
            if request.match_info["hex"] == b.sha256:
                return await send_blob(request, b.path, b.sha256)
        raise web.HTTPNotFound()

    base = await serve(handler)
    fetcher = BlobFetcher(ModelStore(tmp_path / "store"), bandwidth_bytes_per_s=1_000_000)
    began = time.monotonic()
    sources = [BlobSource(base, "coordinator")]
    await asyncio.gather(*(fetcher.fetch(b.sha256, len(b.data), sources, ignore) for b in blobs))
    took = time.monotonic() - began
    await fetcher.close()
    assert took >= 1.9, f"3 MB under a 1 MB/s cap in {took:.2f} s"
    assert all(fetcher.store.blob(b.sha256).read_bytes() == b.data for b in blobs)


async def test_a_complete_part_is_committed_without_asking_again(
    tmp_path: Path, blob: Blob, serve: Callable[..., Awaitable[str]]
) -> None:
    """A ``.part`` that holds the whole blob (the agent died between the fsync and the
    rename) is checked and committed with no request; a complete-looking one with wrong
    bytes is thrown away and fetched whole."""
    asked: list[str | None] = []
    handler = blob_handler(blob)

    async def counting(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("Range"))
        return await handler(request)

    base = await serve(counting)
    # the wrong bytes: the first one flipped (an "x" put first was no change at all for the
    # 1 random blob in 256 that starts with "x", and both cases then shared a store)
    wrong = bytes([blob.data[0] ^ 0xFF]) + blob.data[1:]
    cases = ((blob.data, []), (wrong, [None]))
    for case, (kept, expected) in enumerate(cases):
        store = ModelStore(tmp_path / f"store-{case}")
        part = store.partial(blob.sha256)
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(kept)
        asked.clear()
        fetcher = BlobFetcher(store)
        await fetcher.fetch(blob.sha256, len(blob.data), [BlobSource(base, "coordinator")], ignore)
        await fetcher.close()
        assert asked == expected
        assert store.blob(blob.sha256).read_bytes() == blob.data


async def test_a_coordinator_fetching_the_blob_from_a_peer_coordinator_is_asked_again(
    tmp_path: Path, blob: Blob, serve: Callable[..., Awaitable[str]]
) -> None:
    """A coordinator that lists the version but is still fetching the blob from another
    coordinator answers 503 with X-Edgefleet-Fetching: the agent asks again (for
    ``coordinator_wait_s`` at most) instead of failing the version."""
    asked = []

    async def fetching_at_first(request: web.Request) -> web.StreamResponse:
        asked.append(time.monotonic())
        if len(asked) < 3:
            headers = {FETCHING_HEADER: "1", "Retry-After": "2"}
            return web.json_response({"error": {"code": "blob_fetching"}}, status=503,
                                     headers=headers)  # fmt: skip
        return await send_blob(request, blob.path, blob.sha256)

    store = ModelStore(tmp_path / "store")
    fetcher = BlobFetcher(store)
    fetcher.coordinator_poll_s = 0.05
    source = [BlobSource(await serve(fetching_at_first), "coordinator")]
    await fetcher.fetch(blob.sha256, len(blob.data), source, ignore)
    await fetcher.close()
    assert store.has_blob(blob.sha256, len(blob.data)) and len(asked) == 3

    # Still fetching past coordinator_wait_s: the fetch fails (the version is FAILED, and
    # a later section tries again), having asked more than once.
    asked.clear()
    other = ModelStore(tmp_path / "other")
    fetcher = BlobFetcher(other)
    fetcher.coordinator_poll_s, fetcher.coordinator_wait_s = 0.05, 0.0
    with pytest.raises(ModelSyncError, match="fetching"):
        await fetcher.fetch(blob.sha256, len(blob.data), source, ignore)
    await fetcher.close()
    assert len(asked) == 1 and not other.has_blob(blob.sha256, len(blob.data))
