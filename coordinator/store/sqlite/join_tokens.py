"""Table ``join_tokens`` in SQLite."""

from __future__ import annotations

import sqlite3

from coordinator.errors import StoreError
from coordinator.store.join_tokens import JoinToken
from coordinator.store.sqlite.base import SQLiteTable, parse_time, text
from coordinator.store.sqlite.worker import write
from edgefleet.contract import Location


class SQLiteJoinTokens(SQLiteTable):
    async def add_token(self, token: JoinToken) -> None:
        await self._worker.call(_add_token, token)

    async def get_token(self, token_id: str) -> JoinToken | None:
        return await self._worker.call(_get_token, token_id)

    async def list_tokens(self) -> list[JoinToken]:
        return await self._worker.call(_list_tokens)

    async def revoke_token(self, token_id: str) -> bool:
        return await self._worker.call(_revoke_token, token_id)


def _add_token(db: sqlite3.Connection, token: JoinToken) -> None:
    with write(db):
        db.execute(
            "INSERT INTO join_tokens (token_id, secret_sha256, created_at, expires_at, "
            "max_uses, uses, site, revoked, note, lat, lon, http_url) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                token.token_id,
                token.secret_sha256,
                text(token.created_at),
                text(token.expires_at),
                token.max_uses,
                token.uses,
                token.site,
                int(token.revoked),
                token.note,
                None if token.location is None else token.location.lat,
                None if token.location is None else token.location.lon,
                token.http_url,
            ),
        )


def _get_token(db: sqlite3.Connection, token_id: str) -> JoinToken | None:
    row = db.execute("SELECT * FROM join_tokens WHERE token_id = ?", (token_id,)).fetchone()
    return None if row is None else token_of(row)


def _list_tokens(db: sqlite3.Connection) -> list[JoinToken]:
    return [token_of(r) for r in db.execute("SELECT * FROM join_tokens ORDER BY created_at")]


def _revoke_token(db: sqlite3.Connection, token_id: str) -> bool:
    with write(db):
        cursor = db.execute("UPDATE join_tokens SET revoked = 1 WHERE token_id = ?", (token_id,))
        return cursor.rowcount == 1


def token_of(row: sqlite3.Row) -> JoinToken:
    created = parse_time(row["created_at"])
    if created is None:
        raise StoreError(f"join token {row['token_id']} has no creation time")
    return JoinToken(
        token_id=row["token_id"],
        secret_sha256=row["secret_sha256"],
        created_at=created,
        expires_at=parse_time(row["expires_at"]),
        max_uses=row["max_uses"],
        uses=row["uses"],
        site=row["site"],
        revoked=bool(row["revoked"]),
        note=row["note"],
        location=location_of(row),
        http_url=row["http_url"],
    )


def location_of(row: sqlite3.Row) -> Location | None:
    """The lat/lon columns (of join_tokens and agents)."""
    if row["lat"] is None or row["lon"] is None:
        return None
    return Location(lat=row["lat"], lon=row["lon"])
