"""``python -m coordinator backup DIR`` / ``restore DIR``: the coordinator's whole state.

A backup holds the fleet database, the CA (``ca/ca.pem`` and ``ca/ca.key``), the
model-signing key (``model-signing.key``: agents pinned its public key at enrollment, so a
coordinator restored without it could not serve them models), the model catalog's blob
store (``models/blobs/``; blobs being uploaded, ``models/tmp/``, are left out) and every
other file under ``data_dir`` (keys other features keep there), plus ``manifest.json``
(when, the backend, the schema version, each file's sha256). The backup directory is
created 0700 and private files stay 0600: it holds the CA key.

The database, by backend (``StoreLocation``):

- SQLite: ``fleet.db``, copied by the store (``FleetStore.backup_to``: SQLite's online
  backup API, so it is consistent even while the coordinator runs and writes);
- PostgreSQL: ``fleet.pgdump``, pg_dump's custom format (coordinator/store/postgres/dump.py:
  one consistent snapshot, also while the coordinator runs; PostgreSQL's client programs
  must be installed, at least as new as the server).

Restore copies a backup into a data directory that has no database and no CA yet
(``--force`` replaces them), after checking every file against the manifest; run it
with the coordinator stopped. On PostgreSQL the database goes into the one ``store_url``
names, which must hold no tables (``--force``: the backup's tables replace the ones
there), in one transaction. A backup is restored onto the backend it was taken from (a
SQLite backup moves to PostgreSQL afterwards with ``store migrate``), and a backup whose
schema is newer than this coordinator's is refused. Agents enrolled before the backup
reconnect to the restored coordinator with their saved credentials: same CA, same records.

The desired-state generation counter: agents ignore a section older than one they hold,
and after the backup they may have been sent generations the restored database does not
know of. The counter never starts below the wall clock (coordinator/store/generations.py),
which covers those sent at the clock's pace; restore moves it further, by
``GENERATION_MARGIN_MS`` past the larger of the clock and what the backup had issued (as
migration 8 did), for those that ran ahead of the clock (a fresh database's counter starts
that far ahead, and a burst of pushes takes blocks faster than the clock moves).
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
from coordinator.store.generations import wall_clock_ms
from coordinator.store.interface import FleetStore
from coordinator.store.location import MARKER_NAME, StoreLocation
from coordinator.store.migrations import GENERATION_MARGIN_MS
from coordinator.store.migrations import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from coordinator.store.offline import run_offline
from coordinator.store.sqlite import DB_FILE

MANIFEST = "manifest.json"
# The database and SQLite's side files: copied through the backup API, not as files; and
# the record of which database a PostgreSQL installation uses (restore writes its own).
_DB_FILES = frozenset(
    {DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm", f"{DB_FILE}-journal", MARKER_NAME}
)
#: The PostgreSQL dump's name in a backup (coordinator/store/postgres/dump.py's DUMP_FILE).
PG_DUMP_FILE = "fleet.pgdump"


# Blobs still being written (coordinator.catalog.catalog): never complete, never restored.
_PARTIAL = (MODELS_DIR, TMP_DIR)


class BackupError(StoreError):
    """A backup or restore could not be made (the message says which file and why)."""


def _location(where: Path | StoreLocation) -> StoreLocation:
    return where if isinstance(where, StoreLocation) else StoreLocation(data_dir=where)


def backup(where: Path | StoreLocation, target: Path) -> dict[str, Any]:
    """Write a consistent backup of the installation ``where`` says (a data directory on
    SQLite, or a ``StoreLocation``) into ``target`` (new or empty)."""
    location = _location(where)
    data_dir = location.data_dir
    if not location.url and not (data_dir / DB_FILE).exists():
        raise BackupError(f"no fleet database at {data_dir / DB_FILE}: is data_dir right?")
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"{target} is not empty; back up into a new directory")
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(target, 0o700)
    database: dict[str, Any]
    if location.url:
        version, database = _dump_postgres(location, target)
    else:
        version, database = _copy_sqlite(data_dir, target), {"file": DB_FILE}
    try:
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
        "backend": location.backend,
        "schema_version": version,
        "database": database,
        "files": files,
    }
    _write_private(target / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def _copy_sqlite(data_dir: Path, target: Path) -> int:
    async def copy(store: FleetStore) -> int:
        return await store.backup_to(target / DB_FILE)

    try:
        # As the database is: migrating it is the coordinator's job, not the backup's.
        version = run_offline(data_dir, copy, migrate=False)
        os.chmod(target / DB_FILE, 0o600)
    except (StoreError, OSError) as exc:
        raise BackupError(f"cannot back up {data_dir} to {target}: {exc}") from exc
    return version


def _dump_postgres(location: StoreLocation, target: Path) -> tuple[int, dict[str, Any]]:
    from coordinator.store.postgres.dump import dump_database  # PostgreSQL in use: installed

    try:
        state, tool = dump_database(location.url, location.password, target / PG_DUMP_FILE)
    except StoreError as exc:
        raise BackupError(f"cannot back up the fleet database: {exc}") from exc
    return state.schema_version, {
        "file": PG_DUMP_FILE,
        "dumped_from": state.name,
        "server_version": state.server_version,
        "pg_dump_version": tool.version,
    }


def restore(source: Path, where: Path | StoreLocation, *, force: bool = False) -> dict[str, Any]:
    """Restore the backup in ``source`` into the installation ``where`` says (a data
    directory on SQLite, or a ``StoreLocation``); refuses to overwrite unless ``force``."""
    location = _location(where)
    data_dir = location.data_dir
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text(encoding="utf-8"))
        files: dict[str, str] = manifest["files"]
        backend = str(manifest.get("backend", "sqlite"))  # backups before PostgreSQL
        version = int(manifest["schema_version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{source} is not a coordinator backup ({MANIFEST}: {exc})") from exc
    _refuse_other_backend(backend, location, manifest)
    _refuse_newer_schema(backend, version)
    for name, digest in files.items():
        path = source / name
        if not path.is_file() or _sha256(path) != digest:
            raise BackupError(f"backup file {path} is missing or changed since the backup")
    kept = (data_dir / "ca", data_dir / SIGNING_KEY_FILE)
    existing = [p for p in ((data_dir / DB_FILE,) if not location.url else ()) + kept
                if p.exists()]  # fmt: skip
    if existing and not force:
        raise BackupError(
            f"{data_dir} already holds {', '.join(str(p) for p in existing)}; restore into an "
            "empty data directory, or pass --force to replace them"
        )
    if location.url:
        _restore_postgres(source, location, manifest, version, force)
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not location.url:
            for name in _DB_FILES - {MARKER_NAME}:
                (data_dir / name).unlink(missing_ok=True)
        for name in files:
            if location.url and name == PG_DUMP_FILE:
                continue  # restored into the database
            destination = data_dir / name
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _copy_private(source / name, destination)
        location.remember_backend()
    except OSError as exc:
        raise BackupError(f"cannot restore {source} into {data_dir}: {exc}") from exc
    _move_generations_on(location)
    return manifest


def _refuse_other_backend(backend: str, location: StoreLocation, manifest: dict[str, Any]) -> None:
    if backend == location.backend:
        return
    if backend == "postgresql":
        dumped_from = manifest.get("database", {}).get("dumped_from", "?")
        raise BackupError(
            f"this backup holds a PostgreSQL fleet database (dumped from {dumped_from}), and "
            "store_url is not set: set store_url (and its password) to the database to "
            "restore it into, a new, empty one"
        )
    raise BackupError(
        "this backup holds a SQLite fleet database, and store_url names PostgreSQL: restore "
        "it without store_url, then move it with `python -m coordinator store migrate` "
        "(docs/operators/postgresql.md)"
    )


def _schema_version_of(backend: str) -> int:
    if backend == "postgresql":
        from coordinator.store.postgres import SCHEMA_VERSION  # PostgreSQL in use

        return SCHEMA_VERSION
    return SQLITE_SCHEMA_VERSION


def _refuse_newer_schema(backend: str, version: int) -> None:
    ours = _schema_version_of(backend)
    if version > ours:
        raise BackupError(
            f"this backup's fleet database has schema version {version}, newer than this "
            f"coordinator's {ours}: restore it with a coordinator at least as new as the one "
            "that took it"
        )


def _restore_postgres(
    source: Path, location: StoreLocation, manifest: dict[str, Any], version: int, force: bool
) -> None:
    from coordinator.store.postgres.dump import restore_database  # PostgreSQL in use

    database = manifest.get("database", {})
    try:
        restore_database(
            location.url,
            location.password,
            source / str(database.get("file", PG_DUMP_FILE)),
            dumped_with=str(database.get("pg_dump_version", "0")),
            schema_version=version,
            replace=force,
        )
    except StoreError as exc:
        raise BackupError(f"cannot restore the fleet database: {exc}") from exc


def _move_generations_on(location: StoreLocation) -> None:
    """Start the desired-state generation counter past the clock by the margin: above any
    generation sent after the backup was taken (the module docstring)."""

    async def move_on(store: FleetStore) -> int:
        issued_through = await store.reserve_generations(1, 0)
        floor = max(issued_through, wall_clock_ms()) + GENERATION_MARGIN_MS
        return await store.reserve_generations(1, floor)

    try:
        run_offline(location, move_on)  # migrated to this version, as the coordinator would
    except StoreError as exc:
        raise BackupError(f"restored, but the database cannot be opened: {exc}") from exc


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
