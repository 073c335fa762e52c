"""Table ``key_demand`` in SQLite (coordinator/store/key_demand.py): one coordinator, so
the others' sums are empty unless another process shares the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from coordinator.store.key_demand import COUNT_ROW, FleetDemand
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.membership import NOW
from coordinator.store.sqlite.worker import write


class SQLiteKeyDemand(SQLiteTable):
    async def save_key_demand(
        self, coordinator_id: str, agents: int, demand: Mapping[str, tuple[float, float]]
    ) -> None:
        await self._worker.call(_save, coordinator_id, agents, dict(demand))

    async def other_key_demand(self, coordinator_id: str, fresh_s: float) -> FleetDemand:
        return await self._worker.call(_others, coordinator_id, fresh_s)


def _save(
    db: sqlite3.Connection, coordinator_id: str, agents: int, demand: dict[str, tuple[float, float]]
) -> None:
    rows = [(coordinator_id, COUNT_ROW, agents, 0.0, 0.0)]
    rows += [(coordinator_id, k, 0, r, t) for k, (r, t) in demand.items() if k != COUNT_ROW]
    with write(db):
        db.execute("DELETE FROM key_demand WHERE coordinator_id = ?", (coordinator_id,))
        db.executemany(
            "INSERT INTO key_demand (coordinator_id, key_id, agents, request_rate, token_rate,"
            f" updated_at) VALUES (?, ?, ?, ?, ?, {NOW})",
            rows,
        )


def _others(db: sqlite3.Connection, coordinator_id: str, fresh_s: float) -> FleetDemand:
    rows = db.execute(
        "SELECT key_id, sum(agents) AS agents, sum(request_rate) AS r, sum(token_rate) AS t,"
        " count(*) AS n FROM key_demand"
        f" WHERE coordinator_id <> ? AND updated_at > {NOW} - ? GROUP BY key_id",
        (coordinator_id, fresh_s),
    ).fetchall()
    return _sums(rows)


def _sums(rows: list[sqlite3.Row]) -> FleetDemand:
    agents = coordinators = 0
    demand: dict[str, tuple[float, float]] = {}
    for row in rows:
        if row["key_id"] == COUNT_ROW:
            agents, coordinators = int(row["agents"]), int(row["n"])
        else:
            demand[row["key_id"]] = (float(row["r"]), float(row["t"]))
    return FleetDemand(agents, demand, coordinators)
