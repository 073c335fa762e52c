"""Table ``agent_last_state`` in SQLite: thousands of rows per snapshot, so times are POSIX
seconds and each load report a JSON list of values named once per row."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from coordinator.store.last_state import AgentLastState, last_state_from_row
from coordinator.store.report_json import REPORT_FIELDS, report_to_json
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write

logger = logging.getLogger(__name__)


class SQLiteLastStates(SQLiteTable):
    async def save_last_states(self, states: Sequence[AgentLastState], saved_at: datetime) -> None:
        if states:
            await self._worker.call(_save_last_states, list(states), saved_at)

    async def list_last_states(self) -> list[AgentLastState]:
        return await self._worker.call(_list_last_states)


def _save_last_states(
    db: sqlite3.Connection, states: list[AgentLastState], saved_at: datetime
) -> None:
    saved, names = saved_at.timestamp(), REPORT_FIELDS
    rows = [
        (
            s.agent_id,
            s.liveness.value,
            s.last_seen.timestamp(),
            None if s.report is None else names,
            report_to_json(s.report),
            saved,
        )
        for s in states
    ]
    with write(db):
        db.executemany("INSERT OR REPLACE INTO agent_last_state VALUES (?, ?, ?, ?, ?, ?)", rows)


def _list_last_states(db: sqlite3.Connection) -> list[AgentLastState]:
    rows = db.execute("SELECT * FROM agent_last_state ORDER BY agent_id")
    return [last_state_from_row(row) for row in rows]
