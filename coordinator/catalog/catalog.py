"""The model catalog: published model versions, their signed manifests and the
content-addressed blob store that holds their files.

A version is the models build's ``manifest.json`` bytes (every file with its path, size
and sha256, and the accuracy gate's figures), signed with the coordinator's ed25519 key
(``edgefleet.model_signing.ManifestSigner``). Its identity is (name, version) from the
manifest, unless the publisher overrides them: then those two keys are rewritten and the
rewritten bytes are signed. The signature covers the exact bytes, which are stored and
sent as they are.

Files live once in the blob store, by sha256 (``<data_dir>/models/blobs/sha256/<hex>``):
a version that shares files with another stores (and moves) only what changed. Every
write goes to a temporary file under ``models/tmp`` that is hashed as it is written,
fsynced, checked against the sha256 it was sent under and only then renamed into place,
so a crash never leaves a blob that looks complete, and no blob holds other bytes than
its name says. Deleting a version removes the blobs no other version lists.

The versions are kept in the store (coordinator/store/catalog.py: tables ``model_versions``
and ``model_files``) and, all of them, in memory: a catalog holds a handful of versions of
a few KiB each, and reading them (each agent's ModelsSection, built as agents connect and
report) must not wait for the store. The coordinators are the catalog's only writers (the
CLI's ``models`` commands go through an admin API); every change is written to the store
first, then to memory, then told to the other coordinators on the database (``bind_changes``:
the change feed, coordinator/cluster/changes.py), which ``reload`` it. Blobs live in each
coordinator's own blob store; one that lacks a blob a listed version names fetches it
from a peer coordinator (coordinator/catalog/replication.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from coordinator.errors import (
    BlobIntegrityError,
    MissingBlobsError,
    ModelCatalogError,
    ModelInUseError,
    ModelVersionExistsError,
    SigningKeyError,
    UnknownModelVersionError,
)
from coordinator.store.catalog import CatalogTable
from coordinator.store.catalog import CatalogVersion as CatalogVersion  # the catalog's record
from edgefleet.model_signing import (
    MANIFEST_FILE,
    PUBLIC_KEY_FILE,
    SIGNATURE_FILE,
    ManifestSignatureError,
    ManifestSigner,
    blob_path,
    check_name,
    check_sha256,
    encode_public_key,
    manifest_dir,
    sha256_hex,
)
from models.errors import ManifestError
from models.manifest import manifest_from_dict

logger = logging.getLogger(__name__)

#: Under the coordinator's data_dir: the blob store, and the signing key's file.
MODELS_DIR = "models"
SIGNING_KEY_FILE = "model-signing.key"
#: Where blobs are written before they are verified and renamed (never backed up).
TMP_DIR = "tmp"
#: A manifest larger than this is refused (the real ones are a few KiB).
MAX_MANIFEST_BYTES = 1 << 20
_CHUNK = 1 << 20
#: The ``detail`` of a catalog change told to the other coordinators (subject: name@version).
CATALOG_CHANGES = ("published", "deprecated", "undeprecated", "deleted")

#: ``notify(subject, detail)``: tell the other coordinators (the change feed's publish).
Notify = Callable[[str, str], Awaitable[object]]


def load_signer(data_dir: Path) -> ManifestSigner:
    """The coordinator's signing key (made on first start); SigningKeyError when the file
    exists but cannot be read or is not an ed25519 key: the coordinator does not start
    (a new key would orphan every agent that pinned the old one)."""
    path = data_dir / SIGNING_KEY_FILE
    try:
        return ManifestSigner.load_or_create(path)
    except (OSError, ValueError, TypeError, ManifestSignatureError) as exc:
        raise SigningKeyError(
            f"cannot load the model-signing key {path}: {exc} (restore it from a backup; "
            "agents pinned its public key at enrollment)"
        ) from exc


class BlobWriter:
    """One blob being written: hashed as it arrives, renamed into place by ``commit``."""

    def __init__(self, store: BlobStore, sha256: str) -> None:
        self.sha256 = check_sha256(sha256)
        self._store = store
        self._tmp = store.tmp_dir / f"{sha256}.{uuid.uuid4().hex}.part"
        self._file: BinaryIO | None = self._tmp.open("xb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise RuntimeError("the blob writer is closed")
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def commit(self) -> Path:
        """Check the sha256, fsync and rename; BlobIntegrityError (nothing kept) if wrong."""
        file, self._file = self._file, None
        if file is None:
            raise RuntimeError("the blob writer is closed")
        try:
            file.flush()
            os.fsync(file.fileno())
        finally:
            file.close()
        got = self._hash.hexdigest()
        if got != self.sha256:
            self._tmp.unlink(missing_ok=True)
            raise BlobIntegrityError(
                f"the uploaded bytes ({self.size} bytes) hash to sha256 {got}, not "
                f"{self.sha256}: refused, nothing stored"
            )
        final = self._store.path(self.sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._tmp, final)
        _fsync_dir(final.parent)
        return final

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


class BlobStore:
    """Files by sha256 under ``root/blobs/sha256/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp_dir = root / TMP_DIR
        self.tmp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        # Leftovers of writes a crash interrupted: never complete, never served.
        for stale in self.tmp_dir.glob("*.part"):
            stale.unlink(missing_ok=True)

    def path(self, sha256: str) -> Path:
        return blob_path(self.root, sha256)

    def size(self, sha256: str) -> int | None:
        """The blob's size, or None when the store does not hold it."""
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def has(self, sha256: str) -> bool:
        return self.size(sha256) is not None

    def missing(self, wanted: Iterable[str]) -> list[str]:
        return sorted({s for s in wanted if not self.has(s)})

    def writer(self, sha256: str) -> BlobWriter:
        return BlobWriter(self, sha256)

    def put_file(self, source: Path, sha256: str) -> None:
        """Copy a local file in (verified like an upload); nothing when already held."""
        if self.has(sha256):
            return
        writer = self.writer(sha256)
        try:
            with source.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    writer.write(chunk)
            writer.commit()
        except BaseException:
            writer.abort()
            raise

    def remove(self, sha256: str) -> bool:
        try:
            self.path(sha256).unlink()
        except FileNotFoundError:
            return False
        return True


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class Published:
    """What ``publish`` did: the version, whether it was new, and warnings for the operator."""

    version: CatalogVersion
    created: bool
    warnings: tuple[str, ...] = ()


def parse_manifest(
    manifest: bytes, *, name: str | None = None, version: str | None = None
) -> tuple[bytes, dict[str, Any]]:
    """Validate a models-build manifest; return the bytes to sign (rewritten only when
    ``name`` or ``version`` override the manifest's own) and the decoded manifest."""
    if len(manifest) > MAX_MANIFEST_BYTES:
        raise ModelCatalogError(f"the manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(manifest)
        manifest_from_dict(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelCatalogError(f"the manifest is not valid JSON: {exc}") from exc
    except ManifestError as exc:
        raise ModelCatalogError(f"the manifest is not a valid models manifest: {exc}") from exc
    for kind, value in (("model name", name), ("version", version)):
        if value is not None:
            try:
                check_name(kind, value)
            except ValueError as exc:
                raise ModelCatalogError(str(exc)) from exc
    try:
        check_name("model name", str(data["name"]))
        check_name("version", str(data["version"]))
    except ValueError as exc:
        raise ModelCatalogError(f"the manifest's {exc}") from exc
    if (name is None or name == data["name"]) and (version is None or version == data["version"]):
        return manifest, data
    if name is not None:
        data["name"] = name
    if version is not None:
        data["version"] = version
    return (json.dumps(data, indent=2) + "\n").encode("utf-8"), data


def gate_passed(data: dict[str, Any]) -> bool:
    accuracy = data.get("accuracy")
    return not isinstance(accuracy, dict) or bool(accuracy.get("passed", True))


class ModelCatalog:
    """Published versions (in the store, and in memory) over a BlobStore, signed by one
    ManifestSigner. ``await load()`` before the first read."""

    def __init__(
        self,
        store: CatalogTable,
        blobs: BlobStore,
        signer: ManifestSigner,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self.blobs = blobs
        self.signer = signer
        self._clock = clock
        # (name, version) -> the version, as stored.
        self._versions: dict[tuple[str, str], CatalogVersion] = {}
        # sha256 -> how many versions list a file with it.
        self._files: dict[str, int] = {}
        # One change at a time: each checks memory, writes the store, then memory.
        self._changing = asyncio.Lock()
        self._notify: Notify | None = None

    def bind_changes(self, notify: Notify) -> None:
        """After each change made here: ``notify(name@version, detail)`` (CATALOG_CHANGES)."""
        self._notify = notify

    async def _told(self, ref: str, detail: str) -> None:
        if self._notify is not None:
            await self._notify(ref, detail)

    @classmethod
    def in_directory(cls, store: CatalogTable, data_dir: Path) -> ModelCatalog:
        return cls(store, BlobStore(data_dir / MODELS_DIR), load_signer(data_dir))

    async def load(self) -> None:
        """Read every published version from the store."""
        self._replace(await self._store.list_model_versions())

    async def reload(self) -> None:
        """Read every version again (another coordinator changed the catalog): memory
        becomes what the store holds, in one step, between this coordinator's changes."""
        async with self._changing:
            self._replace(await self._store.list_model_versions())

    def _replace(self, stored: Iterable[CatalogVersion]) -> None:
        self._versions, self._files = {}, {}
        for version in stored:
            self._remember(version)

    @property
    def public_key(self) -> bytes:
        return self.signer.public_key

    def _remember(self, version: CatalogVersion) -> None:
        self._versions[(version.name, version.version)] = version
        for sha in {f["sha256"] for f in version.files()}:
            self._files[sha] = self._files.get(sha, 0) + 1

    def _forget(self, version: CatalogVersion) -> None:
        del self._versions[(version.name, version.version)]
        for sha in {f["sha256"] for f in version.files()}:
            left = self._files.get(sha, 0) - 1
            if left > 0:
                self._files[sha] = left
            else:
                self._files.pop(sha, None)

    # ------------------------------------------------------------------ reading

    def get(self, name: str, version: str) -> CatalogVersion | None:
        return self._versions.get((name, version))

    def require(self, name: str, version: str) -> CatalogVersion:
        found = self.get(name, version)
        if found is None:
            raise UnknownModelVersionError(f"no model version {name}@{version} in the catalog")
        return found

    def versions(self, name: str | None = None) -> list[CatalogVersion]:
        """By name, then oldest first."""
        found = [v for v in self._versions.values() if name is None or v.name == name]
        return sorted(found, key=lambda v: (v.name, v.published_at))

    def referenced(self, sha256: str) -> bool:
        """Some published version lists a file with this sha256."""
        return sha256 in self._files

    def blob_size(self, sha256: str) -> int | None:
        """The size a published version lists for this blob; None when none lists it."""
        if sha256 not in self._files:
            return None
        for version in self._versions.values():
            for entry in version.files():
                if entry["sha256"] == sha256:
                    return int(entry["size"])
        return None

    # ------------------------------------------------------------------ changing

    async def publish(
        self, manifest: bytes, *, name: str | None = None, version: str | None = None
    ) -> Published:
        """Register a version whose files are all in the blob store; sign its manifest.

        Publishing the same bytes again is a no-op (``created`` False); another manifest
        under a published name@version is refused (ModelVersionExistsError).
        """
        async with self._changing:
            published = await self._publish(manifest, name=name, version=version)
        if published.created:
            await self._told(published.version.ref, "published")
        return published

    async def _publish(self, manifest: bytes, *, name: str | None, version: str | None
                       ) -> Published:  # fmt: skip
        signed, data = parse_manifest(manifest, name=name, version=version)
        files = data["files"]
        missing = [
            f"{f['path']} ({f['sha256']})"
            for f in files
            if self.blobs.size(f["sha256"]) != f["size"]
        ]
        if missing:
            raise MissingBlobsError(missing)
        digest = sha256_hex(signed)
        existing = self.get(data["name"], data["version"])
        if existing is not None:
            if existing.sha256 == digest:
                return Published(existing, created=False)
            raise ModelVersionExistsError(
                f"{existing.ref} is already published with another manifest (sha256 "
                f"{existing.sha256[:12]}); publish under another --version"
            )
        warnings = []
        passed = gate_passed(data)
        if not passed:
            warnings.append(
                f"{data['name']}@{data['version']}: the build's accuracy gate FAILED "
                f"({_gate_summary(data)}); published anyway (a rollout's on-box "
                "self-check will fail it)"
            )
        record = CatalogVersion(
            name=data["name"],
            version=data["version"],
            task=str(data.get("task", "")),
            manifest=signed,
            signature=self.signer.sign(signed),
            sha256=digest,
            size_bytes=sum(int(f["size"]) for f in files),
            gate_passed=passed,
            deprecated=False,
            published_at=self._clock(),
        )
        await self._store.add_model_version(record)
        self._remember(record)
        for warning in warnings:
            logger.warning("%s", warning)
        logger.info("published %s (%d files, %d bytes)", record.ref, len(files), record.size_bytes)
        return Published(record, created=True, warnings=tuple(warnings))

    async def publish_directory(
        self, directory: Path, *, name: str | None = None, version: str | None = None
    ) -> Published:
        """Publish a local artifact directory: verify and copy its files in, then publish."""
        try:
            manifest = (directory / MANIFEST_FILE).read_bytes()
        except OSError as exc:
            raise ModelCatalogError(f"cannot read {directory / MANIFEST_FILE}: {exc}") from exc
        _, data = parse_manifest(manifest)
        for entry in data["files"]:
            self.blobs.put_file(directory / entry["path"], entry["sha256"])
        return await self.publish(manifest, name=name, version=version)

    async def set_deprecated(self, name: str, version: str, deprecated: bool) -> CatalogVersion:
        async with self._changing:
            found = self.require(name, version)
            if not await self._store.set_model_deprecated(name, version, deprecated):
                raise UnknownModelVersionError(f"no model version {found.ref} in the catalog")
            changed = self._versions[(name, version)] = replace(found, deprecated=deprecated)
        await self._told(changed.ref, "deprecated" if deprecated else "undeprecated")
        return changed

    async def delete(self, name: str, version: str, *, in_use_by: Iterable[str] = ()) -> list[str]:
        """Remove a version and the blobs no other version lists; returns those blobs.

        ``in_use_by``: agents that desire it or have it loaded (and rules that name it);
        any refuses the delete.
        """
        async with self._changing:
            found = self.require(name, version)
            orphans = await self._delete(found, in_use_by)
        await self._told(found.ref, "deleted")
        return orphans

    async def _delete(self, found: CatalogVersion, in_use_by: Iterable[str]) -> list[str]:
        name, version = found.name, found.version
        users = sorted(set(in_use_by))
        if users:
            raise ModelInUseError(
                f"{name}@{version} is in use by {len(users)} agent(s) or rule(s) "
                f"({', '.join(users[:5])}{', ...' if len(users) > 5 else ''}): it is desired "
                "or loaded there; deploy another version first"
            )
        orphans = await self._store.delete_model_version(name, version)
        self._forget(found)
        for sha in orphans:
            self.blobs.remove(sha)
        logger.info("deleted %s@%s (%d blobs removed)", name, version, len(orphans))
        return orphans


def write_signed_set(
    root: Path,
    versions: Iterable[CatalogVersion],
    public_key: bytes,
    fetch_blob: Callable[[str, Path], None],
) -> dict[str, Any]:
    """Write a signed model set (``edgefleet.model_signing`` layout) into ``root``.

    ``fetch_blob(sha256, destination)`` writes one blob's bytes to ``destination`` (a
    temporary name); each is checked against its sha256 before it is renamed.
    """
    written: list[str] = []
    blobs = 0
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / ".export-tmp"
    tmp.mkdir(exist_ok=True)
    try:
        for item in versions:
            for entry in item.files():
                target = blob_path(root, entry["sha256"])
                if target.exists() and _file_sha256(target) == entry["sha256"]:
                    continue
                part = tmp / entry["sha256"]
                fetch_blob(entry["sha256"], part)
                got = _file_sha256(part)
                if got != entry["sha256"]:
                    part.unlink(missing_ok=True)
                    raise BlobIntegrityError(
                        f"blob {entry['sha256']} of {item.ref} arrived as {got}: export stopped"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(part, target)
                blobs += 1
            where = manifest_dir(root, item.name, item.version)
            where.mkdir(parents=True, exist_ok=True)
            _write_atomic(where / MANIFEST_FILE, item.manifest)
            _write_atomic(where / SIGNATURE_FILE, item.signature)
            written.append(item.ref)
        _write_atomic(root / PUBLIC_KEY_FILE, (encode_public_key(public_key) + "\n").encode())
    finally:
        with contextlib.suppress(OSError):
            for leftover in tmp.iterdir():
                leftover.unlink()
            tmp.rmdir()
    return {"object": "model_export", "root": str(root), "versions": written,
            "blobs_written": blobs}  # fmt: skip


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _gate_summary(data: dict[str, Any]) -> str:
    accuracy = data.get("accuracy") or {}
    parts = [
        f"{key}={accuracy[key]}"
        for key in ("perplexity_ratio", "perplexity_ratio_max", "factual_correct", "factual_total")
        if key in accuracy and not isinstance(accuracy[key], dict | list)
    ]
    return ", ".join(parts) or "see the manifest's accuracy section"
