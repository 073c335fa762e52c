"""Tables ``coordinators`` and ``leases`` in SQLite (coordinator/store/membership.py).

SQLite serves one coordinator, so the list holds itself and the lease is always its own;
the same statements as PostgreSQL's, by SQLite's clock (``julianday('now')``: this
machine's, as POSIX seconds). A fenced write checks its fence inside its write transaction
(``check_fence``): the write lock it holds from ``BEGIN IMMEDIATE`` keeps any takeover out
until it commits.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from coordinator.store.membership import (
    CoordinatorMember,
    LeaseFence,
    LeaseLostError,
    LeaseState,
)
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write

#: The database's clock, POSIX seconds (with milliseconds).
NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class SQLiteMembership(SQLiteTable):
    async def heartbeat_member(self, member: CoordinatorMember, dead_after_s: float) -> bool:
        return await self._worker.call(_heartbeat, member, dead_after_s)

    async def list_members(self, dead_after_s: float) -> list[CoordinatorMember]:
        return await self._worker.call(_list_members, dead_after_s)

    async def remove_member(self, coordinator_id: str, incarnation: str) -> None:
        await self._worker.call(_remove_member, coordinator_id, incarnation)

    async def acquire_lease(
        self, name: str, holder: str, incarnation: str, duration_s: float
    ) -> LeaseState:
        return await self._worker.call(_acquire, name, holder, incarnation, duration_s)

    async def release_lease(self, fence: LeaseFence) -> None:
        await self._worker.call(_release, fence)

    async def lease_valid(self, fence: LeaseFence) -> bool:
        return await self._worker.call(_valid, fence)


def check_fence(db: sqlite3.Connection, fence: LeaseFence) -> None:
    """Inside a write transaction: LeaseLostError unless ``fence`` holds now."""
    if not _holds(db, fence):
        raise LeaseLostError(
            f"lease {fence.name!r} is no longer held by {fence.holder} at epoch {fence.epoch}"
        )


def _holds(db: sqlite3.Connection, fence: LeaseFence) -> bool:
    row = db.execute(
        f"SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > {NOW}",
        (fence.name, fence.holder, fence.epoch),
    ).fetchone()
    return row is not None


def _heartbeat(db: sqlite3.Connection, m: CoordinatorMember, dead_after_s: float) -> bool:
    with write(db):
        cursor = db.execute(
            "INSERT INTO coordinators (coordinator_id, incarnation, grpc_address, http_address,"
            f" version, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?, {NOW}, {NOW})"
            " ON CONFLICT (coordinator_id) DO UPDATE SET incarnation = excluded.incarnation,"
            " grpc_address = excluded.grpc_address, http_address = excluded.http_address,"
            " version = excluded.version, heartbeat_at = excluded.heartbeat_at,"
            " started_at = CASE WHEN coordinators.incarnation = excluded.incarnation"
            "  THEN coordinators.started_at ELSE excluded.started_at END"
            " WHERE coordinators.incarnation = excluded.incarnation"
            f" OR coordinators.heartbeat_at <= {NOW} - ?",
            (m.coordinator_id, m.incarnation, m.grpc_address, m.http_address, m.version,
             dead_after_s),
        )  # fmt: skip
        return cursor.rowcount == 1


def _list_members(db: sqlite3.Connection, dead_after_s: float) -> list[CoordinatorMember]:
    rows = db.execute(
        f"SELECT *, heartbeat_at > {NOW} - ? AS alive FROM coordinators ORDER BY coordinator_id",
        (dead_after_s,),
    )
    return [
        CoordinatorMember(
            coordinator_id=r["coordinator_id"],
            incarnation=r["incarnation"],
            grpc_address=r["grpc_address"],
            http_address=r["http_address"],
            version=r["version"],
            started_at=datetime.fromtimestamp(r["started_at"], UTC),
            heartbeat_at=datetime.fromtimestamp(r["heartbeat_at"], UTC),
            alive=bool(r["alive"]),
        )
        for r in rows
    ]


def _remove_member(db: sqlite3.Connection, coordinator_id: str, incarnation: str) -> None:
    with write(db):
        db.execute(
            "DELETE FROM coordinators WHERE coordinator_id = ? AND incarnation = ?",
            (coordinator_id, incarnation),
        )


def _acquire(
    db: sqlite3.Connection, name: str, holder: str, incarnation: str, duration_s: float
) -> LeaseState:
    renewal = f"l.holder = ? AND l.incarnation = ? AND l.expires_at > {NOW}"
    with write(db):
        row = db.execute(
            "INSERT INTO leases AS l (name, holder, incarnation, epoch, acquired_at, expires_at)"
            f" VALUES (?, ?, ?, 1, {NOW}, {NOW} + ?)"
            " ON CONFLICT (name) DO UPDATE SET"
            f"  epoch = CASE WHEN {renewal} THEN l.epoch ELSE l.epoch + 1 END,"
            f"  acquired_at = CASE WHEN {renewal} THEN l.acquired_at ELSE {NOW} END,"
            "  holder = excluded.holder, incarnation = excluded.incarnation,"
            "  expires_at = excluded.expires_at"
            f" WHERE l.expires_at <= {NOW} OR (l.holder = ? AND l.incarnation = ?)"
            f" RETURNING epoch, expires_at - {NOW} AS remaining_s",
            (name, holder, incarnation, duration_s, holder, incarnation, holder, incarnation,
             holder, incarnation),
        ).fetchone()  # fmt: skip
        if row is not None:
            return LeaseState(name, holder, int(row["epoch"]), True, float(row["remaining_s"]))
        row = db.execute(
            f"SELECT holder, epoch, expires_at - {NOW} AS remaining_s FROM leases WHERE name = ?",
            (name,),
        ).fetchone()
    if row is None:
        return LeaseState(name, "", 0, False, 0.0)
    return LeaseState(name, row["holder"], int(row["epoch"]), False, float(row["remaining_s"]))


def _release(db: sqlite3.Connection, fence: LeaseFence) -> None:
    with write(db):
        db.execute(
            f"UPDATE leases SET expires_at = {NOW} WHERE name = ? AND holder = ? AND epoch = ?"
            f" AND expires_at > {NOW}",
            (fence.name, fence.holder, fence.epoch),
        )


def _valid(db: sqlite3.Connection, fence: LeaseFence) -> bool:
    return _holds(db, fence)
