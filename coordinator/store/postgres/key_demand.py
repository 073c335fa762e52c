"""Table ``key_demand`` in PostgreSQL (coordinator/store/key_demand.py), by the server's
clock."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.store.key_demand import COUNT_ROW, FleetDemand
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection


class PostgresKeyDemand(PostgresTable):
    async def save_key_demand(
        self, coordinator_id: str, agents: int, demand: Mapping[str, tuple[float, float]]
    ) -> None:
        await self._pool.call(_save, coordinator_id, agents, dict(demand))

    async def other_key_demand(self, coordinator_id: str, fresh_s: float) -> FleetDemand:
        return await self._pool.call(_others, coordinator_id, fresh_s)


async def _save(
    db: Connection, coordinator_id: str, agents: int, demand: dict[str, tuple[float, float]]
) -> None:
    rows = [(coordinator_id, COUNT_ROW, agents, 0.0, 0.0)]
    rows += [(coordinator_id, k, 0, r, t) for k, (r, t) in demand.items() if k != COUNT_ROW]
    async with db.transaction():
        await db.execute("DELETE FROM key_demand WHERE coordinator_id = %s", (coordinator_id,))
        async with db.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO key_demand (coordinator_id, key_id, agents, request_rate,"
                " token_rate, updated_at) VALUES (%s, %s, %s, %s, %s, clock_timestamp())",
                rows,
            )


async def _others(db: Connection, coordinator_id: str, fresh_s: float) -> FleetDemand:
    cursor = await db.execute(
        "SELECT key_id, sum(agents) AS agents, sum(request_rate) AS r, sum(token_rate) AS t,"
        " count(*) AS n FROM key_demand WHERE coordinator_id <> %s"
        " AND updated_at > clock_timestamp() - make_interval(secs => %s) GROUP BY key_id",
        (coordinator_id, fresh_s),
    )
    agents = coordinators = 0
    demand: dict[str, tuple[float, float]] = {}
    for row in await cursor.fetchall():
        if row["key_id"] == COUNT_ROW:
            agents, coordinators = int(row["agents"]), int(row["n"])
        else:
            demand[row["key_id"]] = (float(row["r"]), float(row["t"]))
    return FleetDemand(agents, demand, coordinators)
