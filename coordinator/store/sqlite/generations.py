"""Table ``section_generations`` in SQLite (one row: the last generation issued)."""

from __future__ import annotations

import sqlite3

from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write


class SQLiteGenerations(SQLiteTable):
    async def reserve_generations(self, count: int, at_least: int) -> int:
        return await self._worker.call(_reserve_generations, count, at_least)


def _reserve_generations(db: sqlite3.Connection, count: int, at_least: int) -> int:
    with write(db):
        (issued,) = db.execute(
            "SELECT issued_through FROM section_generations WHERE id = 1"
        ).fetchone()
        first = max(issued + 1, at_least)
        db.execute(
            "UPDATE section_generations SET issued_through = ? WHERE id = 1",
            (first + count - 1,),
        )
    return int(first)
