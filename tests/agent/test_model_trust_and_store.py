"""Which signing keys an agent trusts, and the model store's retention (no model runs)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agent.errors import ManifestTrustError
from agent.sync.store import ModelStore
from agent.sync.trust import PINNED_KEY_FILE, TrustedKeys, pin_signing_key
from edgefleet.model_signing import ManifestSigner, encode_public_key

MANIFEST = b'{"a manifest": true}'


def signer(tmp_path: Path, name: str) -> ManifestSigner:
    return ManifestSigner.load_or_create(tmp_path / f"{name}.pem")


def test_pinned_key_verifies_others_refused_and_welcome_never_replaces_a_pin(
    tmp_path: Path,
) -> None:
    ours, theirs = signer(tmp_path, "ours"), signer(tmp_path, "theirs")
    trust = TrustedKeys(tmp_path)
    with pytest.raises(ManifestTrustError, match="no model-signing key"):
        trust.check(MANIFEST, ours.sign(MANIFEST))
    with pytest.raises(ManifestTrustError, match="allow_unsigned is off"):
        trust.check(MANIFEST, b"")
    trust.welcome_key(ours.public_key)  # first use: pinned
    assert (tmp_path / PINNED_KEY_FILE).stat().st_mode & 0o777 == 0o600
    trust.check(MANIFEST, ours.sign(MANIFEST))
    trust.welcome_key(theirs.public_key)  # a later Welcome does not replace the pin
    with pytest.raises(ManifestTrustError, match="does not verify"):
        trust.check(MANIFEST, theirs.sign(MANIFEST))
    with pytest.raises(ManifestTrustError, match="does not verify"):
        trust.check(MANIFEST + b" ", ours.sign(MANIFEST))
    with pytest.raises(ManifestTrustError, match="only loads signed"):
        trust.check(MANIFEST, b"")
    # enrollment's key is authoritative: it replaces the pin
    pin_signing_key(tmp_path, theirs.public_key)
    trust.check(MANIFEST, theirs.sign(MANIFEST))


def test_configured_keys_and_allow_unsigned_for_standalone_agents(tmp_path: Path) -> None:
    a, b = signer(tmp_path, "a"), signer(tmp_path, "b")
    key_file = tmp_path / "signing-key.pub"
    key_file.write_text(encode_public_key(b.public_key))
    trust = TrustedKeys(None, [encode_public_key(a.public_key)], [key_file])
    trust.check(MANIFEST, a.sign(MANIFEST))
    trust.check(MANIFEST, b.sign(MANIFEST))
    with pytest.raises(ManifestTrustError):
        trust.check(MANIFEST, b"")
    TrustedKeys(None, allow_unsigned=True).check(MANIFEST, b"")
    with pytest.raises(ManifestTrustError, match="trusted_keys"):
        TrustedKeys(None, ["not base64!"])


def _install(store: ModelStore, base: dict[str, object], version: str, payload: bytes) -> set[str]:
    """The tiny model's manifest as ``version`` whose graph is ``payload`` (other files
    shared by every version)."""
    entries = []
    for name in ("config.json", "model.onnx", "tokenizer.json"):
        data = payload if name == "model.onnx" else f"shared {name}".encode()
        sha = hashlib.sha256(data).hexdigest()
        store.partial(sha).write_bytes(data)
        store.commit_partial(sha)
        entries.append({"path": name, "sha256": sha, "size": len(data)})
    manifest = json.dumps({**base, "version": version, "files": entries}).encode()
    store.put_manifest("tiny-llama", version, manifest, b"")
    store.mark_installed("tiny-llama", version)
    return {e["sha256"] for e in entries}  # type: ignore[misc]


def test_store_keeps_versions_within_the_disk_budget(tmp_path: Path, tiny_artifacts: Path) -> None:
    base = json.loads((tiny_artifacts / "tiny-llama" / "manifest.json").read_text())
    store = ModelStore(tmp_path / "store", keep_versions=5, max_bytes=2600)
    versions = ("fp32-000000000001", "fp32-000000000002", "fp32-000000000003")
    blobs = {v: _install(store, base, v, bytes([i]) * 1000) for i, v in enumerate(versions)}
    v1, v2, v3 = versions
    store.set_active("tiny-llama", v3)
    removed = store.prune(keep={("tiny-llama", v3)})
    assert removed == [("tiny-llama", v1)]  # 3 x 1000 + shared > 2600: the oldest goes
    assert [v.version for v in store.versions("tiny-llama")] == [v3, v2]
    only_v1 = blobs[v1] - blobs[v2] - blobs[v3]
    assert only_v1 and not any(store.has_blob(h) for h in only_v1)
    assert all(store.has_blob(h) for h in blobs[v3] | blobs[v2])
    assert store.blob_bytes() <= 2600
