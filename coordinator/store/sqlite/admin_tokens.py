"""Table ``admin_tokens`` in SQLite."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from coordinator.store.admin_tokens import AdminTokenRecord
from coordinator.store.sqlite.base import SQLiteTable, parse_time
from coordinator.store.sqlite.worker import write


class SQLiteAdminTokens(SQLiteTable):
    async def add_admin_token(self, token: AdminTokenRecord) -> None:
        await self._worker.call(_add_admin_token, token)

    async def get_admin_token(self, token_id: str) -> AdminTokenRecord | None:
        return await self._worker.call(_get_admin_token, token_id)

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        return await self._worker.call(_list_admin_tokens)

    async def revoke_admin_token(self, token_id: str, now: datetime) -> bool:
        return await self._worker.call(_revoke_admin_token, token_id, now)


def _add_admin_token(db: sqlite3.Connection, token: AdminTokenRecord) -> None:
    with write(db):
        db.execute(
            "INSERT INTO admin_tokens (token_id, name, role, secret_sha256, created_at,"
            " created_by) VALUES (?, ?, ?, ?, ?, ?)",
            (token.token_id, token.name, token.role, token.secret_sha256,
             token.created_at.isoformat(), token.created_by),
        )  # fmt: skip


def _get_admin_token(db: sqlite3.Connection, token_id: str) -> AdminTokenRecord | None:
    row = db.execute("SELECT * FROM admin_tokens WHERE token_id = ?", (token_id,)).fetchone()
    return None if row is None else _token(row)


def _list_admin_tokens(db: sqlite3.Connection) -> list[AdminTokenRecord]:
    rows = db.execute("SELECT * FROM admin_tokens ORDER BY created_at, token_id")
    return [_token(r) for r in rows]


def _revoke_admin_token(db: sqlite3.Connection, token_id: str, now: datetime) -> bool:
    with write(db):
        db.execute(
            "UPDATE admin_tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL",
            (now.isoformat(), token_id),
        )
        found = db.execute("SELECT 1 FROM admin_tokens WHERE token_id = ?", (token_id,))
        return found.fetchone() is not None


def _token(row: sqlite3.Row) -> AdminTokenRecord:
    return AdminTokenRecord(
        token_id=row["token_id"],
        name=row["name"],
        role=row["role"],
        secret_sha256=row["secret_sha256"],
        created_at=datetime.fromisoformat(row["created_at"]),
        created_by=row["created_by"],
        revoked_at=parse_time(row["revoked_at"]),
    )
