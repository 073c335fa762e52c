"""Tables ``changes`` and ``dashboard_sessions`` in PostgreSQL (coordinator/store/changes.py).

An append takes a transaction-level advisory lock first, so appends commit in ``seq``
order and a reader never skips one committed late; its ``NOTIFY`` goes out at commit.
``wait_for_changes`` listens on a connection of its own (outside the pool), opened on
first use and again after it fails.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import psycopg

from coordinator.store.changes import CHANGES_CHANNEL, Change, DashboardSessionRecord
from coordinator.store.interface import StoreUnavailableError
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection

logger = logging.getLogger(__name__)

#: The advisory lock appends serialize on (any constant other locks do not use).
APPEND_LOCK = 0x45466368  # "EFch"


class PostgresChanges(PostgresTable):
    _listener: Connection | None = None

    async def append_change(self, kind: str, subject: str, detail: str, origin: str) -> int:
        return await self._pool.call(_append, kind, subject, detail, origin)

    async def changes_after(self, seq: int, limit: int) -> list[Change]:
        return await self._pool.call(_after, seq, limit)

    async def last_change_seq(self) -> int:
        return await self._pool.call(_last)

    async def prune_changes(self, older_than_s: float) -> int:
        return await self._pool.call(_prune, older_than_s)

    async def wait_for_changes(self, timeout_s: float) -> bool:
        listener = self._listener
        if listener is None or listener.closed:
            # held at once, so that close_listener() (the store's close) closes it even
            # when this task is cancelled during LISTEN (a coordinator stopping right after
            # its start): it was left open and garbage-collected open
            listener = self._listener = await self._pool.connect()
            try:
                await listener.execute(f"LISTEN {CHANGES_CHANNEL}")
            except psycopg.Error as exc:
                self._listener = None
                await listener.close()
                raise StoreUnavailableError(f"cannot listen for changes: {exc}") from exc
        try:
            async for _ in listener.notifies(timeout=timeout_s, stop_after=1):
                return True
            return False
        except psycopg.Error as exc:
            self._listener = None
            with contextlib.suppress(psycopg.Error):
                await listener.close()
            raise StoreUnavailableError(f"the change listener failed: {exc}") from exc

    async def close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(psycopg.Error):
                await listener.close()

    async def create_dashboard_session(
        self, session_hash: str, token_id: str, ttl_s: float
    ) -> DashboardSessionRecord:
        return await self._pool.call(_create_session, session_hash, token_id, ttl_s)

    async def get_dashboard_session(self, session_hash: str) -> DashboardSessionRecord | None:
        return await self._pool.call(_get_session, session_hash)

    async def delete_dashboard_session(self, session_hash: str) -> bool:
        return await self._pool.call(_delete_session, session_hash)

    async def delete_dashboard_sessions(self, *, token_id: str = "", expired: bool = False) -> int:
        return await self._pool.call(_delete_sessions, token_id, expired)

    async def count_dashboard_sessions(self) -> int:
        return await self._pool.call(_count_sessions)


async def _append(db: Connection, kind: str, subject: str, detail: str, origin: str) -> int:
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock(%s)", (APPEND_LOCK,))
        cursor = await db.execute(
            "INSERT INTO changes (kind, subject, detail, origin, at)"
            " VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING seq",
            (kind, subject, detail, origin),
        )
        row = await cursor.fetchone()
        assert row is not None
        seq = int(row["seq"])
        await db.execute("SELECT pg_notify(%s, %s)", (CHANGES_CHANNEL, str(seq)))
    return seq


async def _after(db: Connection, seq: int, limit: int) -> list[Change]:
    cursor = await db.execute(
        "SELECT * FROM changes WHERE seq > %s ORDER BY seq LIMIT %s", (seq, limit)
    )
    return [
        Change(int(r["seq"]), r["kind"], r["subject"], r["detail"], r["origin"], r["at"])
        for r in await cursor.fetchall()
    ]


async def _last(db: Connection) -> int:
    cursor = await db.execute("SELECT coalesce(max(seq), 0) AS seq FROM changes")
    row = await cursor.fetchone()
    return 0 if row is None else int(row["seq"])


async def _prune(db: Connection, older_than_s: float) -> int:
    cursor = await db.execute(
        "DELETE FROM changes WHERE at < clock_timestamp() - make_interval(secs => %s)",
        (older_than_s,),
    )
    return cursor.rowcount


def _session(r: dict[str, Any]) -> DashboardSessionRecord:
    return DashboardSessionRecord(
        r["session_hash"], r["token_id"], r["created_at"], r["expires_at"]
    )


async def _create_session(
    db: Connection, session_hash: str, token_id: str, ttl_s: float
) -> DashboardSessionRecord:
    cursor = await db.execute(
        "INSERT INTO dashboard_sessions (session_hash, token_id, created_at, expires_at)"
        " VALUES (%s, %s, clock_timestamp(), clock_timestamp() + make_interval(secs => %s))"
        " RETURNING *",
        (session_hash, token_id, ttl_s),
    )
    row = await cursor.fetchone()
    assert row is not None
    return _session(row)


async def _get_session(db: Connection, session_hash: str) -> DashboardSessionRecord | None:
    cursor = await db.execute(
        "SELECT * FROM dashboard_sessions WHERE session_hash = %s"
        " AND expires_at > clock_timestamp()",
        (session_hash,),
    )
    row = await cursor.fetchone()
    return None if row is None else _session(row)


async def _delete_session(db: Connection, session_hash: str) -> bool:
    cursor = await db.execute(
        "DELETE FROM dashboard_sessions WHERE session_hash = %s", (session_hash,)
    )
    return cursor.rowcount > 0


async def _delete_sessions(db: Connection, token_id: str, expired: bool) -> int:
    deleted = 0
    if token_id:
        cursor = await db.execute("DELETE FROM dashboard_sessions WHERE token_id = %s", (token_id,))
        deleted += cursor.rowcount
    if expired:
        cursor = await db.execute(
            "DELETE FROM dashboard_sessions WHERE expires_at <= clock_timestamp()"
        )
        deleted += cursor.rowcount
    return deleted


async def _count_sessions(db: Connection) -> int:
    cursor = await db.execute(
        "SELECT count(*) AS n FROM dashboard_sessions WHERE expires_at > clock_timestamp()"
    )
    row = await cursor.fetchone()
    return 0 if row is None else int(row["n"])
