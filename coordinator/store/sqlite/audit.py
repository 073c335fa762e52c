"""Table ``audit_log`` in SQLite (append-only: its triggers refuse UPDATE and DELETE)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from coordinator.store.audit import AuditEntry
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write


class SQLiteAudit(SQLiteTable):
    async def append_audit(
        self,
        *,
        at: datetime,
        actor_id: str,
        actor_name: str,
        role: str,
        action: str,
        target: str,
        peer: str,
        outcome: str,
        status: int,
        detail: str,
    ) -> None:
        row = (at.astimezone(UTC).isoformat(timespec="microseconds"), actor_id, actor_name,
               role, action, target, peer, outcome, status, detail)  # fmt: skip
        await self._worker.call(_append, row)

    async def audit_entries(
        self, *, since: datetime | None, after_seq: int, limit: int
    ) -> list[AuditEntry]:
        since_text = "" if since is None else since.astimezone(UTC).isoformat()
        return await self._worker.call(_entries, since_text, after_seq, limit)


def _append(db: sqlite3.Connection, row: tuple[object, ...]) -> None:
    with write(db):
        db.execute(
            "INSERT INTO audit_log (at, actor_id, actor_name, role, action, target, peer,"
            " outcome, status, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )


def _entries(db: sqlite3.Connection, since: str, after_seq: int, limit: int) -> list[AuditEntry]:
    rows = db.execute(
        "SELECT * FROM audit_log WHERE seq > ? AND at >= ? ORDER BY seq LIMIT ?",
        (after_seq, since, limit),
    )
    return [AuditEntry(**{k: r[k] for k in r.keys()}) for r in rows]  # noqa: SIM118
