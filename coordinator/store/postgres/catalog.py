"""Tables ``model_versions`` and ``model_files`` in PostgreSQL."""

from __future__ import annotations

from typing import Any

from coordinator.store.catalog import CatalogVersion
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection

FileRow = tuple[str, str, str, str, int]


class PostgresCatalog(PostgresTable):
    async def add_model_version(self, version: CatalogVersion) -> None:
        files = [(version.name, version.version, f["path"], f["sha256"], f["size"])
                 for f in version.files()]  # fmt: skip
        await self._pool.call(_add_model_version, version, files)

    async def list_model_versions(self) -> list[CatalogVersion]:
        return await self._pool.call(_list_model_versions)

    async def set_model_deprecated(self, name: str, version: str, deprecated: bool) -> bool:
        return await self._pool.call(_set_model_deprecated, name, version, deprecated)

    async def delete_model_version(self, name: str, version: str) -> list[str]:
        return await self._pool.call(_delete_model_version, name, version)

    async def set_model_holder(
        self, name: str, version: str, coordinator_id: str, holds: bool
    ) -> bool:
        return await self._pool.call(_set_model_holder, name, version, coordinator_id, holds)

    async def list_model_holders(self) -> dict[tuple[str, str], list[str]]:
        return await self._pool.call(_list_model_holders)


async def _add_model_version(db: Connection, v: CatalogVersion, files: list[FileRow]) -> None:
    async with db.transaction():
        await db.execute(
            "INSERT INTO model_versions (name, version, task, manifest, signature, sha256,"
            " size_bytes, gate_passed, deprecated, published_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (v.name, v.version, v.task, v.manifest, v.signature, v.sha256, v.size_bytes,
             v.gate_passed, v.deprecated, v.published_at),
        )  # fmt: skip
        if files:
            await db.cursor().executemany(
                "INSERT INTO model_files (name, version, path, sha256, size)"
                " VALUES (%s, %s, %s, %s, %s)",
                files,
            )


async def _list_model_versions(db: Connection) -> list[CatalogVersion]:
    cursor = await db.execute(
        'SELECT * FROM model_versions ORDER BY name COLLATE "C", published_at'
    )
    return [_version(r) for r in await cursor.fetchall()]


async def _set_model_deprecated(db: Connection, name: str, version: str, deprecated: bool) -> bool:
    cursor = await db.execute(
        "UPDATE model_versions SET deprecated = %s WHERE name = %s AND version = %s",
        (deprecated, name, version),
    )
    return cursor.rowcount == 1


async def _delete_model_version(db: Connection, name: str, version: str) -> list[str]:
    async with db.transaction():
        cursor = await db.execute(
            "DELETE FROM model_files WHERE name = %s AND version = %s RETURNING sha256",
            (name, version),
        )
        gone = sorted({r["sha256"] for r in await cursor.fetchall()})
        await db.execute(
            "DELETE FROM model_holders WHERE name = %s AND version = %s", (name, version)
        )
        await db.execute(
            "DELETE FROM model_versions WHERE name = %s AND version = %s", (name, version)
        )
        if not gone:
            return []
        cursor = await db.execute(
            "SELECT DISTINCT sha256 FROM model_files WHERE sha256 = ANY(%s)", (gone,)
        )
        still = {r["sha256"] for r in await cursor.fetchall()}
    return [sha for sha in gone if sha not in still]


async def _set_model_holder(
    db: Connection, name: str, version: str, coordinator_id: str, holds: bool
) -> bool:
    if not holds:
        await db.execute(
            "DELETE FROM model_holders WHERE name = %s AND version = %s AND coordinator_id = %s",
            (name, version, coordinator_id),
        )
        return True
    # Only while the version exists (its row is share-locked by the foreign key's check).
    cursor = await db.execute(
        "INSERT INTO model_holders (name, version, coordinator_id, held_at)"
        " SELECT name, version, %s, now() FROM model_versions"
        " WHERE name = %s AND version = %s"
        " ON CONFLICT (name, version, coordinator_id) DO UPDATE SET held_at = excluded.held_at",
        (coordinator_id, name, version),
    )
    return cursor.rowcount == 1


async def _list_model_holders(db: Connection) -> dict[tuple[str, str], list[str]]:
    cursor = await db.execute(
        "SELECT name, version, coordinator_id FROM model_holders"
        ' ORDER BY name COLLATE "C", version COLLATE "C", coordinator_id COLLATE "C"'
    )
    found: dict[tuple[str, str], list[str]] = {}
    for row in await cursor.fetchall():
        found.setdefault((row["name"], row["version"]), []).append(row["coordinator_id"])
    return found


def _version(row: dict[str, Any]) -> CatalogVersion:
    return CatalogVersion(
        name=row["name"],
        version=row["version"],
        task=row["task"],
        manifest=bytes(row["manifest"]),
        signature=bytes(row["signature"]),
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        gate_passed=row["gate_passed"],
        deprecated=row["deprecated"],
        published_at=row["published_at"],
    )
