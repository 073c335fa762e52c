"""Writes kept while the fleet database is away: the write-behind queue and the request
records' buffer retry in order, drop nothing for an outage, and keep their bounds.

The database "away" here is a real SQLite store whose calls raise StoreUnavailableError
while a flag is set (what the PostgreSQL pool raises for a server that is gone:
tests/coordinator/test_store_outage.py shows it with a real server).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack

from coordinator.errors import StoreError
from coordinator.fleet.request_records import BatchResult, RequestRecordStore
from coordinator.store.health import StoreHealth
from coordinator.store.interface import StoreUnavailableError
from coordinator.store.request_records import RequestRecord
from coordinator.store.sqlite import SQLiteFleetStore
from coordinator.store.write_behind import WriteBehind
from devtools.process import wait_until
from edgefleet.contract import RequestRecords


class Switch:
    """Whether the database answers."""

    def __init__(self) -> None:
        self.away = False

    def check(self) -> None:
        if self.away:
            raise StoreUnavailableError("fleet database: connection refused")


class SwitchedRecords:
    """A real store's request records table, unavailable while ``switch.away``."""

    def __init__(self, store: SQLiteFleetStore, switch: Switch) -> None:
        self._store, self._switch = store, switch

    async def add_request_records(self, rows: list[RequestRecord]) -> int:
        self._switch.check()
        return await self._store.add_request_records(rows)

    async def count_request_records(self) -> int:
        return await self._store.count_request_records()

    async def prune_request_records(self, count: int) -> int:
        return await self._store.prune_request_records(count)

    async def list_request_records(self, **kwargs: Any) -> list[RequestRecord]:
        return await self._store.list_request_records(**kwargs)


class Pingable:
    def __init__(self, switch: Switch) -> None:
        self._switch = switch

    async def ping(self) -> None:
        self._switch.check()


def batch(first_seq: int, count: int) -> RequestRecords:
    records = [{"model": "m", "status": 200, "latency_ms": 5.0} for _ in range(count)]
    return RequestRecords(first_seq, msgpack.packb(records))


async def test_queued_writes_wait_for_the_database_in_order_and_none_is_dropped() -> None:
    switch, written = Switch(), []
    health = StoreHealth(Pingable(switch), "sqlite")
    queue = WriteBehind("test", max_pending=5)
    queue.watched_by(health)

    def write(n: int) -> Any:
        async def run() -> None:
            switch.check()
            written.append(n)

        return run

    switch.away = True
    for n in range(5):
        queue.submit(write(n), f"write {n}")
    queue.submit(write(99), "one too many")  # the bound: given up, counted
    await asyncio.sleep(0.5)
    assert written == [] and queue.pending() == 5 and queue.dropped == 1
    assert health.status == "degraded" and health.pending_writes() == 5
    assert not await queue.flush(0.2)  # a stop while it is away does not hang
    switch.away = False
    assert await queue.flush(5)
    assert written == [0, 1, 2, 3, 4] and queue.pending() == 0
    assert health.status == "ok" and health.outages == 1


async def test_a_write_the_database_refuses_is_given_up_after_three_tries() -> None:
    tries = []

    async def refused() -> None:
        tries.append(1)
        raise StoreError("fleet database: duplicate key")

    queue = WriteBehind("test")
    queue.submit(refused, "a bad write")
    assert await queue.flush(5)
    assert (len(tries), queue.dropped) == (3, 1)


async def test_records_are_acknowledged_only_once_stored_and_over_the_bound_sent_again(
    tmp_path: Path,
) -> None:
    switch = Switch()
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        records = RequestRecordStore(SwitchedRecords(store, switch), max_pending_rows=25)  # type: ignore[arg-type]
        ended: list[tuple[str, str]] = []
        records.bind(lambda agent_id, session: ended.append((agent_id, session)))
        acks: list[tuple[str, int]] = []

        def done(agent_id: str) -> Any:
            def ack(result: BatchResult) -> None:
                assert result.ack is not None
                acks.append((agent_id, result.ack.through_seq))

            return ack

        records.submit("edge-1", "s1", batch(1, 10), done("edge-1"))
        await records.flush(5)
        assert acks == [("edge-1", 10)]
        switch.away = True
        records.submit("edge-1", "s1", batch(11, 10), done("edge-1"))
        records.submit("edge-2", "s2", batch(1, 10), done("edge-2"))
        records.submit("edge-1", "s1", batch(21, 10), done("edge-1"))  # over 25 kept
        records.submit("edge-1", "s1", batch(31, 1), done("edge-1"))  # same session: too
        await asyncio.sleep(0.5)
        assert acks == [("edge-1", 10)]  # nothing acknowledged while away
        assert records.pending() == 20 and records.deferred == 11 and records.dropped == 0
        health = StoreHealth(Pingable(switch), "sqlite")
        records.watched_by(health)
        assert health.json()["deferred_writes"] == 11 and health.json()["pending_writes"] == 20
        switch.away = False
        await wait_until(lambda: len(acks) == 3, timeout_s=5, message="acks")
        assert acks == [("edge-1", 10), ("edge-1", 20), ("edge-2", 10)]
        await records.flush(5)
        # edge-1's session ends: its agent sends 21..31 again from its spool
        assert ended == [("edge-1", "s1")]
        assert await store.count_request_records() == 30
        records.submit("edge-1", "s2", batch(21, 11), done("edge-1"))
        await records.flush(5)
        assert acks[-1] == ("edge-1", 31) and await store.count_request_records() == 41
    finally:
        await store.close()
