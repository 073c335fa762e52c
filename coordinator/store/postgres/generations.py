"""Table ``section_generations`` in PostgreSQL (one row: the last generation issued).

One statement: the row is locked while it is updated, so coordinators reserving at once
get blocks that never overlap."""

from __future__ import annotations

from coordinator.errors import StoreError
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection


class PostgresGenerations(PostgresTable):
    async def reserve_generations(self, count: int, at_least: int) -> int:
        return await self._pool.call(_reserve_generations, count, at_least)


async def _reserve_generations(db: Connection, count: int, at_least: int) -> int:
    cursor = await db.execute(
        "UPDATE section_generations"
        " SET issued_through = GREATEST(issued_through + 1, %s) + %s - 1 WHERE id = 1"
        " RETURNING issued_through - %s + 1 AS first",
        (at_least, count, count),
    )
    row = await cursor.fetchone()
    if row is None:
        raise StoreError("the section_generations row is missing")
    return int(row["first"])
