"""Model sync on the agent, through a real agent app and a real HTTP blob origin.

The origin plays the coordinator's blob server (the catalog's side is built apart); the
ModelsSection is given to the agent's model sync as the session would. Versions are the
tiny model signed by a real ed25519 key; "v2" is the same build with another version
(and, where the test needs bytes to move, one changed file).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import SYNC, create_app
from agent.config import load_config
from agent.sync.manager import ModelSync
from devtools.process import wait_until
from edgefleet.contract import ModelInventoryState, ModelsSection, Residency
from edgefleet.model_signing import ManifestSigner, encode_public_key
from tests.agent.conftest import TINY
from tests.agent.model_sets import BlobOrigin, SignedVersion, signed_version

V1 = "fp32-00000000000a"
V2 = "fp32-00000000000b"
State = ModelInventoryState


@pytest.fixture
def signer(tmp_path: Path) -> ManifestSigner:
    return ManifestSigner.load_or_create(tmp_path / "signing.pem")


@pytest.fixture
async def origin() -> AsyncIterator[BlobOrigin]:
    server = BlobOrigin()
    await server.start()
    yield server
    await server.close()


AgentFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def make_agent(tmp_path: Path, signer: ManifestSigner) -> AsyncIterator[AgentFactory]:
    """An agent app serving from a model store (empty unless ``store`` is reused)."""
    clients: list[TestClient] = []

    async def start(
        store: Path | None = None,
        engine: dict[str, Any] | None = None,
        residency: dict[str, Any] | None = None,
        **models: Any,
    ) -> TestClient:
        overrides: dict[str, Any] = {
            "models": {
                "source": "store",
                "store_dir": str(store or tmp_path / f"store-{len(clients)}"),
                "trusted_keys": [encode_public_key(signer.public_key)],
                "self_check": False,
                **models,
            },
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16,
                       "intra_op_threads": 1, **(engine or {})},
            "residency": residency or {},
        }  # fmt: skip
        app = create_app(load_config(environ={}, overrides=overrides))
        client = TestClient(TestServer(app, handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


def sync_of(client: TestClient) -> ModelSync:
    return client.app[SYNC]  # type: ignore[index]


async def converge(client: TestClient, section: ModelsSection, timeout_s: float = 60) -> None:
    sync = sync_of(client)
    sync.apply(section)
    await sync.wait_applied(section.generation, timeout_s)


async def chat(client: TestClient, model: str, **body: Any) -> tuple[int, dict[str, Any]]:
    payload = {"model": model, "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 4, "temperature": 0, **body}  # fmt: skip
    resp = await client.post("/v1/chat/completions", json=payload)
    return resp.status, await resp.json()


def state(client: TestClient, version: str) -> State:
    found = [i for i in sync_of(client).inventory() if i.version == version]
    assert found, f"{version} not in the inventory"
    return found[0].state


async def test_empty_agent_syncs_verifies_loads_serves_and_acks(
    tiny_artifacts: Path, signer: ManifestSigner, origin: BlobOrigin, make_agent: AgentFactory
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    agent = await make_agent()
    assert (await (await agent.get("/v1/models")).json())["data"] == []
    status, _ = await chat(agent, TINY)
    assert status == 404

    await converge(agent, v1.section(3, origin.url))

    sync = sync_of(agent)
    assert sync.applied_generation == 3
    [inv] = sync.inventory()
    assert (inv.name, inv.version, inv.state) == (TINY, V1, State.LOADED)
    assert inv.bytes_done == inv.bytes_total == v1.total_bytes
    assert inv.bytes_from_coordinator == v1.total_bytes and inv.bytes_from_peers == 0
    assert origin.bytes_sent == v1.total_bytes
    status, body = await chat(agent, f"{TINY}@{V1}")
    assert status == 200 and body["model"] == f"{TINY}@{V1}"
    cards = (await (await agent.get("/v1/models")).json())["data"]
    assert [(c["id"], c["version"]) for c in cards] == [(TINY, V1)]
    # the same section again: nothing moves, still acknowledged
    await converge(agent, v1.section(4, origin.url))
    assert origin.bytes_sent == v1.total_bytes


async def test_hot_swap_in_flight_finish_on_old_new_go_to_new(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    v2 = signed_version(
        tiny_artifacts / TINY, signer, version=V2, changed_file=("config.json", tmp_path / "v2")
    )
    origin.add(v1)
    origin.add(v2)
    # the tiny model's whole context (512): streams long enough to outlast the swap on a
    # loaded CI machine (200 tokens in a 256-token context ended before it three times)
    agent = await make_agent(engine={"max_context_tokens": 512})
    await converge(agent, v1.section(1, origin.url))
    old_model = agent.app[SYNC].registry.text_models[TINY]  # type: ignore[index]

    # streams on v1, started before the swap and still running after it
    async def stream() -> list[str]:
        payload = {"model": TINY, "messages": [{"role": "user", "content": "count"}],
                   "max_tokens": 440, "min_tokens": 440, "temperature": 0,
                   "stream": True}  # fmt: skip
        resp = await agent.post("/v1/chat/completions", json=payload)
        assert resp.status == 200
        raw = (await resp.read()).decode()
        events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return [json.loads(e)["model"] for e in events[:-1]]

    streams = [asyncio.create_task(stream()) for _ in range(8)]
    while old_model.load().running < 1:
        await asyncio.sleep(0.01)
    await converge(agent, v2.section(2, origin.url))
    assert old_model.load().running >= 1, "the streams should still be running on v1"
    status, body = await chat(agent, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V2}"
    status, body = await chat(agent, f"{TINY}@{V1}")
    assert status == 404 and "not " + V1 in body["error"]["message"]
    for models in await asyncio.gather(*streams):
        assert set(models) == {f"{TINY}@{V1}"}, "an in-flight stream moved versions"
    # only the changed file moved for v2
    assert origin.bytes_sent == v1.total_bytes + v2.sizes[max(set(v2.sizes) - set(v1.sizes))]
    assert state(agent, V1) is State.ON_DISK and state(agent, V2) is State.LOADED
    for _ in range(100):
        if old_model.engine._closed:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.05)
    assert old_model.engine._closed, "the old version was not unloaded after draining"  # type: ignore[attr-defined]


async def test_tampered_blob_and_manifest_rejected_old_keeps_serving(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    v2 = signed_version(
        tiny_artifacts / TINY, signer, version=V2, changed_file=("config.json", tmp_path / "v2")
    )
    origin.add(v1)
    origin.add(v2)
    agent = await make_agent()
    await converge(agent, v1.section(1, origin.url))

    # a blob whose bytes were changed on the way
    changed = next(iter(set(v2.sizes) - set(v1.sizes)))
    origin.corrupt.add(changed)
    await converge(agent, v2.section(2, origin.url))
    failed = sync_of(agent).entry(TINY, V2)
    assert failed is not None and failed.state is State.FAILED
    assert "do not match their sha256" in failed.last_error
    assert not sync_of(agent).store.has_blob(changed)
    status, body = await chat(agent, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"

    # a manifest changed after signing (the signature no longer verifies)
    origin.corrupt.clear()
    tampered_bytes = v2.manifest.replace(b'"schema": 1', b'"schema": 1 ')
    assert tampered_bytes != v2.manifest
    tampered = SignedVersion(TINY, V2, tampered_bytes, v2.signature, v2.files, v2.sizes)
    sent = origin.bytes_sent
    await converge(agent, tampered.section(3, origin.url))
    failed = sync_of(agent).entry(TINY, V2)
    assert failed is not None and failed.state is State.FAILED
    assert "does not verify" in failed.last_error
    assert origin.bytes_sent == sent, "nothing is fetched for a manifest that does not verify"
    # unsigned, and signed by another key
    other = ManifestSigner.load_or_create(tmp_path / "other.pem")
    cases = ((4, b"", "unsigned"), (5, other.sign(v2.manifest), "does not verify"))
    for generation, signature, reason in cases:
        await converge(agent, v2.section(generation, origin.url, signature=signature))
        failed = sync_of(agent).entry(TINY, V2)
        assert failed is not None and failed.state is State.FAILED and reason in failed.last_error
    status, body = await chat(agent, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"


async def test_peer_serving_wrong_bytes_is_caught_and_skipped(
    tiny_artifacts: Path, signer: ManifestSigner, origin: BlobOrigin, make_agent: AgentFactory
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    bad_peer = BlobOrigin(corrupt=set(v1.files))
    bad_peer.add(v1)
    await bad_peer.start()
    try:
        agent = await make_agent()
        await converge(agent, v1.section(1, origin.url, peers=(bad_peer.url,)))
    finally:
        await bad_peer.close()
    inv = sync_of(agent).entry(TINY, V1)
    assert inv is not None and inv.state is State.LOADED
    assert bad_peer.bytes_sent > 0 and origin.bytes_sent == v1.total_bytes
    assert inv.bytes_from_coordinator == v1.total_bytes


async def test_site_peer_agent_serves_its_store_with_range_and_etag(
    tiny_artifacts: Path, signer: ManifestSigner, origin: BlobOrigin, make_agent: AgentFactory
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    first = await make_agent()
    await converge(first, v1.section(1, origin.url))
    peer_url = str(first.make_url("/v1/blobs"))
    # the peer's blob endpoint speaks the protocol
    small = min(v1.sizes, key=lambda h: v1.sizes[h])
    size = v1.sizes[small]
    whole = await first.get(f"/v1/blobs/sha256/{small}")
    assert whole.status == 200 and whole.headers["ETag"] == f'"{small}"'
    data = await whole.read()
    assert len(data) == size
    part = await first.get(f"/v1/blobs/sha256/{small}", headers={"Range": "bytes=10-19"})
    assert part.status == 206 and await part.read() == data[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{size}"
    cached = await first.get(f"/v1/blobs/sha256/{small}", headers={"If-None-Match": f'"{small}"'})
    assert cached.status == 304
    beyond = await first.get(f"/v1/blobs/sha256/{small}", headers={"Range": f"bytes={size}-"})
    assert beyond.status == 416 and beyond.headers["Content-Range"] == f"bytes */{size}"
    error = (await beyond.json())["error"]  # the agent's OpenAI error format
    assert (error["type"], error["code"]) == ("invalid_request_error", "range_not_satisfiable")
    assert set(error) == {"message", "type", "param", "code"}
    assert (await first.get(f"/v1/blobs/sha256/{'0' * 64}")).status == 404
    assert (await first.get("/v1/blobs/sha256/..%2Fmanifests")).status == 404
    # a second agent at the site takes every byte from the peer, none from the origin
    sent = origin.bytes_sent
    second = await make_agent()
    await converge(second, v1.section(1, origin.url, peers=(peer_url,)))
    inv = sync_of(second).entry(TINY, V1)
    assert inv is not None and inv.state is State.LOADED
    assert inv.bytes_from_peers == v1.total_bytes and inv.bytes_from_coordinator == 0
    assert origin.bytes_sent == sent


async def test_not_enough_memory_refused_and_reported(
    tiny_artifacts: Path, signer: ManifestSigner, origin: BlobOrigin, make_agent: AgentFactory
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    v2 = signed_version(tiny_artifacts / TINY, signer, version=V2)
    origin.add(v1)
    agent = await make_agent()
    await converge(agent, v1.section(1, origin.url))
    sync_of(agent).options.load_memory_factor = 1_000_000.0
    await converge(agent, v2.section(2, origin.url))
    failed = sync_of(agent).entry(TINY, V2)
    assert failed is not None and failed.state is State.FAILED
    assert "not enough free memory" in failed.last_error
    status, body = await chat(agent, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"


async def test_cold_start_from_the_store_without_a_coordinator(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    store = tmp_path / "kept-store"
    first = await make_agent(store)
    await converge(first, v1.section(1, origin.url))
    await first.close()
    await origin.close()  # nothing to fetch from any more

    again = await make_agent(store)
    status, body = await chat(again, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"
    await again.close()

    # a store whose manifest no longer verifies is not served
    sig = store / "manifests" / TINY / V1 / "manifest.sig"
    sig.write_bytes(bytes(64))
    refused = await make_agent(store)
    status, _ = await chat(refused, TINY)
    assert status == 404
    [inv] = sync_of(refused).inventory()
    assert inv.state is State.FAILED and "does not verify" in inv.last_error


async def test_store_keeps_last_k_versions_and_collects_blobs(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    versions = [
        signed_version(
            tiny_artifacts / TINY,
            signer,
            version=f"fp32-00000000000{i}",
            changed_file=("config.json", tmp_path / f"v{i}"),
        )
        for i in range(1, 4)
    ]
    for v in versions:
        origin.add(v)
    agent = await make_agent(keep_versions=2)
    for generation, v in enumerate(versions, start=1):
        await converge(agent, v.section(generation, origin.url))
    store = sync_of(agent).store
    expected = [versions[2].version, versions[1].version]

    first_only = set(versions[0].sizes) - set(versions[1].sizes) - set(versions[2].sizes)
    assert first_only

    def pruned() -> bool:
        # the old version is pruned once it is unloaded (after its requests finish)
        kept = [s.version for s in store.versions(TINY)]
        return kept == expected and not any(store.has_blob(h) for h in first_only)

    await wait_until(pruned, timeout_s=30, message="only the last two versions kept")
    assert all(store.has_blob(h) for h in versions[2].sizes)


_KILLED_FETCH = """
import asyncio, sys
from pathlib import Path
from agent.sync.fetch import BlobFetcher, BlobSource
from agent.sync.store import ModelStore

async def main() -> None:
    fetcher = BlobFetcher(ModelStore(Path(sys.argv[1])), bandwidth_bytes_per_s=4_000_000)
    done = []
    def progress(n, kind):
        done.append(n)
        if sum(done) > int(sys.argv[5]):
            print("halfway", flush=True)
    await fetcher.fetch(sys.argv[3], int(sys.argv[4]), [BlobSource(sys.argv[2], "coordinator")],
                        progress)
    print("finished", flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
async def test_sigkill_mid_download_resumes_without_refetching(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    store = tmp_path / "store-killed"
    big = max(v1.sizes, key=lambda h: v1.sizes[h])
    size = v1.sizes[big]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_FETCH, str(store), origin.url, big, str(size),
        str(size // 2), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.strip() == b"halfway"
    proc.kill()
    await proc.wait()
    part = store / "partial" / f"{big}.part"
    kept = part.stat().st_size
    assert 0 < kept < size, "the partial download should be on disk"
    assert not (store / "blobs" / "sha256" / big).exists(), "nothing looks complete"
    sent_before = origin.bytes_sent

    agent = await make_agent(store)
    await converge(agent, v1.section(1, origin.url))
    inv = sync_of(agent).entry(TINY, V1)
    assert inv is not None and inv.state is State.LOADED
    resumed = [r for h, r in origin.requests if h == big and r is not None]
    assert resumed == [f"bytes={kept}-"]
    assert origin.bytes_sent - sent_before == v1.total_bytes - kept


async def test_agents_at_one_site_fetch_one_copy_from_the_coordinator(
    tiny_artifacts: Path, signer: ManifestSigner, origin: BlobOrigin, make_agent: AgentFactory
) -> None:
    """Three agents get the version at once, each naming the others as peers (as the
    coordinator does for agents holding or fetching it): the first fetches from the
    coordinator, the others wait for and take its blobs."""
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    origin.chunk_delay_s = 0.01  # a WAN link: slower than the site's LAN
    agents = [await make_agent() for _ in range(3)]
    urls = [str(a.make_url("/v1/blobs")) for a in agents]
    for agent, url in zip(agents, urls, strict=True):
        sync_of(agent).options.own_blob_url = url
    await asyncio.gather(
        *(
            converge(agent, v1.section(1, origin.url, peers=tuple(u for u in urls if u != url)))
            for agent, url in zip(agents, urls, strict=True)
        )
    )
    assert origin.bytes_sent == v1.total_bytes, "more than one copy crossed the WAN"
    from_peers = [sync_of(a).entry(TINY, V1).bytes_from_peers for a in agents]  # type: ignore[union-attr]
    assert sorted(from_peers) == [0, v1.total_bytes, v1.total_bytes]


@pytest.mark.slow
async def test_a_version_swapped_back_in_is_not_self_checked_again(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rollback swaps the previous version back in at load speed: its self-check passed
    on this box in this process, on the same files (same manifest sha256)."""
    from agent.sync import self_check

    checked: list[str] = []
    real = self_check.run_self_check

    def counting(directory: Path, manifest: Any, threads: int, prompts: int) -> Any:
        checked.append(manifest.version)
        return real(directory, manifest, threads, prompts)

    monkeypatch.setattr("agent.sync.manager.run_self_check", counting)
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    v2 = signed_version(tiny_artifacts / TINY, signer, version=V2)
    origin.add(v1)
    origin.add(v2)
    agent = await make_agent(self_check=True, self_check_prompts=1)
    await converge(agent, v1.section(1, origin.url))
    first = sync_of(agent).entry(TINY, V1)
    assert first is not None and first.self_check is not None and first.self_check.passed
    await converge(agent, v2.section(2, origin.url))
    await converge(agent, v1.section(3, origin.url))  # back, as a rollback sends it
    assert checked == [V1, V2]
    status, body = await chat(agent, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"
    back = sync_of(agent).entry(TINY, V1)
    assert back is not None and back.state is State.LOADED
    assert back.self_check == first.self_check  # the result it passed with, reported


async def test_a_targets_residency_pins_serves_on_demand_or_only_stores(
    tiny_artifacts: Path,
    signer: ManifestSigner,
    origin: BlobOrigin,
    make_agent: AgentFactory,
    tmp_path: Path,
) -> None:
    """Issue 26: a pinned target stays loaded past its keep-alive; the same version on
    demand goes when idle and comes back for its next request; store only keeps the files
    verified on disk but stops serving (404, not in /v1/models, not started again after a
    restart), and on demand again serves it without fetching anything."""
    v1 = signed_version(tiny_artifacts / TINY, signer, version=V1)
    origin.add(v1)
    store = tmp_path / "store"

    async def cards(agent: TestClient) -> dict[str, Any]:
        return {c["id"]: c for c in (await (await agent.get("/v1/models")).json())["data"]}

    agent = await make_agent(store, residency={"keep_alive_s": 0.3, "min_residency_s": 0})
    residency = sync_of(agent).registry.residency
    assert residency is not None
    await converge(agent, v1.section(1, origin.url, residency=Residency.PINNED))
    await wait_until(lambda: residency.state(TINY) == "loaded", timeout_s=30)
    await asyncio.sleep(0.5)
    assert await residency.expire_idle() == []  # pinned: past its keep-alive, kept
    card = (await cards(agent))[TINY]
    assert card["state"] == "loaded" and card["pinned"] is True

    await converge(agent, v1.section(2, origin.url, residency=Residency.ON_DEMAND))
    assert (await cards(agent))[TINY]["pinned"] is False
    await asyncio.sleep(0.4)
    assert await residency.expire_idle() == [TINY]  # on demand: idle past keep-alive, gone
    status, _ = await chat(agent, TINY)
    assert status == 200 and residency.state(TINY) == "loaded"  # its request loaded it

    fetched = origin.bytes_sent
    await converge(agent, v1.section(3, origin.url, residency=Residency.STORE_ONLY))
    status, body = await chat(agent, TINY)
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert TINY not in await cards(agent)
    assert state(agent, V1) is State.ON_DISK  # verified and kept
    await agent.close()
    again = await make_agent(store, residency={"keep_alive_s": 0.3})
    assert TINY not in await cards(again)  # not served at start either

    await converge(again, v1.section(4, origin.url, residency=Residency.ON_DEMAND))
    status, body = await chat(again, TINY)
    assert status == 200 and body["model"] == f"{TINY}@{V1}"
    assert origin.bytes_sent == fetched  # nothing fetched again
