"""Table ``agent_owners`` in PostgreSQL (coordinator/store/ownership.py)."""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection


class PostgresOwnership(PostgresTable):
    async def claim_agent(self, agent_id: str, coordinator_id: str) -> int:
        return await self._pool.call(_claim, agent_id, coordinator_id)

    async def agent_owners(self, agent_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        return await self._pool.call(_owners, list(agent_ids))


async def _claim(db: Connection, agent_id: str, coordinator_id: str) -> int:
    cursor = await db.execute(
        "INSERT INTO agent_owners AS o (agent_id, coordinator_id, epoch, claimed_at)"
        " VALUES (%s, %s, 1, clock_timestamp()) ON CONFLICT (agent_id) DO UPDATE SET"
        " coordinator_id = excluded.coordinator_id, epoch = o.epoch + 1,"
        " claimed_at = excluded.claimed_at RETURNING epoch",
        (agent_id, coordinator_id),
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row["epoch"])


async def _owners(db: Connection, agent_ids: list[str]) -> dict[str, tuple[str, int]]:
    cursor = await db.execute(
        "SELECT agent_id, coordinator_id, epoch FROM agent_owners WHERE agent_id = ANY(%s)",
        (agent_ids,),
    )
    return {r["agent_id"]: (r["coordinator_id"], int(r["epoch"])) for r in await cursor.fetchall()}
