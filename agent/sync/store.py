"""The agent's model store: a signed model set on disk (``edgefleet.model_signing`` layout).

::

    ROOT/blobs/sha256/<hex>                          every file, content-addressed, verified
    ROOT/manifests/<name>/<version>/manifest.json    the signed bytes
    ROOT/manifests/<name>/<version>/manifest.sig     their signature (absent: unsigned)
    ROOT/manifests/<name>/<version>/installed        when the version was installed (ns)
    ROOT/views/<name>/<version>/                     hard links named as the artifact's
                                                     files + manifest.json: what loads
    ROOT/partial/<hex>.part                          downloads in progress (resumed)
    ROOT/active.json                                 name -> version serving (cold start)
    ROOT/seeded.json                                 seed versions adopted (each only once)

A blob enters ``blobs/`` only by an atomic rename after its sha256 was checked, so
anything there is complete; a crash mid-download leaves only a ``.part`` file, which the
next fetch resumes. Versions are kept newest first: the last ``keep_versions`` of each
model within ``max_bytes`` (the serving and desired versions are never removed); blobs no
kept version lists are deleted.

A store may have a read-only **seed**: a signed model set (``coordinator models export``
layout) baked into an image or shipped in an offline bundle. The store adopts each of the
seed's versions once (its manifest and signature are copied in, its blobs are not: they
are read from the seed where the store has none, and views link to them there), and
makes it active for a model that has none. Adopted versions are then ordinary versions:
verified (signature and every file's sha256) at a cold start, kept or pruned like any
other (pruning never touches the seed, which may be read-only). A blob the store fetches
later lives in the store; blobs the seed already holds are never downloaded again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ManifestTrustError, ModelSyncError
from edgefleet.files import write_private
from edgefleet.model_signing import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    blob_path,
    check_name,
    check_sha256,
    manifest_dir,
)
from models.errors import ModelsError
from models.manifest import ModelManifest, manifest_from_dict

log = logging.getLogger(__name__)

INSTALLED_FILE = "installed"
ACTIVE_FILE = "active.json"
SEEDED_FILE = "seeded.json"


def parse_manifest(data: bytes) -> ModelManifest:
    """The manifest in ``data``; ManifestTrustError when it is not a valid manifest."""
    try:
        return manifest_from_dict(json.loads(data))
    except (ValueError, ModelsError) as exc:
        raise ManifestTrustError(f"the manifest is not valid: {exc}") from exc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_bytes(path: Path, data: bytes) -> None:
    """``data`` at ``path`` by a temporary file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass(frozen=True)
class StoredVersion:
    """One version whose manifest is in the store (its blobs may not all be yet)."""

    name: str
    version: str
    manifest: bytes
    signature: bytes  # empty: unsigned
    installed_ns: int  # 0: not complete yet

    @property
    def parsed(self) -> ModelManifest:
        return parse_manifest(self.manifest)


class ModelStore:
    """The store rooted at ``root`` (created on first use)."""

    def __init__(
        self, root: Path, *, keep_versions: int = 2, max_bytes: int = 0, seed: Path | None = None
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be at least 1")
        self.root = root
        self.seed = seed  # a read-only signed model set (see the module docstring)
        self.keep_versions = keep_versions
        self.max_bytes = max_bytes  # 0: no budget
        for sub in ("blobs/sha256", "manifests", "views", "partial"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ blobs

    def blob(self, sha256: str) -> Path:
        return blob_path(self.root, sha256)

    def stored_blob(self, sha256: str) -> Path:
        """Where the blob's bytes are: the store's own, else the seed's (when it has it)."""
        own = self.blob(sha256)
        if self.seed is not None and not own.exists():
            seeded = blob_path(self.seed, sha256)
            if seeded.exists():
                return seeded
        return own

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        try:
            st = self.stored_blob(sha256).stat()
        except FileNotFoundError:
            return False
        return size is None or st.st_size == size

    def partial(self, sha256: str) -> Path:
        return self.root / "partial" / f"{check_sha256(sha256)}.part"

    def commit_partial(self, sha256: str) -> Path:
        """Move a verified ``.part`` into ``blobs/`` (already fsynced by the writer)."""
        target = self.blob(sha256)
        os.replace(self.partial(sha256), target)
        fsync_dir(target.parent)
        return target

    def blob_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.root / "blobs" / "sha256").iterdir())

    # -------------------------------------------------------------- manifests

    def put_manifest(self, name: str, version: str, manifest: bytes, signature: bytes) -> None:
        """Keep a (verified) manifest; the version is not installed until ``mark_installed``."""
        where = manifest_dir(self.root, name, version)
        write_atomic_bytes(where / MANIFEST_FILE, manifest)
        if signature:
            write_atomic_bytes(where / SIGNATURE_FILE, signature)
        else:
            (where / SIGNATURE_FILE).unlink(missing_ok=True)

    def mark_installed(self, name: str, version: str) -> None:
        write_atomic_bytes(
            manifest_dir(self.root, name, version) / INSTALLED_FILE,
            str(time.time_ns()).encode("ascii"),
        )

    def get(self, name: str, version: str) -> StoredVersion | None:
        where = manifest_dir(self.root, name, version)
        try:
            manifest = (where / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            return None
        try:
            signature = (where / SIGNATURE_FILE).read_bytes()
        except FileNotFoundError:
            signature = b""
        try:
            installed = int((where / INSTALLED_FILE).read_text("ascii").strip() or 0)
        except (FileNotFoundError, ValueError):
            installed = 0
        return StoredVersion(name, version, manifest, signature, installed)

    def versions(self, name: str | None = None) -> list[StoredVersion]:
        """Every stored version (of ``name``), newest install first."""
        found: list[StoredVersion] = []
        base = self.root / "manifests"
        names = [name] if name is not None else sorted(p.name for p in base.iterdir())
        for n in names:
            try:
                check_name("model name", n)
            except ValueError:
                continue
            directory = base / n
            if not directory.is_dir():
                continue
            for vdir in sorted(directory.iterdir()):
                try:
                    check_name("version", vdir.name)
                except ValueError:
                    continue
                stored = self.get(n, vdir.name)
                if stored is not None:
                    found.append(stored)
        return sorted(found, key=lambda s: s.installed_ns, reverse=True)

    def missing(self, manifest: ModelManifest) -> list[tuple[str, int]]:
        """(sha256, size) of the manifest's files not in the store yet."""
        seen: set[str] = set()
        out: list[tuple[str, int]] = []
        for entry in manifest.files:
            if entry.sha256 in seen or self.has_blob(entry.sha256, entry.size):
                continue
            seen.add(entry.sha256)
            out.append((entry.sha256, entry.size))
        return out

    def view(self, name: str, version: str, manifest_bytes: bytes) -> Path:
        """An artifact directory for the loader: the manifest and a hard link per file."""
        manifest = parse_manifest(manifest_bytes)
        where = (
            self.root / "views" / check_name("model name", name) / check_name("version", version)
        )
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        for entry in manifest.files:
            target = where / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            source = self.stored_blob(entry.sha256)
            if not source.exists():
                raise ModelSyncError(f"{name}@{version}: file {entry.path} is not in the store")
            try:
                os.link(source, target)
            except OSError:
                os.symlink(source, target)
        (where / MANIFEST_FILE).write_bytes(manifest_bytes)
        return where

    # ------------------------------------------------------------------- seed

    def adopt_seed(self) -> list[str]:
        """Adopt the seed's versions not adopted before (see the module docstring); returns
        them as ``name@version``. ModelSyncError when the seed is not a signed model set."""
        if self.seed is None:
            return []
        base = self.seed / "manifests"
        if not base.is_dir():
            raise ModelSyncError(
                f"models.seed_dir {self.seed} is not a signed model set (no manifests/ in it; "
                "write one with `python -m coordinator models export --out DIR`)"
            )
        try:
            done = set(json.loads((self.root / SEEDED_FILE).read_text("utf-8")))
        except (FileNotFoundError, ValueError, TypeError):
            done = set()
        adopted: list[str] = []
        active = self.active()
        for ndir in sorted(base.iterdir()):
            for vdir in sorted(ndir.iterdir()) if ndir.is_dir() else []:
                try:
                    name = check_name("model name", ndir.name)
                    version = check_name("version", vdir.name)
                    manifest = (vdir / MANIFEST_FILE).read_bytes()
                except (ValueError, OSError):
                    continue
                ref = f"{name}@{version}"
                if ref in done:
                    continue
                done.add(ref)
                if self.get(name, version) is not None:
                    continue  # the store has it already (synced before, or adopted and kept)
                try:
                    signature = (vdir / SIGNATURE_FILE).read_bytes()
                except FileNotFoundError:
                    signature = b""
                self.put_manifest(name, version, manifest, signature)
                try:
                    complete = not self.missing(parse_manifest(manifest))
                except ManifestTrustError as exc:
                    log.error("model seed: %s: %s", ref, exc)
                    complete = False
                if not complete:
                    log.error("model seed: %s lacks files; not installed", ref)
                    continue
                self.mark_installed(name, version)
                if name not in active:
                    self.set_active(name, version)
                    active[name] = version
                adopted.append(ref)
                log.info("model seed: adopted %s from %s", ref, self.seed)
        write_private(self.root / SEEDED_FILE, json.dumps(sorted(done)))
        return adopted

    # ----------------------------------------------------------------- active

    def active(self) -> dict[str, str]:
        try:
            raw = json.loads((self.root / ACTIVE_FILE).read_text("utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}

    def set_active(self, name: str, version: str | None) -> None:
        active = self.active()
        if version is None:
            active.pop(name, None)
        else:
            active[name] = version
        write_private(self.root / ACTIVE_FILE, json.dumps(active, sort_keys=True))

    # ------------------------------------------------------------------ prune

    def prune(self, keep: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        """Drop versions beyond the last ``keep_versions`` per model, then the oldest until
        the blobs fit ``max_bytes``; never those in ``keep`` or active. Returns the removed."""
        protected = set(keep) | set(self.active().items())
        removed: list[tuple[str, str]] = []
        versions = self.versions()
        per_name: dict[str, int] = {}
        survivors: list[StoredVersion] = []
        for v in versions:  # newest first
            if not v.installed_ns and (v.name, v.version) not in protected:
                survivors.append(v)  # being fetched: not ours to judge yet
                continue
            count = per_name.get(v.name, 0)
            if (v.name, v.version) in protected or count < self.keep_versions:
                per_name[v.name] = count + 1
                survivors.append(v)
            else:
                self._remove(v)
                removed.append((v.name, v.version))
        self._collect_blobs(survivors)
        if self.max_bytes:
            for v in reversed(list(survivors)):  # oldest first
                if self.blob_bytes() <= self.max_bytes:
                    break
                if (v.name, v.version) in protected or not v.installed_ns:
                    continue
                survivors.remove(v)
                self._remove(v)
                removed.append((v.name, v.version))
                self._collect_blobs(survivors)
        for name, version in removed:
            log.info("model store: removed %s@%s", name, version)
        return removed

    def _remove(self, v: StoredVersion) -> None:
        shutil.rmtree(manifest_dir(self.root, v.name, v.version), ignore_errors=True)
        shutil.rmtree(self.root / "views" / v.name / v.version, ignore_errors=True)

    def _collect_blobs(self, survivors: list[StoredVersion]) -> None:
        wanted: set[str] = set()
        for v in survivors:
            try:
                wanted.update(e.sha256 for e in v.parsed.files)
            except ManifestTrustError:
                continue
        for blob in (self.root / "blobs" / "sha256").iterdir():
            if blob.name not in wanted:
                blob.unlink(missing_ok=True)
