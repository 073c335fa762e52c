"""Table ``agent_owners`` in SQLite (coordinator/store/ownership.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.membership import NOW
from coordinator.store.sqlite.worker import write


class SQLiteOwnership(SQLiteTable):
    async def claim_agent(self, agent_id: str, coordinator_id: str) -> int:
        return await self._worker.call(_claim, agent_id, coordinator_id)

    async def agent_owners(self, agent_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        return await self._worker.call(_owners, list(agent_ids))


def _claim(db: sqlite3.Connection, agent_id: str, coordinator_id: str) -> int:
    with write(db):
        row = db.execute(
            "INSERT INTO agent_owners (agent_id, coordinator_id, epoch, claimed_at)"
            f" VALUES (?, ?, 1, {NOW}) ON CONFLICT (agent_id) DO UPDATE SET"
            " coordinator_id = excluded.coordinator_id, epoch = agent_owners.epoch + 1,"
            " claimed_at = excluded.claimed_at RETURNING epoch",
            (agent_id, coordinator_id),
        ).fetchone()
    return int(row["epoch"])


def _owners(db: sqlite3.Connection, agent_ids: list[str]) -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    for start in range(0, len(agent_ids), 500):
        chunk = agent_ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for row in db.execute(
            f"SELECT agent_id, coordinator_id, epoch FROM agent_owners WHERE agent_id IN ({marks})",
            chunk,
        ):
            found[row["agent_id"]] = (row["coordinator_id"], int(row["epoch"]))
    return found
