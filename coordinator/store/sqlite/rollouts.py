"""Table ``rollouts`` in SQLite: a JSON body per rollout."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from coordinator.store.membership import LeaseFence
from coordinator.store.rollouts import StoredRollout, rollout_from_row
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.membership import check_fence
from coordinator.store.sqlite.worker import write


class SQLiteRollouts(SQLiteTable):
    async def save_rollout(
        self, rollout: StoredRollout, *, fence: LeaseFence | None = None
    ) -> None:
        await self._worker.call(_save, rollout, fence)

    async def get_rollout(self, rollout_id: str) -> StoredRollout | None:
        return await self._worker.call(_get, rollout_id)

    async def list_rollouts(self, *, states: Sequence[str], limit: int) -> list[StoredRollout]:
        return await self._worker.call(_list, list(states), limit)

    async def count_rollouts_by_state(self) -> dict[str, int]:
        return await self._worker.call(_counts)


def _save(db: sqlite3.Connection, r: StoredRollout, fence: LeaseFence | None) -> None:
    body = json.dumps(r.body, separators=(",", ":"))
    with write(db):
        if fence is not None:
            check_fence(db, fence)  # under the write lock: no takeover in between
        db.execute(
            "INSERT INTO rollouts (rollout_id, model, version, state, created_at, "
            "updated_at, body_json) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(rollout_id) DO UPDATE SET state = excluded.state, "
            "updated_at = excluded.updated_at, body_json = excluded.body_json",
            (r.rollout_id, r.model, r.version, r.state, r.created_at, r.updated_at, body),
        )


def _get(db: sqlite3.Connection, rollout_id: str) -> StoredRollout | None:
    row = db.execute("SELECT * FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    return None if row is None else rollout_from_row(row)


def _list(db: sqlite3.Connection, states: list[str], limit: int) -> list[StoredRollout]:
    if states:
        marks = ",".join("?" * len(states))
        rows = db.execute(
            f"SELECT * FROM rollouts WHERE state IN ({marks}) ORDER BY created_at DESC LIMIT ?",
            (*states, limit),
        )
    else:
        rows = db.execute("SELECT * FROM rollouts ORDER BY created_at DESC LIMIT ?", (limit,))
    return [rollout_from_row(r) for r in rows]


def _counts(db: sqlite3.Connection) -> dict[str, int]:
    rows = db.execute("SELECT state, COUNT(*) AS n FROM rollouts GROUP BY state")
    return {r["state"]: int(r["n"]) for r in rows}
