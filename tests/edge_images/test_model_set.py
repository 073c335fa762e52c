"""The signed model set images and the bundle carry (no image is built here): artifact
directories signed through a throwaway coordinator catalog, an exported set baked as it
is after its check, and an agent whose store reads such a set as its read-only seed,
verifying every signature and sha256 (the tiny model)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import SYNC, create_app
from agent.config import load_config
from edge_images.errors import ImageBuildError
from edge_images.model_set import check_signed_set, set_digest, signed_model_set
from edgefleet.model_signing import (
    ManifestSigner,
    blob_path,
    decode_public_key,
    encode_public_key,
    manifest_dir,
)

TINY = "tiny-llama"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEFLEET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny_version(artifacts: Path) -> str:
    return str(json.loads((artifacts / TINY / "manifest.json").read_text())["version"])


def read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_artifacts_signed_through_a_catalog_and_exported_sets_checked(
    tiny_artifacts: Path, cache: Path, tmp_path: Path
) -> None:
    key = tmp_path / "operator.pem"
    out = signed_model_set(tiny_artifacts, (TINY,), signing_key=key)
    assert key.stat().st_mode & 0o777 == 0o600  # the operator's key, made once
    signer = ManifestSigner.load_or_create(key)
    assert decode_public_key((out / "signing-key.pub").read_text()) == signer.public_key
    version = tiny_version(tiny_artifacts)
    assert check_signed_set(out) == [f"{TINY}@{version}"]
    manifest = json.loads((manifest_dir(out, TINY, version) / "manifest.json").read_bytes())
    assert {e["sha256"] for e in manifest["files"]} == {
        p.name for p in (out / "blobs" / "sha256").iterdir()
    }
    # the same inputs and key: the same set, from the cache (ed25519 signs deterministically)
    digest = set_digest(out)
    assert signed_model_set(tiny_artifacts, (TINY,), signing_key=key) == out
    shutil.rmtree(out)
    assert set_digest(signed_model_set(tiny_artifacts, (TINY,), signing_key=key)) == digest
    # a set `coordinator models export` wrote is baked as it is, once it checks out
    exported = tmp_path / "exported"
    shutil.copytree(out, exported)
    assert signed_model_set(exported, (), signing_key=None) == exported
    blob = blob_path(exported, manifest["files"][0]["sha256"])
    good = blob.read_bytes()
    blob.write_bytes(b"x" + good[1:])
    with pytest.raises(ImageBuildError, match="its manifest says"):
        signed_model_set(exported, ())
    blob.write_bytes(good)
    (manifest_dir(exported, TINY, version) / "manifest.sig").write_bytes(bytes(64))
    with pytest.raises(ImageBuildError, match="does not verify"):
        signed_model_set(exported, ())
    with pytest.raises(ImageBuildError, match=r"no manifest\.json"):
        signed_model_set(tmp_path, ("nothing-here",))


AgentFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def make_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    clients: list[TestClient] = []

    async def start(seed: Path, store: Path, **models: Any) -> TestClient:
        overrides: dict[str, Any] = {
            "models": {"source": "store", "store_dir": str(store), "seed_dir": str(seed),
                       "trusted_keys_file": str(seed / "signing-key.pub"),
                       "self_check": False, **models},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 8,
                       "intra_op_threads": 1},
        }  # fmt: skip
        app = create_app(load_config(environ={}, overrides=overrides))
        client = TestClient(TestServer(app, handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


async def chat(client: TestClient) -> tuple[int, dict[str, Any]]:
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "temperature": 0}  # fmt: skip
    resp = await client.post("/v1/chat/completions", json=body)
    return resp.status, await resp.json()


def failed_error(client: TestClient) -> str:
    [inv] = client.app[SYNC].inventory()  # type: ignore[index]
    assert inv.state.name == "FAILED"
    return str(inv.last_error)


async def test_agent_serves_a_read_only_seed_verified_without_copying_it(
    tiny_artifacts: Path, cache: Path, tmp_path: Path, make_agent: AgentFactory
) -> None:
    version = tiny_version(tiny_artifacts)
    seed = tmp_path / "seed"
    shutil.copytree(signed_model_set(tiny_artifacts, (TINY,)), seed)
    read_only(seed)
    try:
        store = tmp_path / "state" / "models"
        agent = await make_agent(seed, store)
        status, body = await chat(agent)
        assert status == 200 and body["model"] == f"{TINY}@{version}"
        # adopted: manifest and signature in the store, no file copied (read in place)
        assert json.loads((store / "active.json").read_text()) == {TINY: version}
        assert list((store / "blobs" / "sha256").iterdir()) == []
        installed = (manifest_dir(store, TINY, version) / "installed").read_text()
        manifest = json.loads((manifest_dir(seed, TINY, version) / "manifest.json").read_bytes())
        for entry in manifest["files"]:  # a link (hard, or symbolic across file systems)
            view = store / "views" / TINY / version / entry["path"]
            assert view.samefile(blob_path(seed, entry["sha256"]))
        await agent.close()
        # a restart serves the store again; the seed is not adopted a second time
        again = await make_agent(seed, store)
        assert (await chat(again))[0] == 200
        assert (manifest_dir(store, TINY, version) / "installed").read_text() == installed
        await again.close()

        # another key than the set's: its manifest is refused, nothing is served
        other = ManifestSigner.load_or_create(tmp_path / "other.pem")
        (tmp_path / "other.pub").write_text(encode_public_key(other.public_key))
        refused = await make_agent(
            seed, tmp_path / "state2" / "models", trusted_keys_file=str(tmp_path / "other.pub")
        )
        assert (await chat(refused))[0] == 404
        assert "does not verify" in failed_error(refused)

        # a seed file whose bytes are not its manifest's: refused at start (sha256 checked)
        writable(seed)
        [entry] = [e for e in manifest["files"] if e["path"] == "model.onnx"]
        blob = blob_path(seed, entry["sha256"])
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        read_only(seed)
        broken = await make_agent(seed, tmp_path / "state3" / "models")
        assert (await chat(broken))[0] == 404
        assert "model.onnx" in failed_error(broken)
    finally:
        writable(seed)
