"""Tables ``coordinators`` and ``leases`` in PostgreSQL, by the server's clock
(``clock_timestamp()``): coordinator/store/membership.py says what they are for.

``FENCE_HOLDS`` is the fencing check a leader's write puts in its own statement's
``WHERE`` (with ``fence_params``): the lease row is read ``FOR SHARE``, so a takeover
(an ``UPDATE`` of that row) waits until the fenced write commits, and a fenced write that
comes after a takeover re-reads the new row (READ COMMITTED's re-check of a locked row)
and finds another holder or epoch.
"""

from __future__ import annotations

from coordinator.store.membership import CoordinatorMember, LeaseFence, LeaseState
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection

#: ``WHERE`` clause of a fenced write; its parameters: ``fence_params(fence)``.
FENCE_HOLDS = (
    "EXISTS (SELECT 1 FROM leases WHERE name = %s AND holder = %s AND epoch = %s"
    " AND expires_at > clock_timestamp() FOR SHARE)"
)


def fence_params(fence: LeaseFence) -> tuple[str, str, int]:
    return (fence.name, fence.holder, fence.epoch)


class PostgresMembership(PostgresTable):
    async def heartbeat_member(self, member: CoordinatorMember, dead_after_s: float) -> bool:
        return await self._pool.call(_heartbeat, member, dead_after_s)

    async def list_members(self, dead_after_s: float) -> list[CoordinatorMember]:
        return await self._pool.call(_list_members, dead_after_s)

    async def remove_member(self, coordinator_id: str, incarnation: str) -> None:
        await self._pool.call(_remove_member, coordinator_id, incarnation)

    async def acquire_lease(
        self, name: str, holder: str, incarnation: str, duration_s: float
    ) -> LeaseState:
        return await self._pool.call(_acquire, name, holder, incarnation, duration_s)

    async def release_lease(self, fence: LeaseFence) -> None:
        await self._pool.call(_release, fence)

    async def lease_valid(self, fence: LeaseFence) -> bool:
        return await self._pool.call(_valid, fence)


async def _heartbeat(db: Connection, m: CoordinatorMember, dead_after_s: float) -> bool:
    cursor = await db.execute(
        "INSERT INTO coordinators (coordinator_id, incarnation, grpc_address, http_address,"
        " version, started_at, heartbeat_at)"
        " VALUES (%s, %s, %s, %s, %s, clock_timestamp(), clock_timestamp())"
        " ON CONFLICT (coordinator_id) DO UPDATE SET incarnation = excluded.incarnation,"
        " grpc_address = excluded.grpc_address, http_address = excluded.http_address,"
        " version = excluded.version, heartbeat_at = excluded.heartbeat_at,"
        " started_at = CASE WHEN coordinators.incarnation = excluded.incarnation"
        "  THEN coordinators.started_at ELSE excluded.started_at END"
        " WHERE coordinators.incarnation = excluded.incarnation"
        " OR coordinators.heartbeat_at <= clock_timestamp() - make_interval(secs => %s)",
        (m.coordinator_id, m.incarnation, m.grpc_address, m.http_address, m.version,
         dead_after_s),
    )  # fmt: skip
    return cursor.rowcount == 1


async def _list_members(db: Connection, dead_after_s: float) -> list[CoordinatorMember]:
    cursor = await db.execute(
        "SELECT *, heartbeat_at > clock_timestamp() - make_interval(secs => %s) AS alive"
        " FROM coordinators ORDER BY coordinator_id",
        (dead_after_s,),
    )
    return [
        CoordinatorMember(
            coordinator_id=r["coordinator_id"],
            incarnation=r["incarnation"],
            grpc_address=r["grpc_address"],
            http_address=r["http_address"],
            version=r["version"],
            started_at=r["started_at"],
            heartbeat_at=r["heartbeat_at"],
            alive=bool(r["alive"]),
        )
        for r in await cursor.fetchall()
    ]


async def _remove_member(db: Connection, coordinator_id: str, incarnation: str) -> None:
    await db.execute(
        "DELETE FROM coordinators WHERE coordinator_id = %s AND incarnation = %s",
        (coordinator_id, incarnation),
    )


async def _acquire(
    db: Connection, name: str, holder: str, incarnation: str, duration_s: float
) -> LeaseState:
    # Renewal: same holder and process, unexpired (epoch kept). Takeover: expired (epoch
    # + 1, whoever takes it, the last holder too: its writes at the old epoch are refused).
    cursor = await db.execute(
        "INSERT INTO leases AS l (name, holder, incarnation, epoch, acquired_at, expires_at)"
        " VALUES (%(name)s, %(holder)s, %(inc)s, 1, clock_timestamp(),"
        "  clock_timestamp() + make_interval(secs => %(s)s))"
        " ON CONFLICT (name) DO UPDATE SET"
        "  epoch = CASE WHEN l.holder = excluded.holder AND l.incarnation = excluded.incarnation"
        "   AND l.expires_at > clock_timestamp() THEN l.epoch ELSE l.epoch + 1 END,"
        "  acquired_at = CASE WHEN l.holder = excluded.holder"
        "   AND l.incarnation = excluded.incarnation AND l.expires_at > clock_timestamp()"
        "   THEN l.acquired_at ELSE clock_timestamp() END,"
        "  holder = excluded.holder, incarnation = excluded.incarnation,"
        "  expires_at = excluded.expires_at"
        " WHERE l.expires_at <= clock_timestamp()"
        "  OR (l.holder = excluded.holder AND l.incarnation = excluded.incarnation)"
        " RETURNING epoch, extract(epoch FROM expires_at - clock_timestamp()) AS remaining_s",
        {"name": name, "holder": holder, "inc": incarnation, "s": duration_s},
    )
    row = await cursor.fetchone()
    if row is not None:
        return LeaseState(name, holder, int(row["epoch"]), True, float(row["remaining_s"]))
    cursor = await db.execute(
        "SELECT holder, epoch, extract(epoch FROM expires_at - clock_timestamp()) AS remaining_s"
        " FROM leases WHERE name = %s",
        (name,),
    )
    row = await cursor.fetchone()
    if row is None:  # deleted meanwhile (never by the coordinator): nobody holds it
        return LeaseState(name, "", 0, False, 0.0)
    return LeaseState(name, row["holder"], int(row["epoch"]), False, float(row["remaining_s"]))


async def _release(db: Connection, fence: LeaseFence) -> None:
    await db.execute(
        "UPDATE leases SET expires_at = clock_timestamp()"
        " WHERE name = %s AND holder = %s AND epoch = %s AND expires_at > clock_timestamp()",
        fence_params(fence),
    )


async def _valid(db: Connection, fence: LeaseFence) -> bool:
    cursor = await db.execute(f"SELECT {FENCE_HOLDS} AS holds", fence_params(fence))
    row = await cursor.fetchone()
    return row is not None and bool(row["holds"])
