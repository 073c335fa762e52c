"""Table ``request_records`` in SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import astuple

from coordinator.store.request_records import RequestRecord
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write

#: The statement timeout of a prune (seconds): deleting a tenth of millions of rows may
#: rightly take longer than one ordinary call.
PRUNE_TIMEOUT_S = 120.0


class SQLiteRequestRecords(SQLiteTable):
    async def add_request_records(self, records: Sequence[RequestRecord]) -> int:
        if not records:
            return 0
        return await self._worker.call(_add, [astuple(r) for r in records])

    async def count_request_records(self) -> int:
        return await self._worker.call(_count)

    async def prune_request_records(self, count: int) -> int:
        return await self._worker.call_with_timeout(PRUNE_TIMEOUT_S, _prune, count)

    async def list_request_records(
        self, *, agent_id: str | None, after_seq: int, limit: int
    ) -> list[RequestRecord]:
        return await self._worker.call(_list, agent_id, after_seq, limit)


def _add(db: sqlite3.Connection, rows: list[tuple[object, ...]]) -> int:
    with write(db):
        before = db.total_changes
        db.executemany(
            "INSERT OR IGNORE INTO request_records (agent_id, seq, received_at, at, key_id,"
            " model, version, prompt_tokens, completion_tokens, latency_ms, ttft_ms,"
            " served_by, endpoint, status, dropped)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        return db.total_changes - before


def _count(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM request_records").fetchone()[0])


def _prune(db: sqlite3.Connection, count: int) -> int:
    with write(db):
        before = db.total_changes
        db.execute(
            "DELETE FROM request_records WHERE rowid IN (SELECT rowid FROM request_records"
            " ORDER BY received_at LIMIT ?)",
            (count,),
        )
        return db.total_changes - before


def _list(
    db: sqlite3.Connection, agent_id: str | None, after_seq: int, limit: int
) -> list[RequestRecord]:
    rows = db.execute(
        "SELECT * FROM request_records WHERE (? IS NULL OR agent_id = ?) AND seq > ?"
        " ORDER BY agent_id, seq LIMIT ?",
        (agent_id, agent_id, after_seq, limit),
    )
    return [RequestRecord(**{k: r[k] for k in r.keys()}) for r in rows]  # noqa: SIM118
