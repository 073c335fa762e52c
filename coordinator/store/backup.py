"""``python -m coordinator backup DIR`` / ``restore DIR``: the coordinator's whole state.

A backup holds the fleet database (copied by the store, ``FleetStore.backup_to``: SQLite's
online backup API, so it is consistent even while the coordinator runs and writes), the
CA (``ca/ca.pem`` and ``ca/ca.key``), the model-signing key (``model-signing.key``: agents
pinned its public key at enrollment, so a coordinator restored without it could not
serve them models), the model catalog's blob store (``models/blobs/``; blobs being
uploaded, ``models/tmp/``, are left out) and every other file under ``data_dir`` (keys
other features keep there), plus ``manifest.json`` (when, the schema version, each
file's sha256). The backup directory is created 0700 and private files stay 0600: it
holds the CA key.

Restore copies a backup into a data directory that has no database and no CA yet
(``--force`` replaces them), after checking every file against the manifest; run it
with the coordinator stopped. Agents enrolled before the backup reconnect to the
restored coordinator with their saved credentials: same CA, same records.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinator.catalog.catalog import MODELS_DIR, SIGNING_KEY_FILE, TMP_DIR
from coordinator.errors import StoreError
from coordinator.store.interface import FleetStore
from coordinator.store.offline import run_offline
from coordinator.store.sqlite import DB_FILE

MANIFEST = "manifest.json"
# The database and SQLite's side files: copied through the backup API, not as files.
_DB_FILES = frozenset({DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm", f"{DB_FILE}-journal"})


# Blobs still being written (coordinator.catalog.catalog): never complete, never restored.
_PARTIAL = (MODELS_DIR, TMP_DIR)


class BackupError(StoreError):
    """A backup or restore could not be made (the message says which file and why)."""


def backup(data_dir: Path, target: Path) -> dict[str, Any]:
    """Write a consistent backup of ``data_dir`` into ``target`` (new or empty)."""
    database = data_dir / DB_FILE
    if not database.exists():
        raise BackupError(f"no fleet database at {database}: is data_dir right?")
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"{target} is not empty; back up into a new directory")
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(target, 0o700)

    async def copy(store: FleetStore) -> int:
        return await store.backup_to(target / DB_FILE)

    try:
        # As the database is: migrating it is the coordinator's job, not the backup's.
        version = run_offline(data_dir, copy, migrate=False)
    except StoreError as exc:
        raise BackupError(f"cannot back up {data_dir} to {target}: {exc}") from exc
    try:
        os.chmod(target / DB_FILE, 0o600)
        for path in sorted(data_dir.rglob("*")):
            relative = path.relative_to(data_dir)
            if path.is_dir() or str(relative) in _DB_FILES or relative.parts[:2] == _PARTIAL:
                continue
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _copy_private(path, destination)
    except OSError as exc:
        raise BackupError(f"cannot back up {data_dir} to {target}: {exc}") from exc
    files = {
        str(p.relative_to(target)): _sha256(p)
        for p in sorted(target.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "object": "coordinator_backup",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_dir": str(data_dir),
        "schema_version": version,
        "files": files,
    }
    _write_private(target / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def restore(source: Path, data_dir: Path, *, force: bool = False) -> dict[str, Any]:
    """Copy the backup in ``source`` into ``data_dir``; refuses to overwrite unless ``force``."""
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text(encoding="utf-8"))
        files: dict[str, str] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{source} is not a coordinator backup ({MANIFEST}: {exc})") from exc
    for name, digest in files.items():
        path = source / name
        if not path.is_file() or _sha256(path) != digest:
            raise BackupError(f"backup file {path} is missing or changed since the backup")
    existing = [
        p for p in (data_dir / DB_FILE, data_dir / "ca", data_dir / SIGNING_KEY_FILE)
        if p.exists()
    ]  # fmt: skip
    if existing and not force:
        raise BackupError(
            f"{data_dir} already holds {', '.join(str(p) for p in existing)}; restore into an "
            "empty data directory, or pass --force to replace them"
        )
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in _DB_FILES:
            (data_dir / name).unlink(missing_ok=True)
        for name in files:
            destination = data_dir / name
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _copy_private(source / name, destination)
    except OSError as exc:
        raise BackupError(f"cannot restore {source} into {data_dir}: {exc}") from exc
    return manifest


def _copy_private(source: Path, destination: Path) -> None:
    """Copy a file via a temporary name (fsync, rename), 0600."""
    tmp = destination.with_name(f".{destination.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out, source.open("rb") as src:
        shutil.copyfileobj(src, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, destination)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
