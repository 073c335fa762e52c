"""Table ``rollouts`` in PostgreSQL: a JSON body per rollout."""

from __future__ import annotations

import json
from collections.abc import Sequence

from coordinator.store.membership import LeaseFence, LeaseLostError
from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.membership import FENCE_HOLDS, fence_params
from coordinator.store.postgres.pool import Connection
from coordinator.store.rollouts import StoredRollout, rollout_from_row


class PostgresRollouts(PostgresTable):
    async def save_rollout(
        self, rollout: StoredRollout, *, fence: LeaseFence | None = None
    ) -> None:
        if fence is None:
            await self._pool.call(_save, rollout)
        elif not await self._pool.call(_save_fenced, rollout, fence):
            raise LeaseLostError(
                f"rollout {rollout.rollout_id} not saved: lease {fence.name!r} is no longer "
                f"held by {fence.holder} at epoch {fence.epoch}"
            )

    async def get_rollout(self, rollout_id: str) -> StoredRollout | None:
        return await self._pool.call(_get, rollout_id)

    async def list_rollouts(self, *, states: Sequence[str], limit: int) -> list[StoredRollout]:
        return await self._pool.call(_list, list(states), limit)

    async def count_rollouts_by_state(self) -> dict[str, int]:
        return await self._pool.call(_counts)


async def _save(db: Connection, r: StoredRollout) -> None:
    body = json.dumps(r.body, separators=(",", ":"))
    await db.execute(
        "INSERT INTO rollouts (rollout_id, model, version, state, created_at, updated_at,"
        " body_json) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (rollout_id)"
        " DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at,"
        " body_json = excluded.body_json",
        (r.rollout_id, r.model, r.version, r.state, r.created_at, r.updated_at, body),
    )


async def _save_fenced(db: Connection, r: StoredRollout, fence: LeaseFence) -> bool:
    """One statement: the row is written only when the fence holds (its lease row share
    locked meanwhile, so a takeover waits for it); False when it did not."""
    body = json.dumps(r.body, separators=(",", ":"))
    cursor = await db.execute(
        "INSERT INTO rollouts (rollout_id, model, version, state, created_at, updated_at,"
        " body_json) SELECT %s, %s, %s, %s, %s::double precision, %s::double precision, %s"
        f" WHERE {FENCE_HOLDS} ON CONFLICT (rollout_id)"
        " DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at,"
        " body_json = excluded.body_json",
        (r.rollout_id, r.model, r.version, r.state, r.created_at, r.updated_at, body,
         *fence_params(fence)),
    )  # fmt: skip
    return cursor.rowcount == 1


async def _get(db: Connection, rollout_id: str) -> StoredRollout | None:
    cursor = await db.execute("SELECT * FROM rollouts WHERE rollout_id = %s", (rollout_id,))
    row = await cursor.fetchone()
    return None if row is None else rollout_from_row(row)


async def _list(db: Connection, states: list[str], limit: int) -> list[StoredRollout]:
    cursor = await db.execute(
        "SELECT * FROM rollouts WHERE (cardinality(%s::text[]) = 0 OR state = ANY(%s))"
        " ORDER BY created_at DESC LIMIT %s",
        (states, states, limit),
    )
    return [rollout_from_row(r) for r in await cursor.fetchall()]


async def _counts(db: Connection) -> dict[str, int]:
    cursor = await db.execute("SELECT state, count(*) AS n FROM rollouts GROUP BY state")
    return {r["state"]: int(r["n"]) for r in await cursor.fetchall()}
