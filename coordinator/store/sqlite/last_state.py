"""Table ``agent_last_state`` in SQLite: thousands of rows per snapshot, so times are POSIX
seconds and each load report a JSON list of values named once per row. One coordinator
uses a SQLite store: the shared live view's reads (``live_states_after``) are here for the
interface, and its writes fenced by ``agent_owners`` as on PostgreSQL."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from coordinator.store.last_state import (
    AgentLastState,
    last_state_from_row,
    stats_to_json,
    writable,
)
from coordinator.store.report_json import REPORT_FIELDS, report_to_json
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write

logger = logging.getLogger(__name__)

_NOW = "(julianday('now') - 2440587.5) * 86400.0"


class SQLiteLastStates(SQLiteTable):
    async def save_last_states(
        self, states: Sequence[AgentLastState], saved_at: datetime, *, owner: str = ""
    ) -> list[str]:
        if not states:
            return []
        return await self._worker.call(_save_last_states, list(states), saved_at, owner)

    async def list_last_states(self) -> list[AgentLastState]:
        return await self._worker.call(_list_last_states)

    async def live_states_after(self, version: int, limit: int) -> list[AgentLastState]:
        return await self._worker.call(_after, version, limit)


def _save_last_states(
    db: sqlite3.Connection, states: list[AgentLastState], saved_at: datetime, owner: str
) -> list[str]:
    saved, names = saved_at.timestamp(), REPORT_FIELDS
    with write(db):
        refused: list[str] = []
        if owner:
            ids = [s.agent_id for s in states]
            owners: dict[str, tuple[str, int]] = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for row in db.execute(
                    "SELECT agent_id, coordinator_id, epoch FROM agent_owners WHERE agent_id IN "
                    f"({','.join('?' * len(chunk))})",
                    chunk,
                ):
                    owners[row["agent_id"]] = (row["coordinator_id"], int(row["epoch"]))
            states, refused = writable(states, owner, owners)
        (top,) = db.execute("SELECT coalesce(max(version), 0) FROM agent_last_state").fetchone()
        rows = [
            (
                s.agent_id,
                s.liveness.value,
                s.last_seen.timestamp(),
                None if s.report is None else names,
                report_to_json(s.report),
                saved,
                owner or s.owner or None,
                s.epoch,
                top + i,
                stats_to_json(s.stats),
            )
            for i, s in enumerate(states, 1)
        ]
        db.executemany(
            "INSERT OR REPLACE INTO agent_last_state (agent_id, liveness, last_seen,"
            " report_fields, report_json, saved_at, owner, epoch, version, stats_json,"
            f" written_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {_NOW})",
            rows,
        )
    return refused


def _list_last_states(db: sqlite3.Connection) -> list[AgentLastState]:
    rows = db.execute("SELECT * FROM agent_last_state ORDER BY agent_id")
    return [last_state_from_row(row) for row in rows]


def _after(db: sqlite3.Connection, version: int, limit: int) -> list[AgentLastState]:
    rows = db.execute(
        "SELECT * FROM agent_last_state WHERE version > ? ORDER BY version LIMIT ?",
        (version, limit),
    )
    return [last_state_from_row(row) for row in rows]
