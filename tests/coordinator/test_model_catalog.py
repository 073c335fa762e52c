"""The model catalog: content-addressed blobs, signed manifests, publish/deprecate/delete,
the signing key's life (refused start when unreadable, kept by backup/restore) and export."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from coordinator.app import create_app
from coordinator.catalog.catalog import (
    MODELS_DIR,
    SIGNING_KEY_FILE,
    TMP_DIR,
    ModelCatalog,
    write_signed_set,
)
from coordinator.config import CoordinatorConfig
from coordinator.errors import (
    BlobIntegrityError,
    MissingBlobsError,
    ModelCatalogError,
    ModelInUseError,
    ModelVersionExistsError,
    SigningKeyError,
    UnknownModelVersionError,
)
from coordinator.fleet.records import Liveness
from coordinator.store.backup import backup, restore
from coordinator.store.catalog import CatalogVersion
from coordinator.store.interface import AgentLastState, FleetStore
from coordinator.store.offline import run_offline
from edgefleet.contract import (
    Hello,
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    ModelStats,
    SelfCheckResult,
)
from edgefleet.model_signing import (
    ManifestSignatureError,
    blob_path,
    decode_public_key,
    manifest_dir,
    sha256_hex,
    verify_manifest,
)
from tests.coordinator.model_testing import make_artifact
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

# make_artifact copies tiny-llama's build manifest: built (or found) first
pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("tiny_artifacts")]

__all__ = ["backend", "store_factory"]  # fixtures: catalog tests run on both stores


@pytest.fixture
async def catalog(tmp_path: Path, store_factory: StoreFactory) -> AsyncIterator[ModelCatalog]:
    """On each store backend (tests/coordinator/store_backends.py)."""
    store = store_factory()
    await store.open()
    opened = ModelCatalog.in_directory(store, tmp_path / "data")
    await opened.load()
    yield opened
    await store.close()


def blob_files(root: Path) -> set[str]:
    return {p.name for p in (root / MODELS_DIR / "blobs" / "sha256").iterdir()}


async def test_publish_signs_the_manifest_bytes_and_stores_only_changed_files(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    first = make_artifact(tmp_path / "v1", weights=b"weights one" * 100)
    published = await catalog.publish_directory(tmp_path / "v1")
    assert published.created and published.warnings == ()
    v1 = published.version
    assert (v1.name, v1.version) == (first["name"], first["version"])
    assert v1.manifest == (tmp_path / "v1" / "manifest.json").read_bytes()
    assert v1.sha256 == sha256_hex(v1.manifest)
    assert v1.size_bytes == sum(f["size"] for f in first["files"])
    verify_manifest(catalog.public_key, v1.manifest, v1.signature)
    with pytest.raises(ManifestSignatureError):
        verify_manifest(catalog.public_key, v1.manifest + b" ", v1.signature)
    assert len(blob_files(tmp_path / "data")) == 3

    # A second version sharing config and tokenizer stores one new blob: the weights.
    second = make_artifact(tmp_path / "v2", weights=b"weights two" * 100)
    v2 = (await catalog.publish_directory(tmp_path / "v2")).version
    assert len(blob_files(tmp_path / "data")) == 4
    assert [v.version for v in catalog.versions(first["name"])] == [v1.version, v2.version]
    assert catalog.get(second["name"], second["version"]) == v2
    assert catalog.get(second["name"], "int4-000000000000") is None

    # Publishing the same bytes again changes nothing; other bytes under a taken
    # name@version are refused.
    again = await catalog.publish_directory(tmp_path / "v2")
    assert not again.created and again.version == v2
    make_artifact(tmp_path / "clash", weights=b"other" * 10, version=v2.version)
    with pytest.raises(ModelVersionExistsError, match="already published"):
        await catalog.publish_directory(tmp_path / "clash")


async def test_overridden_name_and_version_are_written_into_the_signed_bytes(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    make_artifact(tmp_path / "a", weights=b"w" * 64)
    version = (await catalog.publish_directory(tmp_path / "a", name="chat", version="v2")).version
    assert (version.name, version.version) == ("chat", "v2")
    signed = json.loads(version.manifest)
    assert (signed["name"], signed["version"]) == ("chat", "v2")
    verify_manifest(catalog.public_key, version.manifest, version.signature)
    with pytest.raises(ModelCatalogError, match="not allowed"):
        await catalog.publish_directory(tmp_path / "a", version="../escape")


async def test_a_failed_build_gate_is_published_with_a_warning(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    make_artifact(tmp_path / "bad", weights=b"int8" * 50, gate_passed=False)
    published = await catalog.publish_directory(tmp_path / "bad")
    assert published.created and not published.version.gate_passed
    assert "accuracy gate FAILED" in published.warnings[0]
    assert "perplexity_ratio=1.75" in published.warnings[0]


async def test_a_manifest_needs_its_blobs_and_must_be_a_models_manifest(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    make_artifact(tmp_path / "a", weights=b"w" * 64)
    manifest = (tmp_path / "a" / "manifest.json").read_bytes()
    with pytest.raises(MissingBlobsError) as refused:
        await catalog.publish(manifest)
    assert len(refused.value.missing) == 3
    with pytest.raises(ModelCatalogError, match="not valid JSON"):
        await catalog.publish(b"{not json")
    broken = json.loads(manifest)
    del broken["files"]
    with pytest.raises(ModelCatalogError, match="files"):
        await catalog.publish(json.dumps(broken).encode())


async def test_a_blob_whose_bytes_do_not_match_is_not_kept(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    real = b"the real bytes"
    writer = catalog.blobs.writer(sha256_hex(real))
    writer.write(b"the tampered bytes")
    with pytest.raises(BlobIntegrityError, match="hash to sha256"):
        writer.commit()
    assert not catalog.blobs.has(sha256_hex(real))
    assert list((tmp_path / "data" / MODELS_DIR / TMP_DIR).iterdir()) == []
    writer = catalog.blobs.writer(sha256_hex(real))
    writer.write(real)
    writer.commit()
    assert catalog.blobs.path(sha256_hex(real)).read_bytes() == real
    with pytest.raises(ValueError, match="sha256"):
        catalog.blobs.writer("../../etc/passwd")


async def test_delete_is_refused_in_use_and_keeps_shared_blobs(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    make_artifact(tmp_path / "v1", weights=b"one" * 40)
    make_artifact(tmp_path / "v2", weights=b"two" * 40)
    v1 = (await catalog.publish_directory(tmp_path / "v1")).version
    v2 = (await catalog.publish_directory(tmp_path / "v2")).version
    with pytest.raises(ModelInUseError, match="edge-1"):
        await catalog.delete(v1.name, v1.version, in_use_by=["edge-1"])
    assert catalog.get(v1.name, v1.version) is not None
    removed = await catalog.delete(v1.name, v1.version)
    assert removed == [f["sha256"] for f in v1.files() if f["path"] == "model.onnx"]
    assert len(blob_files(tmp_path / "data")) == 3  # v2's three files stay
    assert all(catalog.blobs.has(f["sha256"]) for f in v2.files())
    with pytest.raises(UnknownModelVersionError):
        await catalog.delete(v1.name, v1.version)
    flagged = await catalog.set_deprecated(v2.name, v2.version, True)
    assert flagged.deprecated and catalog.versions()[0].deprecated


async def test_export_writes_a_signed_set_that_verifies(
    catalog: ModelCatalog, tmp_path: Path
) -> None:
    make_artifact(tmp_path / "v1", weights=b"one" * 40)
    v1 = (await catalog.publish_directory(tmp_path / "v1")).version
    out = tmp_path / "export"

    def fetch(sha: str, destination: Path) -> None:
        destination.write_bytes(catalog.blobs.path(sha).read_bytes())

    result = write_signed_set(out, [v1], catalog.public_key, fetch)
    assert result["versions"] == [v1.ref] and result["blobs_written"] == 3
    where = manifest_dir(out, v1.name, v1.version)
    key = decode_public_key((out / "signing-key.pub").read_text())
    verify_manifest(
        key, (where / "manifest.json").read_bytes(), (where / "manifest.sig").read_bytes()
    )
    for entry in v1.files():
        assert sha256_hex(blob_path(out, entry["sha256"]).read_bytes()) == entry["sha256"]

    def tampered(sha: str, destination: Path) -> None:
        destination.write_bytes(b"not it")

    with pytest.raises(BlobIntegrityError):
        write_signed_set(tmp_path / "export2", [v1], catalog.public_key, tampered)


def test_the_coordinator_refuses_to_start_with_an_unreadable_signing_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = CoordinatorConfig(data_dir=str(data), grpc_port=0, http_port=0, enroll_port=0)
    create_app(config)  # makes the key
    key = data / SIGNING_KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    key.write_text("not a PEM key")
    with pytest.raises(SigningKeyError, match="model-signing key"):
        create_app(config)
    if os.geteuid() != 0:  # root reads a 000 file anyway
        key.chmod(0)
        with pytest.raises(SigningKeyError):
            create_app(config)


def test_backup_and_restore_keep_the_signing_key_and_blobs(tmp_path: Path) -> None:
    """Offline, as the CLI does it: the store opened in a loop of its own."""
    data = tmp_path / "data"
    make_artifact(tmp_path / "v1", weights=b"one" * 40)

    async def publish(store: FleetStore) -> tuple[CatalogVersion, bytes]:
        catalog = ModelCatalog.in_directory(store, data)
        await catalog.load()
        return (await catalog.publish_directory(tmp_path / "v1")).version, catalog.public_key

    v1, public_key = run_offline(data, publish)
    (data / MODELS_DIR / TMP_DIR / "half-written.part").write_bytes(b"partial")
    manifest = backup(data, tmp_path / "backup")
    assert SIGNING_KEY_FILE in manifest["files"]
    assert not any(TMP_DIR in name.split("/")[:2] for name in manifest["files"])
    fresh = tmp_path / "fresh"
    restore(tmp_path / "backup", fresh)

    async def reopen(store: FleetStore) -> ModelCatalog:
        again = ModelCatalog.in_directory(store, fresh)
        await again.load()
        return again

    again = run_offline(fresh, reopen)
    assert again.public_key == public_key
    restored = again.require(v1.name, v1.version)
    assert restored == v1
    verify_manifest(again.public_key, restored.manifest, restored.signature)
    assert all(again.blobs.has(f["sha256"]) for f in restored.files())


async def test_the_inventory_in_a_saved_load_report_survives_a_restart(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    await store.open()
    await store.save_hello(Hello(agent_id="edge-1"), datetime.now(UTC))
    check = SelfCheckResult(passed=False, perplexity=22.7, perplexity_ratio=1.75, detail="ppl")
    report = LoadReport(
        inventory=(
            ModelInventory("chat", "v1", ModelInventoryState.LOADED, 10, 10),
            ModelInventory("chat", "v2", ModelInventoryState.FAILED, last_error="bad",
                           self_check=check),
        ),
        model_stats=(ModelStats("chat", "v1", requests=3),),
    )  # fmt: skip
    state = AgentLastState("edge-1", Liveness.LIVE, datetime.now(UTC), report)
    await store.save_last_states([state], datetime.now(UTC))
    await store.close()
    reopened = store_factory()
    await reopened.open()
    (saved,) = await reopened.list_last_states()
    await reopened.close()
    assert saved.report is not None
    assert saved.report.inventory == report.inventory
    assert saved.report.inventory[1].state is ModelInventoryState.FAILED
    assert saved.report.model_stats == ()  # per-interval figures are not state
