"""Table ``agent_last_state`` in PostgreSQL: thousands of rows per snapshot, written as one
statement over arrays (times are POSIX seconds, each report a JSON list of values named
once per row: coordinator/store/report_json.py).

It is also the coordinators' shared live view (coordinator/store/last_state.py). A save
takes a transaction-level advisory lock first, so saves commit in the order of the
versions they take (``live_states_after`` never skips a row committed late, as with the
change feed's appends), then reads the agents' owners ``FOR SHARE`` (a claim of one of
them waits for this save, and a claim committed before it is seen): a state is written
only while its writer still owns the agent at the state's epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from coordinator.store.last_state import (
    AgentLastState,
    last_state_from_row,
    stats_to_json,
    writable,
)
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection
from coordinator.store.report_json import REPORT_FIELDS, report_to_json

#: The advisory lock saves serialize on (any constant other locks do not use).
SAVE_LOCK = 0x45464C76  # "EFLv"


class PostgresLastStates(PostgresTable):
    async def save_last_states(
        self, states: Sequence[AgentLastState], saved_at: datetime, *, owner: str = ""
    ) -> list[str]:
        if not states:
            return []
        return await self._pool.call(_save_last_states, list(states), saved_at, owner)

    async def list_last_states(self) -> list[AgentLastState]:
        return await self._pool.call(_list_last_states)

    async def live_states_after(self, version: int, limit: int) -> list[AgentLastState]:
        return await self._pool.call(_after, version, limit)


async def _save_last_states(
    db: Connection, states: list[AgentLastState], saved_at: datetime, owner: str
) -> list[str]:
    # Sorted by agent id: two snapshots written at once lock their rows in one order.
    states = sorted(states, key=lambda s: s.agent_id)
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock(%s)", (SAVE_LOCK,))
        refused: list[str] = []
        if owner:
            cursor = await db.execute(
                "SELECT agent_id, coordinator_id, epoch FROM agent_owners"
                ' WHERE agent_id = ANY(%s) ORDER BY agent_id COLLATE "C" FOR SHARE',
                ([s.agent_id for s in states],),
            )
            owners = {
                r["agent_id"]: (r["coordinator_id"], int(r["epoch"]))
                for r in await cursor.fetchall()
            }
            states, refused = writable(states, owner, owners)
        if not states:
            return refused
        await db.execute(
            "INSERT INTO agent_last_state (agent_id, liveness, last_seen, report_fields,"
            " report_json, owner, epoch, stats_json, saved_at, version, written_at)"
            " SELECT *, %s, nextval('agent_last_state_version'),"
            " extract(epoch FROM clock_timestamp()) FROM unnest(%s::text[], %s::text[],"
            " %s::float8[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[])"
            " ON CONFLICT (agent_id) DO UPDATE SET"
            " liveness = excluded.liveness, last_seen = excluded.last_seen,"
            " report_fields = excluded.report_fields, report_json = excluded.report_json,"
            " saved_at = excluded.saved_at, owner = excluded.owner, epoch = excluded.epoch,"
            " stats_json = excluded.stats_json, version = excluded.version,"
            " written_at = excluded.written_at",
            (
                saved_at.timestamp(),
                [s.agent_id for s in states],
                [s.liveness.value for s in states],
                [s.last_seen.timestamp() for s in states],
                [None if s.report is None else REPORT_FIELDS for s in states],
                [report_to_json(s.report) for s in states],
                [owner or s.owner or None for s in states],
                [s.epoch for s in states],
                [stats_to_json(s.stats) for s in states],
            ),
        )
    return refused


async def _list_last_states(db: Connection) -> list[AgentLastState]:
    cursor = await db.execute('SELECT * FROM agent_last_state ORDER BY agent_id COLLATE "C"')
    return [last_state_from_row(row) for row in await cursor.fetchall()]


async def _after(db: Connection, version: int, limit: int) -> list[AgentLastState]:
    cursor = await db.execute(
        "SELECT * FROM agent_last_state WHERE version > %s ORDER BY version LIMIT %s",
        (version, limit),
    )
    return [last_state_from_row(row) for row in await cursor.fetchall()]
