"""Tables ``model_versions`` and ``model_files`` in SQLite."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from coordinator.store.catalog import CatalogVersion
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write


class SQLiteCatalog(SQLiteTable):
    async def add_model_version(self, version: CatalogVersion) -> None:
        files = [(version.name, version.version, f["path"], f["sha256"], f["size"])
                 for f in version.files()]  # fmt: skip
        await self._worker.call(_add_model_version, version, files)

    async def list_model_versions(self) -> list[CatalogVersion]:
        return await self._worker.call(_list_model_versions)

    async def set_model_deprecated(self, name: str, version: str, deprecated: bool) -> bool:
        return await self._worker.call(_set_model_deprecated, name, version, deprecated)

    async def delete_model_version(self, name: str, version: str) -> list[str]:
        return await self._worker.call(_delete_model_version, name, version)

    async def set_model_holder(
        self, name: str, version: str, coordinator_id: str, holds: bool
    ) -> bool:
        return await self._worker.call(_set_model_holder, name, version, coordinator_id, holds)

    async def list_model_holders(self) -> dict[tuple[str, str], list[str]]:
        return await self._worker.call(_list_model_holders)


def _add_model_version(
    db: sqlite3.Connection, v: CatalogVersion, files: list[tuple[str, str, str, str, int]]
) -> None:
    with write(db):
        db.execute(
            "INSERT INTO model_versions (name, version, task, manifest, signature, sha256, "
            "size_bytes, gate_passed, deprecated, published_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (v.name, v.version, v.task, v.manifest, v.signature, v.sha256, v.size_bytes,
             int(v.gate_passed), int(v.deprecated), v.published_at.isoformat()),
        )  # fmt: skip
        db.executemany(
            "INSERT INTO model_files (name, version, path, sha256, size) VALUES (?, ?, ?, ?, ?)",
            files,
        )


def _list_model_versions(db: sqlite3.Connection) -> list[CatalogVersion]:
    rows = db.execute("SELECT * FROM model_versions ORDER BY name, published_at")
    return [_version(r) for r in rows]


def _set_model_deprecated(
    db: sqlite3.Connection, name: str, version: str, deprecated: bool
) -> bool:
    with write(db):
        cursor = db.execute(
            "UPDATE model_versions SET deprecated = ? WHERE name = ? AND version = ?",
            (int(deprecated), name, version),
        )
        return cursor.rowcount == 1


def _delete_model_version(db: sqlite3.Connection, name: str, version: str) -> list[str]:
    with write(db):
        rows = db.execute(
            "SELECT DISTINCT sha256 FROM model_files WHERE name = ? AND version = ?",
            (name, version),
        ).fetchall()
        db.execute("DELETE FROM model_files WHERE name = ? AND version = ?", (name, version))
        db.execute("DELETE FROM model_holders WHERE name = ? AND version = ?", (name, version))
        db.execute("DELETE FROM model_versions WHERE name = ? AND version = ?", (name, version))
        still = "SELECT 1 FROM model_files WHERE sha256 = ? LIMIT 1"
        return [r[0] for r in rows if db.execute(still, (r[0],)).fetchone() is None]


def _set_model_holder(
    db: sqlite3.Connection, name: str, version: str, coordinator_id: str, holds: bool
) -> bool:
    with write(db):
        if not holds:
            db.execute(
                "DELETE FROM model_holders WHERE name = ? AND version = ? AND coordinator_id = ?",
                (name, version, coordinator_id),
            )
            return True
        cursor = db.execute(
            "INSERT INTO model_holders (name, version, coordinator_id, held_at)"
            " SELECT name, version, ?, (julianday('now') - 2440587.5) * 86400.0"
            " FROM model_versions"
            " WHERE name = ? AND version = ?"
            " ON CONFLICT (name, version, coordinator_id) DO UPDATE SET held_at = excluded.held_at",
            (coordinator_id, name, version),
        )
        return cursor.rowcount == 1


def _list_model_holders(db: sqlite3.Connection) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    rows = db.execute(
        "SELECT name, version, coordinator_id FROM model_holders"
        " ORDER BY name, version, coordinator_id"
    )
    for row in rows:
        found.setdefault((row[0], row[1]), []).append(row[2])
    return found


def _version(row: sqlite3.Row) -> CatalogVersion:
    return CatalogVersion(
        name=row["name"],
        version=row["version"],
        task=row["task"],
        manifest=bytes(row["manifest"]),
        signature=bytes(row["signature"]),
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        gate_passed=bool(row["gate_passed"]),
        deprecated=bool(row["deprecated"]),
        published_at=datetime.fromisoformat(row["published_at"]),
    )
