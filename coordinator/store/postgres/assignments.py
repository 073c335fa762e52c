"""Tables ``model_rules`` and ``model_assignments`` in PostgreSQL.

Replacing a rule is one transaction that deletes the old row and inserts the new one (the
next identity value: newer, larger), under a transaction-scoped advisory lock on the
(name, selector): racing replacements of one rule take turns, and the last one stays."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from coordinator.store.assignments import AssignmentRecord, RuleRecord
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection


class PostgresAssignments(PostgresTable):
    async def set_model_rule(
        self,
        name: str,
        selector: str,
        version: str,
        rollout_id: str,
        set_at: datetime,
        residency: str = "on_demand",
    ) -> int:
        return await self._pool.call(
            _set_rule, name, selector, version, rollout_id, set_at, residency
        )

    async def delete_model_rule(self, name: str, selector: str) -> None:
        await self._pool.call(_delete_rule, name, selector)

    async def list_model_rules(self) -> list[RuleRecord]:
        return await self._pool.call(_list_rules)

    async def set_model_assignments(self, assignments: Sequence[AssignmentRecord]) -> None:
        if assignments:
            await self._pool.call(_set_assignments, list(assignments))

    async def delete_model_assignments(self, agent_ids: Sequence[str], name: str) -> None:
        if agent_ids:
            await self._pool.call(_delete_assignments, list(agent_ids), name)

    async def list_model_assignments(self) -> list[AssignmentRecord]:
        return await self._pool.call(_list_assignments)


async def _set_rule(
    db: Connection,
    name: str,
    selector: str,
    version: str,
    rollout_id: str,
    set_at: datetime,
    residency: str,
) -> int:
    async with db.transaction():
        # Replacements of one (name, selector) take turns: delete, then insert the new row.
        await db.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s || chr(31) || %s, 0))",
            (name, selector),
        )
        await db.execute(
            "DELETE FROM model_rules WHERE name = %s AND selector = %s", (name, selector)
        )
        cursor = await db.execute(
            "INSERT INTO model_rules (name, selector, version, rollout_id, set_at, residency)"
            " VALUES (%s, %s, %s, %s, %s, %s) RETURNING seq",
            (name, selector, version, rollout_id, set_at, residency),
        )
        row = await cursor.fetchone()
    return 0 if row is None else int(row["seq"])


async def _delete_rule(db: Connection, name: str, selector: str) -> None:
    await db.execute("DELETE FROM model_rules WHERE name = %s AND selector = %s", (name, selector))


async def _list_rules(db: Connection) -> list[RuleRecord]:
    cursor = await db.execute("SELECT * FROM model_rules ORDER BY seq")
    return [
        RuleRecord(
            seq=r["seq"],
            name=r["name"],
            selector=r["selector"],
            version=r["version"],
            rollout_id=r["rollout_id"],
            set_at=r["set_at"],
            residency=r["residency"],
        )
        for r in await cursor.fetchall()
    ]


async def _set_assignments(db: Connection, assignments: list[AssignmentRecord]) -> None:
    rows = sorted(
        (a.agent_id, a.name, a.version, a.rollout_id, a.set_at, a.residency) for a in assignments
    )
    async with db.transaction():
        await db.cursor().executemany(
            "INSERT INTO model_assignments"
            " (agent_id, name, version, rollout_id, set_at, residency)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (agent_id, name) DO UPDATE SET"
            " version = excluded.version, rollout_id = excluded.rollout_id,"
            " set_at = excluded.set_at, residency = excluded.residency",
            rows,
        )


async def _delete_assignments(db: Connection, agent_ids: list[str], name: str) -> None:
    await db.execute(
        "DELETE FROM model_assignments WHERE agent_id = ANY(%s) AND name = %s",
        (agent_ids, name),
    )


async def _list_assignments(db: Connection) -> list[AssignmentRecord]:
    cursor = await db.execute("SELECT * FROM model_assignments")
    return [
        AssignmentRecord(
            agent_id=r["agent_id"],
            name=r["name"],
            version=r["version"],
            rollout_id=r["rollout_id"],
            set_at=r["set_at"],
            residency=r["residency"],
        )
        for r in await cursor.fetchall()
    ]
