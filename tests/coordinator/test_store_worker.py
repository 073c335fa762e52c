"""The store works off the event loop, one call at a time, each within a statement timeout.

SQLite runs on a thread of the store's own (coordinator/store/sqlite/worker.py): a slow
disk or a long statement holds up that thread, not the coordinator. A statement running
past the timeout is interrupted and rolled back (StoreTimeoutError, a StoreError); a wait
for another connection's write lock ends after the same time ("database is locked").
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from coordinator.api.app_keys import STORE_KEY
from coordinator.errors import StoreError
from coordinator.store.interface import StoreTimeoutError
from coordinator.store.join_tokens import JoinToken
from coordinator.store.offline import run_offline
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, MakeCoordinator, hello

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: A statement that never ends on its own: counting up without a bound.
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"


def token(token_id: str) -> JoinToken:
    return JoinToken(token_id, "ab" * 32, NOW, None, 1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteFleetStore]:
    opened = SQLiteFleetStore.in_directory(tmp_path, statement_timeout_s=0.3)
    await opened.open()
    yield opened
    await opened.close()


async def test_a_statement_past_the_timeout_is_stopped_and_rolled_back(
    store: SQLiteFleetStore,
) -> None:
    def write_then_run_forever(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO join_tokens (token_id, secret_sha256, created_at, max_uses) "
                   "VALUES ('half', '', '2026-03-01', 1)")  # fmt: skip
        db.execute(ENDLESS).fetchone()

    started = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"ran past the statement timeout of 0\.3 s"):
        await store.worker.call(write_then_run_forever)
    assert time.monotonic() - started < 2.0
    assert issubclass(StoreTimeoutError, StoreError)
    # Nothing of the interrupted call was kept, and the store goes on serving.
    assert await store.get_token("half") is None
    await store.add_token(token("after"))
    assert await store.get_token("after") == token("after")


async def test_a_long_call_may_be_given_a_longer_deadline(store: SQLiteFleetStore) -> None:
    def count(db: sqlite3.Connection, upto: int) -> int:
        query = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        return int(db.execute(query + "SELECT max(i) FROM n", (upto,)).fetchone()[0])

    assert await store.worker.call_with_timeout(30.0, count, 3_000_000) == 3_000_000


async def test_waiting_for_another_connections_write_lock_ends_with_a_store_error(
    store: SQLiteFleetStore,
) -> None:
    """Another process (the admin CLI, a stuck tool) holds the write lock."""
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StoreError, match="database is locked"):
            await store.add_token(token("blocked"))
        assert 0.2 < time.monotonic() - started < 2.0
        other.execute("ROLLBACK")
        await store.add_token(token("blocked"))  # the lock is free: it goes through
    finally:
        other.close()


async def test_calls_run_in_order_on_the_worker_while_the_loop_runs_on(
    store: SQLiteFleetStore,
) -> None:
    release = threading.Event()
    ran: list[str] = []

    def blocked(db: sqlite3.Connection) -> None:
        ran.append("blocked")
        release.wait(10)

    first = asyncio.create_task(store.worker.call(blocked))
    queued = [asyncio.create_task(store.add_token(token(f"t{i}"))) for i in range(3)]
    # The worker is stuck: the loop is not. 20 ticks of 10 ms take about 0.2 s.
    started = time.monotonic()
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert time.monotonic() - started < 1.0
    assert ran == ["blocked"] and not any(task.done() for task in queued)
    release.set()
    await asyncio.gather(first, *queued)
    assert [t.token_id for t in await store.list_tokens()] == ["t0", "t1", "t2"]


async def test_closing_runs_what_was_queued_then_refuses(tmp_path: Path) -> None:
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    queued = asyncio.create_task(store.add_token(token("last")))
    await asyncio.sleep(0)  # queued before the close
    await store.close()
    await queued
    with pytest.raises(StoreError, match="not open"):
        await store.get_token("last")
    again = SQLiteFleetStore.in_directory(tmp_path)
    await again.open()
    assert await again.get_token("last") is not None
    await again.close()


async def test_the_coordinator_serves_while_its_store_is_stuck(
    make_coordinator: MakeCoordinator,
) -> None:
    """/healthz, HTTP and gRPC route lookups and an agent's load reports are answered
    while the store's thread is held (a slow disk); an admin request that needs the
    database waits for it and is answered once it is free."""
    c = await make_coordinator()
    session = c.stub.Session()
    await session.write(hello("edge-1"))
    assert (await session.read()).WhichOneof("body") == "welcome"
    release = threading.Event()
    stuck = asyncio.create_task(c.app[STORE_KEY].worker.call(lambda db: release.wait(20)))
    try:
        async with aiohttp.ClientSession() as http:
            admin = asyncio.create_task(_get(http, c.http_url + "/v1/admin/tokens", ADMIN_HEADERS))
            for _ in range(5):
                started = time.monotonic()
                assert (await _get(http, c.http_url + "/healthz"))[0] == 200
                status, body = await _get(http, c.http_url + "/v1/route?model=m")
                assert status == 200 and [a["agent_id"] for a in body["agents"]] == ["edge-1"]
                routed = await c.stub.Route(pb.RouteRequest(model="m"))
                assert [a.agent_id for a in routed.agents] == ["edge-1"]
                await session.write(pb.AgentMessage(load_report=pb.LoadReport()))
                assert time.monotonic() - started < 1.0
            assert not admin.done()  # its token list is in the store
            release.set()
            status, listed = await asyncio.wait_for(admin, 10)
            assert status == 200 and listed["object"] == "list"
    finally:
        release.set()
        await stuck
        session.cancel()


async def _get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    async with http.get(url, headers=headers) as response:
        return response.status, await response.json()


async def test_run_offline_works_from_code_called_inside_an_event_loop(tmp_path: Path) -> None:
    """A synchronous caller on a thread with a running loop (an async test building an
    image's model set): asyncio.run cannot nest there, so the work runs on a thread."""

    async def count_agents(store: Any) -> int:
        return len(await store.list_agents())

    assert run_offline(tmp_path / "data", count_agents) == 0
