"""Tables ``changes`` and ``dashboard_sessions`` in SQLite (coordinator/store/changes.py).

SQLite serves one coordinator: changes are appended and read like PostgreSQL's (the one
writer commits them in order) but there is nobody to notify, so ``wait_for_changes``
sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime

from coordinator.store.changes import Change, DashboardSessionRecord
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.membership import NOW
from coordinator.store.sqlite.worker import write


class SQLiteChanges(SQLiteTable):
    async def append_change(self, kind: str, subject: str, detail: str, origin: str) -> int:
        return await self._worker.call(_append, kind, subject, detail, origin)

    async def changes_after(self, seq: int, limit: int) -> list[Change]:
        return await self._worker.call(_after, seq, limit)

    async def last_change_seq(self) -> int:
        return await self._worker.call(_last)

    async def prune_changes(self, older_than_s: float) -> int:
        return await self._worker.call(_prune, older_than_s)

    async def wait_for_changes(self, timeout_s: float) -> bool:
        await asyncio.sleep(timeout_s)
        return False

    async def create_dashboard_session(
        self, session_hash: str, token_id: str, ttl_s: float
    ) -> DashboardSessionRecord:
        return await self._worker.call(_create_session, session_hash, token_id, ttl_s)

    async def get_dashboard_session(self, session_hash: str) -> DashboardSessionRecord | None:
        return await self._worker.call(_get_session, session_hash)

    async def delete_dashboard_session(self, session_hash: str) -> bool:
        return await self._worker.call(_delete_session, session_hash)

    async def delete_dashboard_sessions(self, *, token_id: str = "", expired: bool = False) -> int:
        return await self._worker.call(_delete_sessions, token_id, expired)

    async def count_dashboard_sessions(self) -> int:
        return await self._worker.call(_count_sessions)


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _append(db: sqlite3.Connection, kind: str, subject: str, detail: str, origin: str) -> int:
    with write(db):
        cursor = db.execute(
            f"INSERT INTO changes (kind, subject, detail, origin, at) VALUES (?, ?, ?, ?, {NOW})",
            (kind, subject, detail, origin),
        )
        return int(cursor.lastrowid or 0)


def _after(db: sqlite3.Connection, seq: int, limit: int) -> list[Change]:
    rows = db.execute("SELECT * FROM changes WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
    return [
        Change(r["seq"], r["kind"], r["subject"], r["detail"], r["origin"], _time(r["at"]))
        for r in rows
    ]


def _last(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT max(seq) AS seq FROM changes").fetchone()
    return int(row["seq"] or 0)


def _prune(db: sqlite3.Connection, older_than_s: float) -> int:
    with write(db):
        return db.execute(f"DELETE FROM changes WHERE at < {NOW} - ?", (older_than_s,)).rowcount


def _session(r: sqlite3.Row) -> DashboardSessionRecord:
    return DashboardSessionRecord(
        r["session_hash"], r["token_id"], _time(r["created_at"]), _time(r["expires_at"])
    )


def _create_session(
    db: sqlite3.Connection, session_hash: str, token_id: str, ttl_s: float
) -> DashboardSessionRecord:
    with write(db):
        row = db.execute(
            "INSERT INTO dashboard_sessions (session_hash, token_id, created_at, expires_at)"
            f" VALUES (?, ?, {NOW}, {NOW} + ?) RETURNING *",
            (session_hash, token_id, ttl_s),
        ).fetchone()
    return _session(row)


def _get_session(db: sqlite3.Connection, session_hash: str) -> DashboardSessionRecord | None:
    row = db.execute(
        f"SELECT * FROM dashboard_sessions WHERE session_hash = ? AND expires_at > {NOW}",
        (session_hash,),
    ).fetchone()
    return None if row is None else _session(row)


def _delete_session(db: sqlite3.Connection, session_hash: str) -> bool:
    with write(db):
        return (
            db.execute(
                "DELETE FROM dashboard_sessions WHERE session_hash = ?", (session_hash,)
            ).rowcount
            > 0
        )


def _delete_sessions(db: sqlite3.Connection, token_id: str, expired: bool) -> int:
    with write(db):
        deleted = 0
        if token_id:
            deleted += db.execute(
                "DELETE FROM dashboard_sessions WHERE token_id = ?", (token_id,)
            ).rowcount
        if expired:
            deleted += db.execute(
                f"DELETE FROM dashboard_sessions WHERE expires_at <= {NOW}"
            ).rowcount
        return deleted


def _count_sessions(db: sqlite3.Connection) -> int:
    row = db.execute(f"SELECT count(*) AS n FROM dashboard_sessions WHERE expires_at > {NOW}")
    return int(row.fetchone()["n"])
