"""Model blobs replicated between coordinators (coordinator/catalog/replication.py).

Unit: a coordinator that lists a version but lacks its blob fetches it from peers given
by hand: a peer serving other bytes under the name (the sha256 does not match) and one
serving more than the catalog's size are refused, nothing of theirs is kept (no blob, no
leftover temporary file), the failures are counted by reason, and the right peer's bytes
are stored. Peer tokens: good ones accepted, forged, expired or far-future ones not.

In process, two coordinators on one PostgreSQL database: a version published on A is
fetched by B through the change feed (B holds every blob, both are recorded as holders,
the models API says ``held_by`` 2); a blob B lost is fetched again while an admin's
request for it waits; one no peer has is answered 503 with ``X-Edgefleet-Fetching``, not
404; the peer token reads blobs and nothing else; a version deleted on A leaves B's
blob store.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from coordinator.api.app_keys import BLOB_REPLICATOR_KEY, MODEL_CATALOG_KEY
from coordinator.catalog.catalog import MODELS_DIR, SIGNING_KEY_FILE, TMP_DIR, ModelCatalog
from coordinator.catalog.replication import (
    FETCHING_HEADER,
    PEER_HEADER,
    PEER_TOKEN_TTL_S,
    BlobReplicator,
    Peer,
    PeerCredential,
)
from coordinator.store.sqlite import SQLiteFleetStore
from devtools.process import wait_until
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, MakeCoordinator
from tests.coordinator.model_testing import make_artifact

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("tiny_artifacts")]

WEIGHTS = b"the right weights " * 1000


async def _peer(credential: PeerCredential, blobs: dict[str, bytes]) -> TestServer:
    """A peer coordinator that serves ``blobs`` (sha256 -> the bytes it sends under that
    name), to good tokens only."""

    async def blob(request: web.Request) -> web.Response:
        if credential.check(request.headers.get(PEER_HEADER, "")) is None:
            return web.Response(status=401)
        body = blobs.get(request.match_info["sha256"])
        return web.Response(status=404) if body is None else web.Response(body=body)

    app = web.Application()
    app.router.add_get("/v1/blobs/sha256/{sha256}", blob)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    return server


@pytest.fixture
async def lacking(tmp_path: Path) -> AsyncIterator[tuple[ModelCatalog, str, int]]:
    """A catalog that lists a version published elsewhere (same store, another data
    directory) and lacks its blobs; the weights blob's sha256 and size."""
    store = SQLiteFleetStore.in_directory(tmp_path / "db")
    await store.open()
    publisher = ModelCatalog.in_directory(store, tmp_path / "a")
    make_artifact(tmp_path / "artifact", weights=WEIGHTS)
    await publisher.publish_directory(tmp_path / "artifact")
    (tmp_path / "b").mkdir()
    key = (tmp_path / "a" / SIGNING_KEY_FILE).read_bytes()
    (tmp_path / "b" / SIGNING_KEY_FILE).write_bytes(key)
    catalog = ModelCatalog.in_directory(store, tmp_path / "b")
    await catalog.load()
    yield catalog, hashlib.sha256(WEIGHTS).hexdigest(), len(WEIGHTS)
    await store.close()


async def test_a_hostile_peer_is_refused_and_the_next_one_asked(
    lacking: tuple[ModelCatalog, str, int], tmp_path: Path
) -> None:
    catalog, sha, size = lacking
    credential = PeerCredential.from_signer(catalog.signer, "coordinator-b")
    files = {hashlib.sha256(b).hexdigest(): b
             for b in (p.read_bytes() for p in (tmp_path / "artifact").iterdir())}  # fmt: skip
    corrupt = await _peer(credential, {s: b"X" + b[1:] for s, b in files.items()})  # same size
    oversized = await _peer(credential, {s: b + b"and more" for s, b in files.items()})
    good = await _peer(credential, files)
    peers: list[Peer] = []
    replicator = BlobReplicator(
        catalog, catalog._store, "coordinator-b", lambda: list(peers), credential,
        attempts=2, backoff_s=0.01,
    )  # fmt: skip
    tmp = tmp_path / "b" / MODELS_DIR / TMP_DIR
    try:
        peers[:] = [Peer("bad", str(corrupt.make_url("")))]
        assert await replicator.ensure(sha, size) is False
        assert replicator.failures == {"integrity": 2}
        peers[:] = [Peer("big", str(oversized.make_url("")))]
        assert await replicator.ensure(sha, size) is False
        assert replicator.failures == {"integrity": 2, "too_large": 2}
        assert not catalog.blobs.has(sha) and list(tmp.iterdir()) == []

        # Every one of them, in whatever order: the right bytes are stored, once.
        peers[:] = [Peer("bad", str(corrupt.make_url(""))),
                    Peer("big", str(oversized.make_url(""))),
                    Peer("good", str(good.make_url("")))]  # fmt: skip
        version = catalog.versions()[0]
        assert await replicator.sync_version(version) is True
        assert catalog.blobs.path(sha).read_bytes() == WEIGHTS
        assert replicator.missing(version) == {}
        assert replicator.fetched == 3 and replicator.fetched_bytes == version.size_bytes
        assert list(tmp.iterdir()) == []
        assert await catalog._store.list_model_holders() == {
            (version.name, version.version): ["coordinator-b"]
        }
    finally:
        await replicator.close()
        for server in (corrupt, oversized, good):
            await server.close()


def test_peer_tokens() -> None:
    now = [1_000_000.0]
    mine = PeerCredential(b"k" * 32, "a", clock=lambda: now[0])
    theirs = PeerCredential(b"k" * 32, "b", clock=lambda: now[0])
    stranger = PeerCredential(b"x" * 32, "a", clock=lambda: now[0])
    token = mine.token()
    assert theirs.check(token) == "a"
    assert theirs.check(stranger.token()) is None
    who, expires, mac = token.split(".")
    assert theirs.check(f"b.{expires}.{mac}") is None  # another name under a's mac
    assert theirs.check(f"{who}.{int(expires) + 1}.{mac}") is None
    far = PeerCredential(b"k" * 32, "a", clock=lambda: now[0] + 10 * PEER_TOKEN_TTL_S)
    assert theirs.check(far.token()) is None  # not good for longer than a ttl (and skew)
    assert theirs.check("") is None and theirs.check("a.b") is None
    assert theirs.check(f"a.{expires}.{mac[:-1]}\u00e9") is None  # not ASCII: no error
    assert theirs.check(f"a.\u00b2.{mac}") is None  # a digit int() would refuse
    now[0] += PEER_TOKEN_TTL_S + 1
    assert theirs.check(token) is None  # expired


async def test_blobs_published_on_one_coordinator_reach_another(
    make_coordinator: MakeCoordinator, tmp_path: Path, postgres_url: str
) -> None:
    first = await make_coordinator(store_url=postgres_url, data_dir=str(tmp_path / "a"),
                                   coordinator_heartbeat_s=0.2)  # fmt: skip
    (tmp_path / "b").mkdir()  # provisioned with A's model-signing key
    (tmp_path / "b" / SIGNING_KEY_FILE).write_bytes(
        (tmp_path / "a" / SIGNING_KEY_FILE).read_bytes()
    )
    second = await make_coordinator(store_url=postgres_url, data_dir=str(tmp_path / "b"),
                                    coordinator_heartbeat_s=0.2)  # fmt: skip
    catalog_a, catalog_b = first.app[MODEL_CATALOG_KEY], second.app[MODEL_CATALOG_KEY]
    replicator_b = second.app[BLOB_REPLICATOR_KEY]
    replicator_b.backoff_s = 0.05
    make_artifact(tmp_path / "v1", weights=WEIGHTS)
    version = (await catalog_a.publish_directory(tmp_path / "v1")).version
    shas = {f["sha256"] for f in version.files()}
    sha = hashlib.sha256(WEIGHTS).hexdigest()

    await wait_until(lambda: all(catalog_b.blobs.has(s) for s in shas), timeout_s=10,
                     message="A's blobs in B's blob store")  # fmt: skip
    assert catalog_b.blobs.path(sha).read_bytes() == WEIGHTS
    await first.app[BLOB_REPLICATOR_KEY].wait_held(version)  # what a publish through HTTP does

    async def held_by_both() -> bool:
        listing = await first.get_json("/v1/admin/models")
        return [v["held_by"] for v in listing["data"]] == [2]

    await wait_until(held_by_both, timeout_s=10, message="both coordinators recorded")

    async with aiohttp.ClientSession() as http:
        # Lost on B: fetched again from A while the request waits.
        catalog_b.blobs.remove(sha)
        async with http.get(f"{second.http_url}/v1/blobs/sha256/{sha}",
                            headers=ADMIN_HEADERS) as response:  # fmt: skip
            assert response.status == 200
            assert await response.read() == WEIGHTS
        # Lost everywhere: "fetching, ask again", never a 404 an agent would give up on.
        catalog_a.blobs.remove(sha)
        catalog_b.blobs.remove(sha)
        async with http.get(f"{second.http_url}/v1/blobs/sha256/{sha}",
                            headers=ADMIN_HEADERS) as response:  # fmt: skip
            assert response.status == 503
            assert response.headers[FETCHING_HEADER] == "1"
            assert "Retry-After" in response.headers
        assert replicator_b.failures.get("not_there", 0) >= 1
        catalog_a.blobs.put_file(tmp_path / "v1" / "model.onnx", sha)

        # The peer token reads blobs (a peer's request is never passed on: 404 here) and
        # nothing else.
        token = {PEER_HEADER: replicator_b.credential.token()}
        async with http.get(f"{first.http_url}/v1/blobs/sha256/{sha}", headers=token) as got:
            assert got.status == 200 and await got.read() == WEIGHTS
        async with http.get(f"{second.http_url}/v1/blobs/sha256/{sha}", headers=token) as got:
            assert got.status == 404
        async with http.get(f"{first.http_url}/v1/admin/models", headers=token) as got:
            assert got.status == 401
        forged = {PEER_HEADER: token[PEER_HEADER][:-4] + "0000"}
        async with http.get(f"{first.http_url}/v1/blobs/sha256/{sha}", headers=forged) as got:
            assert got.status == 401

        async with http.get(f"{second.http_url}/v1/blobs/sha256/{sha}",
                            headers=ADMIN_HEADERS) as response:  # fmt: skip
            assert response.status == 200  # on A again: fetched while the request waits
        assert catalog_b.blobs.has(sha)

    # Deleted on A: gone from B's blob store (no other version lists them).
    await catalog_a.delete(version.name, version.version)
    await wait_until(lambda: not any(catalog_b.blobs.has(s) for s in shas), timeout_s=10,
                     message="the deleted version's blobs gone from B")  # fmt: skip
