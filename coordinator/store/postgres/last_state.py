"""Table ``agent_last_state`` in PostgreSQL: thousands of rows per snapshot, written as one
statement over arrays (times are POSIX seconds, each report a JSON list of values named
once per row: coordinator/store/report_json.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from coordinator.store.last_state import AgentLastState, last_state_from_row
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection
from coordinator.store.report_json import REPORT_FIELDS, report_to_json


class PostgresLastStates(PostgresTable):
    async def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        if states:
            await self._pool.call(_save_last_states, list(states), saved_at)

    async def list_last_states(self) -> list[AgentLastState]:
        return await self._pool.call(_list_last_states)


async def _save_last_states(
    db: Connection, states: list[AgentLastState], saved_at: datetime
) -> None:
    # Sorted by agent id: two snapshots written at once lock their rows in one order.
    states = sorted(states, key=lambda s: s.agent_id)
    await db.execute(
        "INSERT INTO agent_last_state (agent_id, liveness, last_seen, report_fields,"
        " report_json, saved_at) SELECT *, %s FROM unnest(%s::text[], %s::text[],"
        " %s::float8[], %s::text[], %s::text[]) ON CONFLICT (agent_id) DO UPDATE SET"
        " liveness = excluded.liveness, last_seen = excluded.last_seen,"
        " report_fields = excluded.report_fields, report_json = excluded.report_json,"
        " saved_at = excluded.saved_at",
        (
            saved_at.timestamp(),
            [s.agent_id for s in states],
            [s.liveness.value for s in states],
            [s.last_seen.timestamp() for s in states],
            [None if s.report is None else REPORT_FIELDS for s in states],
            [report_to_json(s.report) for s in states],
        ),
    )


async def _list_last_states(db: Connection) -> list[AgentLastState]:
    cursor = await db.execute('SELECT * FROM agent_last_state ORDER BY agent_id COLLATE "C"')
    return [last_state_from_row(row) for row in await cursor.fetchall()]
