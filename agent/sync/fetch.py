"""Fetching blobs into the model store: site peers first, then the coordinator.

Each blob is fetched over HTTP from ``{base}/sha256/{hex}`` into ``partial/<hex>.part``:
a ``.part`` left by an earlier attempt (or a SIGKILL) is resumed with ``Range`` (and
``If-Range`` on the source's strong ETag, so a changed source starts over). Every byte is
hashed as it is written; the file is fsynced, and only when its sha256 is the one the
manifest names is it renamed into ``blobs/``. A source that serves wrong bytes (a peer
with a corrupt copy, a tampering middlebox) is caught there: its bytes are thrown away,
the source is skipped for the rest of this fetch and the next one is tried.

Limits: at most ``concurrency`` blobs at a time and ``bandwidth_bytes_per_s`` over all of
them (a token bucket; 0: unlimited).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ctypes
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

import aiohttp

from agent.errors import BlobIntegrityError, ModelSyncError
from agent.sync.store import ModelStore

log = logging.getLogger(__name__)

# Bytes handed to the writing/hashing thread at a time, at most (aiohttp joins what it has
# buffered into one chunk: one write and one hash call per chunk, each without the GIL).
_CHUNK = 2 << 20
_IN_FLIGHT = 8  # chunks the thread may be behind the network at most
_READ_BUFFER = 4 << 20  # the HTTP client's read buffer (high-water mark) per download
_WRITEBACK = 8 << 20  # bytes written before their writeback to disk is started
#: On a peer's 503: it is fetching the blob itself (ask again soon).
FETCHING_HEADER = "X-Edgefleet-Fetching"


class BlobNotHereError(ModelSyncError):
    """The source does not hold the blob (404)."""


class PeerFetchingError(ModelSyncError):
    """The peer is fetching the blob itself (503 with FETCHING_HEADER)."""


SourceKind = Literal["peer", "coordinator"]
#: ``progress(bytes, kind)`` after each chunk written.
Progress = Callable[[int, SourceKind], None]


@dataclass(frozen=True)
class BlobSource:
    """Where blobs can be fetched: a base URL (``.../v1/blobs``) and what it is."""

    base_url: str
    kind: SourceKind

    def url(self, sha256: str) -> str:
        return f"{self.base_url.rstrip('/')}/sha256/{sha256}"


class RateLimiter:
    """A token bucket shared by every download; ``rate`` bytes/s, 0: unlimited."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._allowance = rate
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._allowance = min(self.rate, self._allowance + (now - self._last) * self.rate)
            self._last = now
            self._allowance -= n
            if self._allowance < 0:
                await asyncio.sleep(-self._allowance / self.rate)


class BlobFetcher:
    """Fetches blobs into a :class:`ModelStore`."""

    def __init__(
        self,
        store: ModelStore,
        *,
        concurrency: int = 4,
        bandwidth_bytes_per_s: float = 0,
        headers: Callable[[BlobSource], dict[str, str]] | None = None,
        ssl: object = None,
        timeout_s: float = 60.0,
        peer_wait_s: float = 15.0,
    ) -> None:
        self.store = store
        self._slots = asyncio.Semaphore(concurrency)
        self.limiter = RateLimiter(bandwidth_bytes_per_s)
        #: Extra headers per source (the coordinator's bearer credential), settable later.
        self.headers = headers
        #: TLS context for https sources (the fleet CA and this agent's certificate).
        self.ssl = ssl
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        #: How long a follower asks peers that lack a blob before the coordinator, and how
        #: often (a peer still fetching it is waited for as long as it keeps fetching).
        self.peer_wait_s = peer_wait_s
        self.peer_poll_s = 0.25
        #: Blobs whose bytes are arriving now (peers asking for them get 503 + header).
        self.downloading: set[str] = set()
        # A blob being fetched once, however many versions ask for it.
        self._inflight: dict[str, asyncio.Future[None]] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # a large read buffer: fewer, bigger socket reads and far fewer pauses of the
            # transport (aiohttp's default 64 KiB pauses reading at every 128 KiB)
            self._session = aiohttp.ClientSession(timeout=self._timeout, read_bufsize=_READ_BUFFER)
        return self._session

    async def fetch(
        self,
        sha256: str,
        size: int,
        sources: Sequence[BlobSource],
        progress: Progress,
        *,
        wait_for_peers: bool = False,
    ) -> None:
        """Fetch one blob (no-op when stored). Raises ModelSyncError when no source gave
        the right bytes (every source's reason in the message). ``wait_for_peers``: peers
        that do not have the blob yet are asked again (see :meth:`_fetch`)."""
        if self.store.has_blob(sha256, size):
            return
        running = self._inflight.get(sha256)
        if running is not None:
            await asyncio.shield(running)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[sha256] = future
        try:
            async with self._slots:
                await self._fetch(sha256, size, sources, progress, wait_for_peers)
            future.set_result(None)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._inflight[sha256]

    async def _fetch(
        self,
        sha256: str,
        size: int,
        sources: Sequence[BlobSource],
        progress: Progress,
        wait_for_peers: bool,
    ) -> None:
        """Peers first, then the coordinator. A peer that is fetching the blob itself (503)
        is asked again every ``peer_poll_s`` for as long as it keeps fetching; one that
        does not have it (404) is asked again for ``peer_wait_s`` when ``wait_for_peers``
        (this agent is not its site's first: the first fetches from the coordinator, the
        others from it). A peer that fails otherwise or sends wrong bytes is dropped."""
        if not sources:
            raise ModelSyncError(f"blob {sha256[:12]}: no source to fetch it from")
        peers = [s for s in sources if s.kind == "peer"]
        others = [s for s in sources if s.kind != "peer"]
        reasons: list[str] = []
        dropped: set[str] = set()
        deadline = time.monotonic() + (self.peer_wait_s if wait_for_peers else 0.0)
        while True:
            again = False
            for source in peers:
                if source.base_url in dropped:
                    continue
                try:
                    await self._fetch_from(source, sha256, size, progress)
                    return
                except PeerFetchingError:
                    again = True
                    deadline = max(deadline, time.monotonic() + self.peer_wait_s)
                except BlobNotHereError:
                    again = again or wait_for_peers
                except Exception as exc:
                    if not self._failed(source, sha256, exc, reasons):
                        raise
                    dropped.add(source.base_url)
            if not again or time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.peer_poll_s)
        for source in others:
            try:
                await self._fetch_from(source, sha256, size, progress)
                return
            except Exception as exc:
                if not self._failed(source, sha256, exc, reasons):
                    raise
        raise ModelSyncError(f"blob {sha256[:12]} could not be fetched: {'; '.join(reasons)}")

    def _failed(self, source: BlobSource, sha256: str, exc: Exception, reasons: list[str]) -> bool:
        """Log and keep the reason of a source's failure; False for an unexpected error."""
        if isinstance(exc, BlobIntegrityError):
            log.warning("blob %s from %s %s: %s; skipping that source",
                        sha256[:12], source.kind, source.base_url, exc)  # fmt: skip
            self.store.partial(sha256).unlink(missing_ok=True)
        elif isinstance(exc, aiohttp.ClientError | TimeoutError | OSError | ModelSyncError):
            log.info("blob %s from %s %s failed: %s", sha256[:12], source.kind,
                     source.base_url, exc or type(exc).__name__)  # fmt: skip
        else:
            return False
        reasons.append(f"{source.kind} {source.base_url}: {exc or type(exc).__name__}")
        return True

    async def _fetch_from(
        self, source: BlobSource, sha256: str, size: int, progress: Progress
    ) -> None:
        part = self.store.partial(sha256)
        digest = hashlib.sha256()
        have = 0
        if part.exists():
            have = part.stat().st_size
            if have > size:
                part.unlink()
                have = 0
            else:
                with open(part, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
        headers = dict(self.headers(source)) if self.headers is not None else {}
        if have:
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = f'"{sha256}"'
        kwargs: dict[str, object] = {"headers": headers}
        if self.ssl is not None and source.base_url.startswith("https:"):
            kwargs["ssl"] = self.ssl
        async with self._client().get(source.url(sha256), **kwargs) as response:  # type: ignore[arg-type]
            if response.status == 404:
                raise BlobNotHereError("HTTP 404: not there")
            if response.status == 503 and response.headers.get(FETCHING_HEADER):
                raise PeerFetchingError("the peer is fetching it")
            if response.status == 416:
                part.unlink(missing_ok=True)
                raise ModelSyncError("the source refused our range (416); starting over")
            if response.status == 200 and have:
                have = 0  # the source sent the whole blob
                digest = hashlib.sha256()
            elif response.status not in (200, 206):
                raise ModelSyncError(f"HTTP {response.status}")
            mode = "ab" if have else "wb"
            written = have
            self.downloading.add(sha256)
            try:
                with open(part, mode) as out:
                    async with _Sink(out, digest) as sink:
                        # the network is read on the event loop; writing, hashing and starting
                        # writeback run on one thread of this download's own, in order, a few
                        # chunks behind (file writes and hashlib release the GIL: both cores
                        # work); chunks are handed over as they came, never copied
                        async for chunk in response.content.iter_chunked(_CHUNK):
                            written += len(chunk)
                            if written > size:
                                raise BlobIntegrityError(f"more than the {size} bytes listed")
                            await self.limiter.take(len(chunk))
                            progress(len(chunk), source.kind)
                            await sink.put(chunk)
                        await sink.finish()
            finally:
                self.downloading.discard(sha256)
        if written != size:
            raise ModelSyncError(f"the transfer ended at {written} of {size} bytes")
        if digest.hexdigest() != sha256:
            raise BlobIntegrityError("the bytes do not match their sha256")
        self.store.commit_partial(sha256)


class _Sink:
    """Writes, hashes and starts the writeback of chunks on a thread of its own, in order,
    at most ``_IN_FLIGHT`` chunks behind the caller; ``finish`` fsyncs. An error on the
    thread is raised by the next ``put`` or ``finish``. Writes go straight to the file
    descriptor at its end (no buffered writer: no copy, no ``lseek`` per chunk)."""

    def __init__(self, fh: IO[Any], digest: Any) -> None:
        fh.flush()
        self._fd = fh.fileno()
        self._offset = os.lseek(self._fd, 0, os.SEEK_END)
        self._started = self._offset  # where writeback was last started
        self._digest = digest
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blob-sink")
        self._pending: collections.deque[asyncio.Future[None]] = collections.deque()

    async def __aenter__(self) -> _Sink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for future in self._pending:
            future.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        self._pool.shutdown(wait=True)

    async def put(self, chunk: bytes) -> None:
        loop = asyncio.get_running_loop()
        self._pending.append(loop.run_in_executor(self._pool, self._write, chunk))
        while len(self._pending) > _IN_FLIGHT or (self._pending and self._pending[0].done()):
            await self._pending.popleft()

    async def finish(self) -> None:
        while self._pending:
            await self._pending.popleft()
        await asyncio.get_running_loop().run_in_executor(self._pool, os.fsync, self._fd)

    def _write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]
        self._digest.update(chunk)
        self._offset += len(chunk)
        if self._offset - self._started >= _WRITEBACK:
            _start_writeback(self._fd, self._started, self._offset - self._started)
            self._started = self._offset


def _writeback_call() -> Callable[[int, int, int], None]:
    """``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``: start writing a range
    back without waiting for it (Linux); elsewhere nothing (the final fsync does it all)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, n: None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, n: int) -> None:
        call(fd, offset, n, 2)  # SYNC_FILE_RANGE_WRITE; a failure leaves it to fsync

    return start


_start_writeback = _writeback_call()
