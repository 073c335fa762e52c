"""Table ``admin_tokens`` in PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from coordinator.store.admin_tokens import AdminTokenRecord
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection


class PostgresAdminTokens(PostgresTable):
    async def add_admin_token(self, token: AdminTokenRecord) -> None:
        await self._pool.call(_add_admin_token, token)

    async def get_admin_token(self, token_id: str) -> AdminTokenRecord | None:
        return await self._pool.call(_get_admin_token, token_id)

    async def list_admin_tokens(self) -> list[AdminTokenRecord]:
        return await self._pool.call(_list_admin_tokens)

    async def revoke_admin_token(self, token_id: str, now: datetime) -> bool:
        return await self._pool.call(_revoke_admin_token, token_id, now)


async def _add_admin_token(db: Connection, token: AdminTokenRecord) -> None:
    await db.execute(
        "INSERT INTO admin_tokens (token_id, name, role, secret_sha256, created_at,"
        " created_by) VALUES (%s, %s, %s, %s, %s, %s)",
        (token.token_id, token.name, token.role, token.secret_sha256, token.created_at,
         token.created_by),
    )  # fmt: skip


async def _get_admin_token(db: Connection, token_id: str) -> AdminTokenRecord | None:
    cursor = await db.execute("SELECT * FROM admin_tokens WHERE token_id = %s", (token_id,))
    row = await cursor.fetchone()
    return None if row is None else _token(row)


async def _list_admin_tokens(db: Connection) -> list[AdminTokenRecord]:
    cursor = await db.execute("SELECT * FROM admin_tokens ORDER BY created_at, token_id")
    return [_token(r) for r in await cursor.fetchall()]


async def _revoke_admin_token(db: Connection, token_id: str, now: datetime) -> bool:
    # One statement: the row's own value decides, so a second revocation keeps the first time.
    cursor = await db.execute(
        "UPDATE admin_tokens SET revoked_at = COALESCE(revoked_at, %s) WHERE token_id = %s",
        (now, token_id),
    )
    return cursor.rowcount == 1


def _token(row: dict[str, Any]) -> AdminTokenRecord:
    return AdminTokenRecord(
        token_id=row["token_id"],
        name=row["name"],
        role=row["role"],
        secret_sha256=row["secret_sha256"],
        created_at=row["created_at"],
        created_by=row["created_by"],
        revoked_at=row["revoked_at"],
    )
