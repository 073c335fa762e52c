"""Table ``join_tokens`` in PostgreSQL."""

from __future__ import annotations

from typing import Any

from coordinator.store.join_tokens import JoinToken
from coordinator.store.postgres.base import PostgresTable, location_of
from coordinator.store.postgres.pool import Connection


class PostgresJoinTokens(PostgresTable):
    async def add_token(self, token: JoinToken) -> None:
        await self._pool.call(_add_token, token)

    async def get_token(self, token_id: str) -> JoinToken | None:
        return await self._pool.call(_get_token, token_id)

    async def list_tokens(self) -> list[JoinToken]:
        return await self._pool.call(_list_tokens)

    async def revoke_token(self, token_id: str) -> bool:
        return await self._pool.call(_revoke_token, token_id)


async def _add_token(db: Connection, token: JoinToken) -> None:
    location = token.location
    await db.execute(
        "INSERT INTO join_tokens (token_id, secret_sha256, created_at, expires_at, max_uses,"
        " uses, site, revoked, note, lat, lon, http_url)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (token.token_id, token.secret_sha256, token.created_at, token.expires_at,
         token.max_uses, token.uses, token.site, token.revoked, token.note,
         None if location is None else location.lat,
         None if location is None else location.lon, token.http_url),
    )  # fmt: skip


async def _get_token(db: Connection, token_id: str) -> JoinToken | None:
    cursor = await db.execute("SELECT * FROM join_tokens WHERE token_id = %s", (token_id,))
    row = await cursor.fetchone()
    return None if row is None else token_of(row)


async def _list_tokens(db: Connection) -> list[JoinToken]:
    cursor = await db.execute("SELECT * FROM join_tokens ORDER BY created_at, token_id")
    return [token_of(r) for r in await cursor.fetchall()]


async def _revoke_token(db: Connection, token_id: str) -> bool:
    cursor = await db.execute(
        "UPDATE join_tokens SET revoked = true WHERE token_id = %s", (token_id,)
    )
    return cursor.rowcount == 1


def token_of(row: dict[str, Any]) -> JoinToken:
    return JoinToken(
        token_id=row["token_id"],
        secret_sha256=row["secret_sha256"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        max_uses=row["max_uses"],
        uses=row["uses"],
        site=row["site"],
        revoked=row["revoked"],
        note=row["note"],
        location=location_of(row),
        http_url=row["http_url"],
    )
