"""Table ``request_records`` in PostgreSQL (a batch sent twice is stored once:
``ON CONFLICT DO NOTHING`` on the agent id and its sequence number)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple

from coordinator.store.postgres.base import PostgresTable
from coordinator.store.postgres.pool import Connection
from coordinator.store.request_records import RequestRecord

#: The statement timeout of a prune (seconds), as the SQLite backend's.
PRUNE_TIMEOUT_S = 120.0

_COLUMNS = (
    "agent_id, seq, received_at, at, key_id, model, version, prompt_tokens, completion_tokens,"
    " latency_ms, ttft_ms, served_by, endpoint, status, dropped"
)


class PostgresRequestRecords(PostgresTable):
    async def add_request_records(self, records: Sequence[RequestRecord]) -> int:
        if not records:
            return 0
        return await self._pool.call(_add, [astuple(r) for r in records])

    async def count_request_records(self) -> int:
        return await self._pool.call(_count)

    async def prune_request_records(self, count: int) -> int:
        return await self._pool.call_with_timeout(PRUNE_TIMEOUT_S, _prune, count)

    async def list_request_records(
        self, *, agent_id: str | None, after_seq: int, limit: int
    ) -> list[RequestRecord]:
        return await self._pool.call(_list, agent_id, after_seq, limit)


async def _add(db: Connection, rows: list[tuple[object, ...]]) -> int:
    # One statement over arrays (one round trip, and its row count is what was new).
    columns = list(zip(*rows, strict=True))
    cursor = await db.execute(
        f"INSERT INTO request_records ({_COLUMNS}) SELECT * FROM unnest("
        "%s::text[], %s::bigint[], %s::float8[], %s::float8[], %s::text[], %s::text[],"
        " %s::text[], %s::bigint[], %s::bigint[], %s::float8[], %s::float8[], %s::text[],"
        " %s::text[], %s::bigint[], %s::bigint[]) ON CONFLICT (agent_id, seq) DO NOTHING",
        [list(column) for column in columns],
    )
    return cursor.rowcount


async def _count(db: Connection) -> int:
    cursor = await db.execute("SELECT count(*) AS n FROM request_records")
    row = await cursor.fetchone()
    return 0 if row is None else int(row["n"])


async def _prune(db: Connection, count: int) -> int:
    cursor = await db.execute(
        "DELETE FROM request_records WHERE (agent_id, seq) IN (SELECT agent_id, seq"
        " FROM request_records ORDER BY received_at LIMIT %s)",
        (count,),
    )
    return cursor.rowcount


async def _list(
    db: Connection, agent_id: str | None, after_seq: int, limit: int
) -> list[RequestRecord]:
    cursor = await db.execute(
        f"SELECT {_COLUMNS} FROM request_records"
        " WHERE (%s::text IS NULL OR agent_id = %s) AND seq > %s"
        ' ORDER BY agent_id COLLATE "C", seq LIMIT %s',
        (agent_id, agent_id, after_seq, limit),
    )
    return [RequestRecord(**r) for r in await cursor.fetchall()]
