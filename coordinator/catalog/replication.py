"""Model blobs replicated between the coordinators sharing one database.

The catalog (which versions exist, their manifests) is in the database; the blobs are files
in each coordinator's own blob store (coordinator/catalog/catalog.py). A coordinator that
lists a version but lacks one of its blobs fetches it from a peer coordinator that holds
it, over the peer's HTTPS API (``GET /v1/blobs/sha256/<hex>``, the route agents use),
into its blob store through the verified writer: the bytes are hashed as they arrive,
more than the catalog's size for the blob is refused at once, and the blob appears under
its name only once its sha256 matched (a wrong one is thrown away and the next peer is
asked). Each attempt goes over the live peers in random order, then waits (backoff) and
tries again, ``attempts`` times at most; failures are logged and counted by reason.

When (``BlobReplicator``):

- at start (``sync_all``: every version listed), and on the change feed's ``models`` kind
  when another coordinator published a version (``on_change``, in the background: the feed
  does not wait for a download);
- lazily, when an agent asks for a blob a listed version names and this coordinator lacks
  (``ensure``): the agent's request waits for it, up to ``LAZY_WAIT_S``, else it is
  answered 503 with ``X-Edgefleet-Fetching`` and ``Retry-After`` (the agent asks again;
  never a 404 for a blob the catalog lists);
- a version deleted elsewhere: the blobs no version lists any more go (the rule of the
  coordinator that deleted it).

Which coordinators hold every blob of a version is recorded in table ``model_holders``
(``set_model_holder``): a coordinator records itself once it holds them all, and the
publishing coordinator waits, bounded by ``publish_wait_s``, until a live peer has
recorded itself too (``wait_held``), so a publish that completes survives the loss of one
coordinator's disk.

Peers authenticate with a credential of their own (``PeerCredential``): a short-lived
token whose HMAC key is derived from the model-signing key every coordinator of the fleet
is provisioned with. It grants reading blobs and nothing else (not the admin token: a peer
never sends, nor needs, a credential that could change the fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from coordinator.catalog.catalog import CatalogVersion, ModelCatalog
from coordinator.errors import BlobIntegrityError, StoreError
from coordinator.store.catalog import CatalogTable
from coordinator.store.changes import Change
from edgefleet.model_signing import ManifestSigner

logger = logging.getLogger(__name__)

#: The header a peer coordinator's blob request carries (``PeerCredential.token``).
PEER_HEADER = "Edgefleet-Peer"
#: What a peer token's HMAC key is derived under (``ManifestSigner.derive_secret``).
PEER_LABEL = b"peer blob read v1"
#: How long a peer token is good for (s), and how far in the future its expiry may lie
#: beyond that (the two machines' clocks disagree).
PEER_TOKEN_TTL_S = 300.0
PEER_CLOCK_SKEW_S = 60.0
#: The answer header telling an agent the blob is being fetched (ask again soon): the
#: agent's peer protocol (agent/sync/fetch.py FETCHING_HEADER).
FETCHING_HEADER = "X-Edgefleet-Fetching"
#: How long an agent's request for a blob this coordinator is fetching waits (s).
LAZY_WAIT_S = 30.0
#: Attempts over all peers, and the wait before the second (doubled each time after).
ATTEMPTS = 4
BACKOFF_S = 0.5
#: Without a byte from a peer for this long, its transfer fails (s).
READ_TIMEOUT_S = 60.0
#: How long a publish waits for a peer to hold the version (s; config publish_wait_s).
PUBLISH_WAIT_S = 120.0
#: Coordinators that must hold every blob before a publish completes (when peers live).
WANTED_HOLDERS = 2
_CHUNK = 1 << 20


class PeerCredential:
    """Tokens ``<coordinator id>.<expiry>.<hmac>`` one coordinator sends, the others check."""

    def __init__(
        self, secret: bytes, coordinator_id: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._secret = secret
        self.coordinator_id = coordinator_id
        self._clock = clock

    @classmethod
    def from_signer(cls, signer: ManifestSigner, coordinator_id: str) -> PeerCredential:
        return cls(signer.derive_secret(PEER_LABEL), coordinator_id)

    def _mac(self, who: str, expires: int) -> str:
        return hmac.new(self._secret, f"{who}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def token(self) -> str:
        expires = int(self._clock() + PEER_TOKEN_TTL_S)
        return f"{self.coordinator_id}.{expires}.{self._mac(self.coordinator_id, expires)}"

    def check(self, token: str) -> str | None:
        """The peer's coordinator id when ``token`` is good now, else None."""
        if len(token) > 512:
            return None
        if not token.isascii():
            return None
        parts = token.rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 15:
            return None
        who, expires_text, mac = parts
        expires = int(expires_text)
        now = self._clock()
        if not who or expires < now or expires > now + PEER_TOKEN_TTL_S + PEER_CLOCK_SKEW_S:
            return None
        good = hmac.compare_digest(mac.encode(), self._mac(who, expires).encode())
        return who if good else None


@dataclass(frozen=True, slots=True)
class Peer:
    coordinator_id: str
    http_url: str


class PeerBlobError(Exception):
    """One peer's attempt failed; ``reason`` labels the failure metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


#: Failure reasons (the metric's label).
REASONS = ("not_there", "integrity", "too_large", "short", "http", "error", "no_peer")


class BlobReplicator:
    """Fetches the blobs this coordinator lacks from its peers; records what it holds.

    ``peers()``: the other live coordinators (their ids and HTTP base URLs, as membership
    last read them). ``ssl_context()``: how to check a peer's HTTPS certificate (the fleet
    CA), None for plain HTTP.
    """

    def __init__(
        self,
        catalog: ModelCatalog,
        store: CatalogTable,
        coordinator_id: str,
        peers: Callable[[], list[Peer]],
        credential: PeerCredential,
        *,
        ssl_context: Callable[[], ssl.SSLContext | None] = lambda: None,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        publish_wait_s: float = PUBLISH_WAIT_S,
    ) -> None:
        self.catalog = catalog
        self._store = store
        self.coordinator_id = coordinator_id
        self._peers = peers
        self.credential = credential
        self._ssl_context = ssl_context
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.read_timeout_s = read_timeout_s
        self.publish_wait_s = publish_wait_s
        self._inflight: dict[str, asyncio.Task[bool]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._syncing = asyncio.Lock()
        # (version's manifest sha256, held) last recorded in model_holders by this process.
        self._recorded: set[tuple[str, bool]] = set()
        self.fetched = 0
        self.fetched_bytes = 0
        self.failures: dict[str, int] = {}

    # ------------------------------------------------------------------ fetching

    def peers(self) -> list[Peer]:
        return [p for p in self._peers() if p.coordinator_id != self.coordinator_id]

    async def ensure(self, sha256: str, size: int) -> bool:
        """The blob is in this coordinator's store (fetched from a peer if need be); False
        when no peer gave it after every attempt. Concurrent callers share one fetch."""
        if self.catalog.blobs.size(sha256) == size:
            return True
        task = self._inflight.get(sha256)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._fetch(sha256, size), name=f"peer-blob-{sha256[:12]}"
            )
            self._inflight[sha256] = task
            task.add_done_callback(lambda _: self._inflight.pop(sha256, None))
        return await asyncio.shield(task)

    def fetching(self, sha256: str) -> bool:
        return sha256 in self._inflight

    async def _fetch(self, sha256: str, size: int) -> bool:
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            if self.catalog.blobs.size(sha256) == size:
                return True
            if not self.catalog.referenced(sha256):
                return False  # deleted meanwhile: nothing to fetch any more
            peers = self.peers()
            random.shuffle(peers)
            if not peers:
                self._failed("no_peer")
                continue
            for peer in peers:
                try:
                    await self._fetch_from(peer, sha256, size)
                except PeerBlobError as exc:
                    self._failed(exc.reason)
                    log = logger.info if exc.reason == "not_there" else logger.warning
                    log("blob %s from coordinator %s: %s", sha256[:12], peer.coordinator_id, exc)
                    continue
                return True
        logger.error("blob %s (%d bytes): no peer coordinator gave it after %d attempts",
                     sha256[:12], size, self.attempts)  # fmt: skip
        return False

    def _failed(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    async def _fetch_from(self, peer: Peer, sha256: str, size: int) -> None:
        url = f"{peer.http_url.rstrip('/')}/v1/blobs/sha256/{sha256}"
        context = self._ssl_context() if url.startswith("https:") else None
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.read_timeout_s)
        writer = None
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(url, headers={PEER_HEADER: self.credential.token()},
                         ssl=context if context is not None else True) as response,
            ):  # fmt: skip
                if response.status == 404:
                    raise PeerBlobError("not_there", "not there (404)")
                if response.status != 200:
                    raise PeerBlobError("http", f"HTTP {response.status}")
                if response.content_length is not None and response.content_length != size:
                    raise PeerBlobError("too_large" if response.content_length > size else
                                        "short", f"{response.content_length} bytes announced, "
                                        f"the catalog says {size}")  # fmt: skip
                writer = self.catalog.blobs.writer(sha256)
                async for chunk in response.content.iter_chunked(_CHUNK):
                    if writer.size + len(chunk) > size:
                        raise PeerBlobError("too_large", f"more than the catalog's {size} bytes")
                    writer.write(chunk)
            if writer.size != size:
                raise PeerBlobError("short", f"{writer.size} of {size} bytes")
            await asyncio.to_thread(writer.commit)
            written, writer = writer.size, None
        except BlobIntegrityError as exc:
            writer = None  # commit removed its file
            raise PeerBlobError("integrity", str(exc)) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerBlobError("error", f"{type(exc).__name__}: {exc}") from exc
        finally:
            if writer is not None:
                writer.abort()
        self.fetched += 1
        self.fetched_bytes += written
        logger.info("blob %s (%d bytes) fetched from coordinator %s", sha256[:12], written,
                    peer.coordinator_id)  # fmt: skip

    # ------------------------------------------------------------------ versions

    def missing(self, version: CatalogVersion) -> dict[str, int]:
        """sha256 -> size of the version's blobs this coordinator lacks."""
        return {
            f["sha256"]: int(f["size"])
            for f in version.files()
            if self.catalog.blobs.size(f["sha256"]) != int(f["size"])
        }

    async def sync_version(self, version: CatalogVersion) -> bool:
        """Fetch what this coordinator lacks of ``version``; record it as a holder once it
        holds every blob (and not, when it does not). True when it holds them all."""
        wanted = self.missing(version)
        if wanted:
            results = await asyncio.gather(*(self.ensure(s, n) for s, n in wanted.items()))
            held = all(results)
        else:
            held = True
        if self.catalog.get(version.name, version.version) is None:
            return False  # deleted meanwhile
        key = (version.sha256, held)
        if key in self._recorded:
            return held
        try:
            await self._store.set_model_holder(
                version.name, version.version, self.coordinator_id, held
            )
        except StoreError as exc:
            logger.warning("could not record %s as held here: %s", version.ref, exc)
        else:
            self._recorded.discard((version.sha256, not held))
            self._recorded.add(key)
        return held

    async def sync_all(self) -> int:
        """Every version listed (at start): fetch what is missing, record what is held.
        How many versions are held in full."""
        async with self._syncing:
            held = 0
            versions = self.catalog.versions()
            listed = {v.sha256 for v in versions}  # a version deleted took its rows along
            self._recorded = {k for k in self._recorded if k[0] in listed}
            for version in versions:
                try:
                    held += await self.sync_version(version)
                except Exception:  # one version must not stop the others
                    logger.exception("replicating %s failed", version.ref)
            return held

    def start_background(self, what: Callable[[], Awaitable[object]], name: str) -> None:
        async def run() -> None:
            try:
                await what()
            except Exception:
                logger.exception("%s failed", name)

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def on_change(self, change: Change, before: Iterable[CatalogVersion]) -> None:
        """After the catalog read a ``models`` change again: ``before`` is the catalog's
        versions as they were before that read."""
        if change.detail == "published":
            name, _, version = change.subject.partition("@")
            found = self.catalog.get(name, version)
            if found is not None:
                self.start_background(lambda: self.sync_version(found),
                                      f"replicate {found.ref}")  # fmt: skip
        elif change.detail == "deleted":
            gone = [v for v in before if self.catalog.get(v.name, v.version) is None]
            self.remove_orphans(gone)

    def remove_orphans(self, versions: Iterable[CatalogVersion]) -> list[str]:
        """Remove the blobs of ``versions`` (no longer listed) that no version lists."""
        removed = []
        for version in versions:
            for sha in {f["sha256"] for f in version.files()}:
                if not self.catalog.referenced(sha) and self.catalog.blobs.remove(sha):
                    removed.append(sha)
        if removed:
            logger.info("removed %d blobs no model version lists any more", len(removed))
        return removed

    # ------------------------------------------------------------------ publishing

    async def holders(self) -> dict[tuple[str, str], list[str]]:
        """(name, version) -> the live coordinators (this one included) holding it."""
        alive = {p.coordinator_id for p in self.peers()} | {self.coordinator_id}
        recorded = await self._store.list_model_holders()
        return {key: [c for c in ids if c in alive] for key, ids in recorded.items()}

    async def wait_held(self, version: CatalogVersion, *, poll_s: float = 0.2) -> tuple[int, int]:
        """After a publish here: record this coordinator as a holder, then wait (at most
        ``publish_wait_s``) until WANTED_HOLDERS live coordinators hold the version, or as
        many as are alive. (holders, wanted)."""
        await self._store.set_model_holder(version.name, version.version, self.coordinator_id,
                                           True)  # fmt: skip
        self._recorded.add((version.sha256, True))
        deadline = time.monotonic() + self.publish_wait_s
        while True:
            wanted = min(WANTED_HOLDERS, 1 + len(self.peers()))
            held = len((await self.holders()).get((version.name, version.version), []))
            if held >= wanted or time.monotonic() >= deadline:
                return held, wanted
            await asyncio.sleep(poll_s)

    async def close(self) -> None:
        tasks = [*self._background, *self._inflight.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ------------------------------------------------------------------ metrics

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_ReplicationCollector(self))


class _ReplicationCollector(Collector):
    def __init__(self, replicator: BlobReplicator) -> None:
        self._r = replicator

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        r = self._r
        yield CounterMetricFamily(
            "edgefleet_coordinator_peer_blobs_fetched",
            "Model blobs fetched from peer coordinators (verified and stored).",
            value=r.fetched,
        )
        yield CounterMetricFamily(
            "edgefleet_coordinator_peer_blob_bytes",
            "Bytes of model blobs fetched from peer coordinators (verified and stored).",
            value=r.fetched_bytes,
        )
        failures = CounterMetricFamily(
            "edgefleet_coordinator_peer_blob_failures",
            "Failed fetches of a model blob from a peer coordinator, by reason (not_there, "
            "integrity: wrong sha256, too_large, short, http, error, no_peer alive).",
            labels=["reason"],
        )
        for reason in REASONS:
            failures.add_metric([reason], r.failures.get(reason, 0))
        yield failures
        missing = sum(len(r.missing(v)) for v in r.catalog.versions())
        yield GaugeMetricFamily(
            "edgefleet_coordinator_blobs_missing",
            "Blobs a listed model version names that this coordinator's blob store lacks.",
            value=float(missing),
        )
