"""What only the PostgreSQL backend has: statement and lock timeouts on every call, its
numbered migrations under an advisory lock (run once by coordinators starting together,
refusing a newer database), the audit log's append-only trigger, and a password that
shows up in no message. Everything the backends share: test_store_conformance*.py.

A real server: the test cluster of tests/postgres_cluster.py (one per session)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest

from coordinator.errors import StoreError
from coordinator.store.interface import JoinToken, StoreTimeoutError
from coordinator.store.postgres import SCHEMA_VERSION, PostgresFleetStore, display_url
from coordinator.store.postgres.pool import Connection
from tests.postgres_cluster import PostgresCluster, free_port

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TIMEOUT_S = 0.5


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresFleetStore]:
    opened = PostgresFleetStore(postgres_url, statement_timeout_s=TIMEOUT_S)
    await opened.open()
    yield opened
    await opened.close()


async def _sleep_then_write(db: Connection, seconds: float) -> None:
    async with db.transaction():
        await db.execute("INSERT INTO sites (name, first_seen) VALUES ('slow', now())")
        await db.execute("SELECT pg_sleep(%s)", (seconds,))


async def test_a_statement_past_the_timeout_is_stopped_and_rolled_back(
    store: PostgresFleetStore,
) -> None:
    started = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"past the statement timeout of 0\.5 s"):
        await store.pool.call(_sleep_then_write, 30)
    assert time.monotonic() - started < 5
    assert await store.list_sites() == []  # nothing of it kept
    # The connection it ran on is fine for the next call.
    await store.add_token(JoinToken("tok1", "ab" * 32, NOW, None, 1))
    assert await store.get_token("tok1") is not None


async def test_a_long_call_may_be_given_a_longer_deadline(store: PostgresFleetStore) -> None:
    await store.pool.call_with_timeout(5.0, _sleep_then_write, 1.0)
    assert [s.name for s in await store.list_sites()] == ["slow"]


async def test_waiting_for_a_row_lock_ends_with_a_timeout(
    store: PostgresFleetStore, postgres_url: str
) -> None:
    """Another session (an operator's psql, a stuck coordinator) holds the token's row: a
    call that needs it gives up after the lock timeout instead of waiting for ever."""
    await store.add_token(JoinToken("tok1", "ab" * 32, NOW, None, 1))
    async with await psycopg.AsyncConnection.connect(postgres_url) as other:
        await other.execute("SELECT * FROM join_tokens WHERE token_id = 'tok1' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            await store.revoke_token("tok1")
        assert time.monotonic() - started < 5
        assert await store.get_token("tok1") is not None  # reading does not wait
        await other.rollback()
    assert await store.revoke_token("tok1") is True


async def test_coordinators_starting_together_migrate_once(postgres_url: str) -> None:
    stores = [PostgresFleetStore(postgres_url) for _ in range(6)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        assert {await s.schema_version() for s in stores} == {SCHEMA_VERSION}
        async with await psycopg.AsyncConnection.connect(postgres_url) as raw:
            cursor = await raw.execute("SELECT count(*) FROM section_generations")
            assert await cursor.fetchone() == (1,)
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_database_from_a_newer_coordinator_is_refused(postgres_url: str) -> None:
    first = PostgresFleetStore(postgres_url)
    await first.open()
    await first.close()
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as raw:
        await raw.execute("UPDATE edgefleet_schema SET version = %s", (SCHEMA_VERSION + 5,))
    for migrate in (True, False):
        newer = PostgresFleetStore(postgres_url, migrate=migrate)
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 5}, newer than"):
            await newer.open()
        with pytest.raises(StoreError, match="not open"):
            await newer.list_agents()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_log SET outcome = 'ok'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ],
)
async def test_the_audit_log_is_append_only_in_the_database(
    store: PostgresFleetStore, postgres_url: str, statement: str
) -> None:
    await store.append_audit(
        at=NOW, actor_id="adm_1", actor_name="ops", role="admin", action="keys.revoke",
        target="key_1", peer="127.0.0.1", outcome="denied", status=403, detail="",
    )  # fmt: skip
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as raw:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            await raw.execute(statement)
    (entry,) = await store.audit_entries(since=None, after_seq=0, limit=10)
    assert entry.outcome == "denied"


async def test_an_unreachable_server_is_a_store_error_that_never_shows_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"postgresql://fleet@127.0.0.1:{free_port()}/fleet"
    store = PostgresFleetStore(url, password="pa55-w0rd-never-shown", statement_timeout_s=1)
    with pytest.raises(StoreError, match="cannot open the fleet database postgresql://fleet@") as e:
        await store.open()
    assert "pa55-w0rd" not in str(e.value) and "pa55-w0rd" not in repr(e.value.__cause__)
    assert "pa55-w0rd" not in caplog.text
    assert display_url("postgresql://u:secret@db:5433/fleet") == "postgresql://u@db:5433/fleet"


@pytest.mark.postgres  # a cluster of its own, not the fixture's
async def test_a_server_that_goes_away_fails_calls_fast_and_is_used_again_when_back() -> None:
    """A cluster of its own, stopped as a crash looks (immediate shutdown) and started
    again: while it is away every call fails within its timeouts (never hangs); when it is
    back the pool replaces the connections it lost, and the same store object works on,
    no reopening."""
    cluster = await asyncio.to_thread(PostgresCluster.start)
    try:
        url = await asyncio.to_thread(cluster.create_database)
        store = PostgresFleetStore(url, statement_timeout_s=1)
        await store.open()
        try:
            await store.add_token(JoinToken("tok1", "ab" * 32, NOW, None, 1))
            await asyncio.to_thread(cluster.stop_server)
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(StoreError):
                    await store.get_token("tok1")
                assert time.monotonic() - started < 5
            await asyncio.to_thread(cluster.restart)
            started = time.monotonic()
            while True:
                try:
                    back = await store.get_token("tok1")
                    break
                except StoreError:
                    assert time.monotonic() - started < 30, "the store never came back"
                    await asyncio.sleep(0.2)
            assert back is not None
            await store.add_token(JoinToken("tok2", "ab" * 32, NOW, None, 1))
            assert [t.token_id for t in await store.list_tokens()] == ["tok1", "tok2"]
        finally:
            await store.close()
    finally:
        await asyncio.to_thread(cluster.stop)
