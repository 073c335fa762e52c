"""Table ``audit_log`` in PostgreSQL (append-only: a trigger refuses UPDATE, DELETE and
TRUNCATE; coordinator/store/postgres/migrations.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from coordinator.store.audit import AuditEntry
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PostgresAudit(PostgresTable):
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
        row = (at, actor_id, actor_name, role, action, target, peer, outcome, status, detail)
        await self._pool.call(_append, row)

    async def audit_entries(
        self, *, since: datetime | None, after_seq: int, limit: int
    ) -> list[AuditEntry]:
        return await self._pool.call(_entries, since or _EPOCH, after_seq, limit)


async def _append(db: Connection, row: tuple[object, ...]) -> None:
    await db.execute(
        "INSERT INTO audit_log (at, actor_id, actor_name, role, action, target, peer,"
        " outcome, status, detail) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        row,
    )


async def _entries(db: Connection, since: datetime, after_seq: int, limit: int) -> list[AuditEntry]:
    cursor = await db.execute(
        "SELECT * FROM audit_log WHERE seq > %s AND at >= %s ORDER BY seq LIMIT %s",
        (after_seq, since, limit),
    )
    return [
        AuditEntry(**{**r, "at": r["at"].astimezone(UTC).isoformat(timespec="microseconds")})
        for r in await cursor.fetchall()
    ]
