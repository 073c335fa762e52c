"""Tables ``model_rules`` and ``model_assignments`` in SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from coordinator.store.assignments import AssignmentRecord, RuleRecord
from coordinator.store.sqlite.base import SQLiteTable
from coordinator.store.sqlite.worker import write


class SQLiteAssignments(SQLiteTable):
    async def set_model_rule(
        self,
        name: str,
        selector: str,
        version: str,
        rollout_id: str,
        set_at: datetime,
        residency: str = "on_demand",
    ) -> int:
        return await self._worker.call(
            _set_rule, name, selector, version, rollout_id, set_at, residency
        )

    async def delete_model_rule(self, name: str, selector: str) -> None:
        await self._worker.call(_delete_rule, name, selector)

    async def list_model_rules(self) -> list[RuleRecord]:
        return await self._worker.call(_list_rules)

    async def set_model_assignments(self, assignments: Sequence[AssignmentRecord]) -> None:
        if assignments:
            await self._worker.call(_set_assignments, list(assignments))

    async def delete_model_assignments(self, agent_ids: Sequence[str], name: str) -> None:
        if agent_ids:
            await self._worker.call(_delete_assignments, list(agent_ids), name)

    async def list_model_assignments(self) -> list[AssignmentRecord]:
        return await self._worker.call(_list_assignments)


def _set_rule(
    db: sqlite3.Connection, name: str, selector: str, version: str, rollout_id: str,
    set_at: datetime, residency: str,
) -> int:  # fmt: skip
    with write(db):
        db.execute("DELETE FROM model_rules WHERE name = ? AND selector = ?", (name, selector))
        cursor = db.execute(
            "INSERT INTO model_rules (name, selector, version, rollout_id, set_at, residency) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (name, selector, version, rollout_id, set_at.isoformat(), residency),
        )
        return int(cursor.lastrowid or 0)


def _delete_rule(db: sqlite3.Connection, name: str, selector: str) -> None:
    with write(db):
        db.execute("DELETE FROM model_rules WHERE name = ? AND selector = ?", (name, selector))


def _list_rules(db: sqlite3.Connection) -> list[RuleRecord]:
    return [
        RuleRecord(
            seq=r["seq"],
            name=r["name"],
            selector=r["selector"],
            version=r["version"],
            rollout_id=r["rollout_id"],
            set_at=datetime.fromisoformat(r["set_at"]),
            residency=r["residency"],
        )
        for r in db.execute("SELECT * FROM model_rules ORDER BY seq")
    ]


def _set_assignments(db: sqlite3.Connection, assignments: list[AssignmentRecord]) -> None:
    with write(db):
        db.executemany(
            "INSERT OR REPLACE INTO model_assignments "
            "(agent_id, name, version, rollout_id, set_at, residency) VALUES (?, ?, ?, ?, ?, ?)",
            [(a.agent_id, a.name, a.version, a.rollout_id, a.set_at.isoformat(), a.residency)
             for a in assignments],
        )  # fmt: skip


def _delete_assignments(db: sqlite3.Connection, agent_ids: list[str], name: str) -> None:
    with write(db):
        db.executemany(
            "DELETE FROM model_assignments WHERE agent_id = ? AND name = ?",
            [(agent_id, name) for agent_id in agent_ids],
        )


def _list_assignments(db: sqlite3.Connection) -> list[AssignmentRecord]:
    return [
        AssignmentRecord(
            agent_id=r["agent_id"],
            name=r["name"],
            version=r["version"],
            rollout_id=r["rollout_id"],
            set_at=datetime.fromisoformat(r["set_at"]),
            residency=r["residency"],
        )
        for r in db.execute("SELECT * FROM model_assignments")
    ]
