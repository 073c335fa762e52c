"""The fleet store's conformance suite, the change feed and dashboard sign-ins: two store
instances on one database stand for two coordinators (tests/coordinator/store_backends.py:
every test on SQLite and on a real PostgreSQL server).

Changes appended through one are read in order through the other; on PostgreSQL a
listener on B wakes when A appends (NOTIFY), and appends racing from many connections
commit in ``seq`` order, so a reader that follows ``changes_after`` misses none. Sign-ins
are kept as a hash and a token id, expire by the database's clock, and are seen by both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from coordinator.store import migrations
from coordinator.store.interface import FleetStore
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.postgres import changes as postgres_changes
from coordinator.store.postgres import migrations as postgres_migrations
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def pair(store_factory: StoreFactory) -> AsyncIterator[tuple[FleetStore, FleetStore]]:
    a, b = store_factory(), store_factory()
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


async def test_changes_appended_by_one_are_read_in_order_by_the_other(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    assert await b.last_change_seq() == 0
    first = await a.append_change("api_keys", "key_1", "revoked", "a-1")
    second = await a.append_change("agent", "agent-7", "drain", "a-1")
    assert second > first > 0
    assert await b.last_change_seq() == second
    seen = await b.changes_after(0, 10)
    assert [(c.seq, c.kind, c.subject, c.detail, c.origin) for c in seen] == [
        (first, "api_keys", "key_1", "revoked", "a-1"),
        (second, "agent", "agent-7", "drain", "a-1"),
    ]
    assert [c.seq for c in await b.changes_after(first, 10)] == [second]
    assert [c.seq for c in await b.changes_after(0, 1)] == [first]
    assert await b.changes_after(second, 10) == []
    assert seen[0].at <= seen[1].at


async def test_concurrent_appends_commit_in_sequence_order(
    pair: tuple[FleetStore, FleetStore], backend: str
) -> None:
    """A reader polling while 60 appends race from two stores never sees a seq below one
    it has already passed show up later."""
    a, b = pair
    done = asyncio.Event()
    passed = 0
    read: list[int] = []

    async def follow() -> None:
        nonlocal passed
        while True:
            finished = done.is_set()
            for change in await b.changes_after(passed, 1000):
                read.append(change.seq)
                passed = change.seq
            if finished:
                return
            await asyncio.sleep(0)

    async def append(store: FleetStore, i: int) -> None:
        await store.append_change("agent", f"agent-{i}", "drain", "x")

    follower = asyncio.create_task(follow())
    await asyncio.gather(*(append(a if i % 2 else b, i) for i in range(60)))
    done.set()
    await follower
    every = [c.seq for c in await a.changes_after(0, 1000)]
    assert len(every) == 60
    assert read == every, "the follower skipped a change that committed after a later one"


@pytest.mark.parametrize("backend", ["postgres"])  # SQLite: one writer at a time
async def test_an_append_waits_for_one_begun_before_it_to_commit(
    pair: tuple[FleetStore, FleetStore], backend: str
) -> None:
    """PostgreSQL: A's append is in a transaction not yet committed (its seq drawn); B's
    append, drawn after, must not commit first, or a reader would pass B's seq and never
    read A's. B waits for A's commit (the advisory lock); the reader sees both, in order."""
    a, b = pair
    assert isinstance(a, PostgresFleetStore)
    held = await a.pool.connect()
    try:
        async with held.transaction():
            first = await postgres_changes._append(held, "agent", "x", "drain", "a")
            later = asyncio.create_task(b.append_change("agent", "y", "drain", "b"))
            await asyncio.sleep(0.5)
            assert not later.done(), "a later append committed before an earlier one"
            assert await b.changes_after(0, 10) == []
        second = await asyncio.wait_for(later, 5.0)
        assert second > first
        assert [c.seq for c in await b.changes_after(0, 10)] == [first, second]
    finally:
        await held.close()


async def test_a_listener_wakes_when_another_store_appends(
    pair: tuple[FleetStore, FleetStore], backend: str
) -> None:
    a, b = pair
    if backend == "sqlite":  # one coordinator: nobody to notify; the wait is a sleep
        started = time.monotonic()
        assert await b.wait_for_changes(0.2) is False
        assert time.monotonic() - started >= 0.19
        return
    assert await b.wait_for_changes(0.1) is False  # listening now; nothing yet
    waiter = asyncio.create_task(b.wait_for_changes(10.0))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await a.append_change("api_keys", "key_2", "minted", "a-1")
    assert await waiter is True
    assert time.monotonic() - started < 1.0


async def test_old_changes_are_pruned_by_the_databases_clock(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    await a.append_change("api_keys", "key_1", "revoked", "a-1")
    assert await b.prune_changes(3600.0) == 0
    await asyncio.sleep(0.3)
    await a.append_change("api_keys", "key_2", "revoked", "a-1")
    assert await b.prune_changes(0.2) == 1
    assert [c.subject for c in await a.changes_after(0, 10)] == ["key_2"]


async def test_dashboard_sign_ins_are_shared_and_expire(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    made = await a.create_dashboard_session("h" * 64, "tok_1", 3600.0)
    assert made.token_id == "tok_1" and made.expires_at > made.created_at
    assert await b.get_dashboard_session("h" * 64) == made
    assert await b.get_dashboard_session("x" * 64) is None
    await a.create_dashboard_session("s" * 64, "tok_1", 0.2)
    await a.create_dashboard_session("t" * 64, "tok_2", 3600.0)
    assert await b.count_dashboard_sessions() == 3
    await asyncio.sleep(0.3)
    assert await b.get_dashboard_session("s" * 64) is None  # expired by the database's clock
    assert await b.count_dashboard_sessions() == 2
    assert await b.delete_dashboard_sessions(expired=True) == 1
    assert await b.delete_dashboard_sessions(token_id="tok_1") == 1  # its token revoked
    assert await a.get_dashboard_session("h" * 64) is None
    assert await b.delete_dashboard_session("t" * 64) is True
    assert await b.delete_dashboard_session("t" * 64) is False
    assert await a.count_dashboard_sessions() == 0


async def test_a_database_of_the_version_before_gets_the_tables(
    store_factory: StoreFactory, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = migrations if backend == "sqlite" else postgres_migrations
    with monkeypatch.context() as old:
        old.setattr(history, "SCHEMA_VERSION", history.SCHEMA_VERSION - 1)
        before = store_factory()
        await before.open()
        await before.close()
    upgraded = store_factory()
    await upgraded.open()
    try:
        assert await upgraded.schema_version() == history.SCHEMA_VERSION  # type: ignore[attr-defined]
        assert await upgraded.append_change("agent", "a", "drain", "o") == 1
        await upgraded.create_dashboard_session("h" * 64, "tok", 60.0)
        assert await upgraded.count_dashboard_sessions() == 1
    finally:
        await upgraded.close()
