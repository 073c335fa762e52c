"""Fetching blobs into the model store: site peers first, then the coordinator.

Each blob is fetched over HTTP from ``{base}/sha256/{hex}`` into ``partial/<hex>.part``:
a ``.part`` left by an earlier attempt (or a SIGKILL) is resumed with ``Range`` (and
``If-Range`` on the source's strong ETag, so a changed source starts over). Every byte is
hashed as it is written; the file is fsynced, and only when its sha256 is the one the
manifest names is it renamed into ``blobs/``. A source that serves wrong bytes (a peer
with a corrupt copy, a tampering middlebox) is caught there: its bytes are thrown away,
the source is skipped for the rest of this fetch and the next one is tried.

The bytes are received on threads with blocking sockets (``http.client``, TLS through the
``ssl`` module), not on the event loop: the loop stays free for serving, and a download
costs a third less CPU (see :class:`_Transfer`).

Limits: at most ``concurrency`` blobs at a time and ``bandwidth_bytes_per_s`` over all of
them (a token bucket; 0: unlimited).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import hashlib
import http.client
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from ssl import SSLContext
from typing import Any, Literal

from agent.errors import BlobIntegrityError, ModelSyncError
from agent.sync.store import ModelStore

log = logging.getLogger(__name__)

_CHUNK = 512 << 10  # bytes read, written and hashed at a time (in L2; fewer stalls)
_BUFFERS = 8  # buffers per download: how far the hashing thread may fall behind
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
    """A token bucket shared by every download's receiving thread; ``rate`` bytes/s, 0:
    unlimited. Waiters queue on the lock, so the rate holds over all of them."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._allowance = rate
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int, aborted: threading.Event) -> None:
        """Account for ``n`` bytes, sleeping while over the rate (until ``aborted``)."""
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._allowance = min(self.rate, self._allowance + (now - self._last) * self.rate)
            self._last = now
            self._allowance -= n
            if self._allowance < 0:
                aborted.wait(-self._allowance / self.rate)


class BlobFetcher:
    """Fetches blobs into a :class:`ModelStore`."""

    def __init__(
        self,
        store: ModelStore,
        *,
        concurrency: int = 4,
        bandwidth_bytes_per_s: float = 0,
        headers: Callable[[BlobSource], dict[str, str]] | None = None,
        ssl: SSLContext | Callable[[], SSLContext | None] | None = None,
        timeout_s: float = 60.0,
        peer_wait_s: float = 15.0,
    ) -> None:
        self.store = store
        self._slots = asyncio.Semaphore(concurrency)
        self.limiter = RateLimiter(bandwidth_bytes_per_s)
        #: Extra headers per source (the coordinator's bearer credential), settable later.
        self.headers = headers
        #: TLS context for https sources (the fleet CA and this agent's certificate), or
        #: what gives it as each download starts (agent/enrolled_tls.py: an agent may
        #: enroll, and renew, after this fetcher was made).
        self.ssl = ssl
        self.connect_timeout_s = 10.0
        self.read_timeout_s = timeout_s  # without a byte, a download fails after this
        self._concurrency = concurrency
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: How long a follower asks peers that lack a blob before the coordinator, and how
        #: often (a peer still fetching it is waited for as long as it keeps fetching).
        self.peer_wait_s = peer_wait_s
        self.peer_poll_s = 0.25
        #: How long a coordinator that is fetching the blob from a peer coordinator (503
        #: with FETCHING_HEADER) is asked again, and how often.
        self.coordinator_wait_s = 120.0
        self.coordinator_poll_s = 2.0
        #: Blobs whose bytes are arriving now (peers asking for them get 503 + header).
        self.downloading: set[str] = set()
        # A blob being fetched once, however many versions ask for it.
        self._inflight: dict[str, asyncio.Future[None]] = {}

    def _ssl_context(self) -> SSLContext | None:
        return self.ssl() if callable(self.ssl) else self.ssl

    async def close(self) -> None:
        """Release the threads (downloads still running are their tasks' to cancel)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        """The receiving threads: one per download, ``concurrency`` at most."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._concurrency, thread_name_prefix="blob-fetch"
            )
        return self._pool

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
        is asked again every ``peer_poll_s`` for as long as it keeps fetching (a
        coordinator fetching it from a peer coordinator: ``coordinator_wait_s``); one that
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
            # A coordinator that lists the version but is fetching the blob from a peer
            # coordinator itself answers 503 + FETCHING_HEADER: asked again for as long
            # as it keeps saying so, ``coordinator_wait_s`` at most.
            waited_until = time.monotonic() + self.coordinator_wait_s
            while True:
                try:
                    await self._fetch_from(source, sha256, size, progress)
                    return
                except PeerFetchingError as exc:
                    if time.monotonic() < waited_until:
                        log.info("blob %s: coordinator %s is fetching it from a peer "
                                 "coordinator; asking again", sha256[:12],
                                 source.base_url)  # fmt: skip
                        await asyncio.sleep(self.coordinator_poll_s)
                        continue
                    self._failed(source, sha256, exc, reasons)
                except Exception as exc:
                    if not self._failed(source, sha256, exc, reasons):
                        raise
                break
        raise ModelSyncError(f"blob {sha256[:12]} could not be fetched: {'; '.join(reasons)}")

    def _failed(self, source: BlobSource, sha256: str, exc: Exception, reasons: list[str]) -> bool:
        """Log and keep the reason of a source's failure; False for an unexpected error."""
        if isinstance(exc, BlobIntegrityError):
            log.warning("blob %s from %s %s: %s; skipping that source",
                        sha256[:12], source.kind, source.base_url, exc)  # fmt: skip
            self.store.partial(sha256).unlink(missing_ok=True)
        elif isinstance(exc, http.client.HTTPException | TimeoutError | OSError | ModelSyncError):
            log.info("blob %s from %s %s failed: %s", sha256[:12], source.kind,
                     source.base_url, exc or type(exc).__name__)  # fmt: skip
        else:
            return False
        reasons.append(f"{source.kind} {source.base_url}: {exc or type(exc).__name__}")
        return True

    async def _fetch_from(
        self, source: BlobSource, sha256: str, size: int, progress: Progress
    ) -> None:
        """One source's attempt, on threads (see :class:`_Transfer`); a cancelled fetch
        closes the connection and returns once nothing more is written."""
        headers = dict(self.headers(source)) if self.headers is not None else {}
        url = source.url(sha256)
        context = self._ssl_context() if url.startswith("https:") else None
        loop = asyncio.get_running_loop()

        def report(n: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under an abort
                loop.call_soon_threadsafe(progress, n, source.kind)

        def receiving() -> None:
            # only once the source answered with bytes: a peer asking meanwhile is told to
            # wait for them (503). Marked before the answer, two agents polling each other
            # for a blob neither had waited on each other until the peer wait ran out.
            with contextlib.suppress(RuntimeError):  # the loop closed under an abort
                loop.call_soon_threadsafe(self.downloading.add, sha256)

        transfer = _Transfer(
            url, headers, context, self.store.partial(sha256), sha256, size,
            self.limiter, report, receiving, self.connect_timeout_s, self.read_timeout_s,
        )  # fmt: skip
        running = loop.run_in_executor(self._threads(), transfer.run)
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            transfer.abort()
            await asyncio.wait([running], timeout=self.read_timeout_s)
            if running.done() and not running.cancelled():
                running.exception()  # retrieved: the abort's own error, not worth a log
            raise
        finally:
            self.downloading.discard(sha256)
        self.store.commit_partial(sha256)


class _Transfer:
    """One blob from one source into ``partial/<hex>.part``, on two threads of its own.

    The receiving thread (:meth:`run`) reads the body with ``readinto`` into a few
    preallocated buffers, writes each to the file descriptor and starts its writeback every
    ``_WRITEBACK`` bytes; a hashing thread follows it, buffer by buffer, and hands each
    buffer back. Both calls release the GIL, so receiving and writing use one core while
    sha256 (as costly as both) uses the other. Measured side by side for 222 MB on 2
    cores, nine rounds: the event loop reading (aiohttp) with one thread writing and
    hashing took 0.30 s and 0.48 s of CPU; this takes 0.23 s and 0.36 s (a plain copy
    without hash or fsync 0.19 s and 0.20 s).

    Raises BlobNotHereError (404), PeerFetchingError (503 + FETCHING_HEADER),
    BlobIntegrityError (wrong bytes, a body longer than listed), ModelSyncError (any other
    answer, a short body), or the socket's OSError / TimeoutError / HTTPException; what
    arrived before a failure stays in the ``.part`` for the next attempt to resume."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        context: SSLContext | None,
        part: Path,
        sha256: str,
        size: int,
        limiter: RateLimiter,
        report: Callable[[int], None],
        receiving: Callable[[], None],
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        self.url = urllib.parse.urlsplit(url)
        self.headers = headers
        self.context = context
        self.part = part
        self.sha256 = sha256
        self.size = size
        self.limiter = limiter
        self.report = report
        self.receiving = receiving  # called once the source answered with the bytes
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.aborted = threading.Event()
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def abort(self) -> None:
        """Stop (from any thread): the blocked read returns, :meth:`run` raises."""
        self.aborted.set()
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _check(self) -> None:
        if self.aborted.is_set():
            raise ModelSyncError("the download was stopped")

    def run(self) -> None:
        digest = hashlib.sha256()
        have = 0
        if self.part.exists():
            have = self.part.stat().st_size
            if have > self.size:
                self.part.unlink()
                have = 0
            else:
                with open(self.part, "rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        self._check()
                        digest.update(chunk)
            if have == self.size:  # complete, not yet renamed (killed between the two)
                if digest.hexdigest() == self.sha256:
                    return
                self.part.unlink()
                have, digest = 0, hashlib.sha256()
        headers = dict(self.headers)
        if have:
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = f'"{self.sha256}"'
        host, port = self.url.hostname or "", self.url.port
        conn: http.client.HTTPConnection
        if self.url.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout_s, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.connect_timeout_s)
        with self._lock:
            self._conn = conn
        try:
            self._check()
            conn.connect()
            self._check()
            assert conn.sock is not None
            conn.sock.settimeout(self.read_timeout_s)
            target = self.url.path + (f"?{self.url.query}" if self.url.query else "")
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
            have, digest = self._answer(response, have, digest)
            self.receiving()
            self._receive(response, have, digest)
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    def _answer(
        self, response: http.client.HTTPResponse, have: int, digest: Any
    ) -> tuple[int, Any]:
        """Check the answer's status and framing; where the body starts, and its digest."""
        status = response.status
        if status == 404:
            raise BlobNotHereError("HTTP 404: not there")
        if status == 503 and response.getheader(FETCHING_HEADER):
            raise PeerFetchingError("the peer is fetching it")
        if status == 416:
            self.part.unlink(missing_ok=True)
            raise ModelSyncError("the source refused our range (416); starting over")
        if status == 200:
            if have:
                have, digest = 0, hashlib.sha256()  # the source sent the whole blob
        elif status == 206 and have:
            span = _content_range(response.getheader("Content-Range", ""))
            if span != (have, self.size):
                raise ModelSyncError(
                    f"the source answered our range bytes={have}- with "
                    f"Content-Range {response.getheader('Content-Range')!r}"
                )
        else:
            raise ModelSyncError(f"HTTP {status}")
        if response.length is not None and response.length > self.size - have:
            raise BlobIntegrityError(f"more than the {self.size} bytes listed")
        return have, digest

    def _receive(self, response: http.client.HTTPResponse, have: int, digest: Any) -> None:
        chunk = _CHUNK
        if self.limiter.rate > 0:  # smaller reads under a cap: a smoother rate and progress
            chunk = max(64 << 10, min(_CHUNK, int(self.limiter.rate / 8)))
        free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(_BUFFERS):
            free.put(bytearray(chunk))
        filled: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()

        def hash_all() -> None:
            while (item := filled.get()) is not None:
                buffer, n = item
                digest.update(memoryview(buffer)[:n])
                free.put(buffer)

        hasher = threading.Thread(target=hash_all, name="blob-hash", daemon=True)
        hasher.start()
        written = have
        try:
            with open(self.part, "ab" if have else "wb") as out:
                fd = out.fileno()
                started = written  # where writeback was last started
                while written < self.size:
                    self._check()
                    buffer = free.get()
                    view = memoryview(buffer)
                    # one more byte than is left: a body longer than listed is caught
                    n = response.readinto(view[: min(chunk, self.size - written + 1)])
                    if not n:
                        break  # the source closed early: what came stays for a resume
                    if written + n > self.size:
                        raise BlobIntegrityError(f"more than the {self.size} bytes listed")
                    data = view[:n]
                    while data:
                        data = data[os.write(fd, data) :]
                    filled.put((buffer, n))
                    written += n
                    if written - started >= _WRITEBACK:
                        _start_writeback(fd, started, written - started)
                        started = written
                    self.report(n)
                    self.limiter.take(n, self.aborted)
                if written == self.size and response.length is None and response.read(1):
                    raise BlobIntegrityError(f"more than the {self.size} bytes listed")
                filled.put(None)
                hasher.join()
                self._check()
                os.fsync(fd)
        finally:
            filled.put(None)
        if written != self.size:
            raise ModelSyncError(f"the transfer ended at {written} of {self.size} bytes")
        if digest.hexdigest() != self.sha256:
            raise BlobIntegrityError("the bytes do not match their sha256")


def _content_range(value: str) -> tuple[int, int] | None:
    """``bytes START-END/TOTAL`` as (START, TOTAL); None when it is not that."""
    unit, _, rest = value.strip().partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not (first.isdigit() and last.isdigit() and total.isdigit()):
        return None
    if int(last) != int(total) - 1:
        return None
    return int(first), int(total)


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
