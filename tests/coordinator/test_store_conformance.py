"""The fleet store's conformance suite: every test runs on both backends (SQLite and
PostgreSQL: the ``store`` fixtures of tests/coordinator/store_backends.py), so what passes
on one passes on the other. The tokens and agents tables, reopening, a second connection
and racing enrollments; the other tables: tests/coordinator/test_store_conformance_tables.py;
what only one backend has (SQLite's WAL and worker thread: test_store_worker.py;
PostgreSQL's timeouts, migrations and audit trigger: test_postgres_store.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.errors import StoreError
from coordinator.store.interface import FleetStore, JoinToken, StoredAgent
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.sqlite import DB_FILE, SQLiteFleetStore
from edgefleet.contract import Hardware, Hello, LoadedModel, Location
from tests.coordinator.store_backends import StoreFactory, backend, store, store_factory

pytestmark = pytest.mark.timeout(30)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


__all__ = ["backend", "store", "store_factory"]  # fixtures


def token(token_id: str = "tok1", **changes: object) -> JoinToken:
    fields: dict[str, object] = {
        "token_id": token_id,
        "secret_sha256": "ab" * 32,
        "created_at": NOW,
        "expires_at": NOW + timedelta(hours=1),
        "max_uses": 2,
        "site": "",
        "note": "",
    }
    fields.update(changes)
    return JoinToken(**fields)  # type: ignore[arg-type]


def hello(agent_id: str = "agent-1", site: str = "berlin") -> Hello:
    return Hello(
        agent_id=agent_id,
        site=site,
        http_url="http://10.0.0.7:8000",
        agent_version="1.2.3",
        location=Location(52.52, 13.405),
        hardware=Hardware(
            cpu_count=8,
            memory_bytes=16 << 30,
            execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        ),
        models=(LoadedModel("smollm2-135m", "int8-abc", "text-generation", "int8"),),
        token="secret-credential",
    )


def enrolled(agent_id: str = "agent-1", site: str = "") -> StoredAgent:
    return StoredAgent(
        agent_id=agent_id,
        enrolled_at=NOW,
        token_id="tok1",
        credential_sha256="cd" * 32,
        cert_serial="1f2e",
        site=site,
    )


async def test_each_backend_is_a_fleet_store(tmp_path: Path) -> None:
    _sqlite: FleetStore = SQLiteFleetStore.in_directory(tmp_path)  # the Protocol is checked
    _postgres: FleetStore = PostgresFleetStore("postgresql://u@h/db")  # statically (mypy)


async def test_sqlite_keeps_its_file_in_wal_mode(tmp_path: Path) -> None:
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        assert store.path == tmp_path / DB_FILE
        with sqlite3.connect(store.path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        await store.close()


async def test_tokens_add_get_list_revoke(store: FleetStore) -> None:
    first = token("tok1", site="berlin", note="for the lab")
    second = token("tok2", created_at=NOW + timedelta(seconds=1), expires_at=None)
    await store.add_token(first)
    await store.add_token(second)
    assert await store.get_token("tok1") == first
    assert await store.get_token("nope") is None
    assert await store.list_tokens() == [first, second]  # oldest first
    assert await store.revoke_token("tok2") is True
    assert await store.revoke_token("nope") is False
    revoked = await store.get_token("tok2")
    assert revoked is not None and revoked.revoked and revoked.state(NOW) == "revoked"


async def test_a_duplicate_token_id_is_a_store_error(store: FleetStore) -> None:
    await store.add_token(token())
    with pytest.raises(StoreError):
        await store.add_token(token())


async def test_enroll_uses_the_token_once_and_adds_the_agent(store: FleetStore) -> None:
    await store.add_token(token(max_uses=2, site="berlin"))
    assert await store.enroll("tok1", NOW, enrolled("agent-1", site="berlin")) is True
    used = await store.get_token("tok1")
    assert used is not None and used.uses == 1
    agent = await store.get_agent("agent-1")
    assert agent is not None and agent.enrolled and agent.token_id == "tok1"
    assert agent.cert_serial == "1f2e" and agent.site == "berlin"
    assert [s.name for s in await store.list_sites()] == ["berlin"]
    # The same id again: refused, and the token is not used up by the refusal.
    assert await store.enroll("tok1", NOW, enrolled("agent-1")) is False
    again = await store.get_token("tok1")
    assert again is not None and again.uses == 1


@pytest.mark.parametrize(
    ("stored", "when"),
    [
        (None, NOW),  # unknown token
        (token(max_uses=1, uses=1), NOW),  # exhausted
        (token(), NOW + timedelta(hours=2)),  # expired
        (token(revoked=True), NOW),  # revoked
    ],
)
async def test_enroll_refuses_an_unusable_token_and_changes_nothing(
    store: FleetStore, stored: JoinToken | None, when: datetime
) -> None:
    if stored is not None:
        await store.add_token(stored)
    assert await store.enroll("tok1", when, enrolled()) is False
    assert await store.get_agent("agent-1") is None
    assert await store.list_sites() == []
    if stored is not None:
        assert await store.get_token("tok1") == stored


async def test_save_hello_creates_then_updates_an_agent(store: FleetStore) -> None:
    await store.save_hello(hello(site="berlin"), NOW)
    agent = await store.get_agent("agent-1")
    assert agent is not None and not agent.enrolled
    # Everything but the credential comes back.
    assert agent.hello == replace(hello(site="berlin"), token="")
    assert agent.last_seen == NOW and agent.site == "berlin"
    later = NOW + timedelta(minutes=5)
    await store.save_hello(hello(site="munich"), later)
    agent = await store.get_agent("agent-1")
    assert agent is not None and agent.site == "munich" and agent.last_seen == later
    assert [s.name for s in await store.list_sites()] == ["berlin", "munich"]


async def test_an_enrolled_agents_site_is_not_changed_by_its_hello(store: FleetStore) -> None:
    await store.add_token(token(site="berlin"))
    await store.enroll("tok1", NOW, enrolled(site="berlin"))
    await store.save_hello(hello(site="elsewhere"), NOW)
    agent = await store.get_agent("agent-1")
    assert agent is not None and agent.site == "berlin" and agent.enrolled
    assert agent.hello is not None and agent.hello.site == "elsewhere"


async def test_last_seen_and_draining(store: FleetStore) -> None:
    await store.save_hello(hello(), NOW)
    await store.save_last_seen("agent-1", NOW + timedelta(seconds=30))
    assert await store.set_draining("agent-1", True) is True
    assert await store.set_draining("ghost", True) is False
    agent = await store.get_agent("agent-1")
    assert agent is not None and agent.draining
    assert agent.last_seen == NOW + timedelta(seconds=30)
    await store.set_draining("agent-1", False)
    agent = await store.get_agent("agent-1")
    assert agent is not None and not agent.draining


async def test_list_agents_is_ordered_by_id(store: FleetStore) -> None:
    for agent_id in ("c", "a", "b"):
        await store.save_hello(hello(agent_id), NOW)
    assert [a.agent_id for a in await store.list_agents()] == ["a", "b", "c"]


async def test_reopening_keeps_everything(store_factory: StoreFactory) -> None:
    first = store_factory()
    await first.open()
    await first.add_token(token())
    await first.enroll("tok1", NOW, enrolled())
    await first.save_hello(hello(), NOW)
    await first.set_draining("agent-1", True)
    before = (await first.list_tokens(), await first.list_agents(), await first.list_sites())
    await first.close()
    reopened = store_factory()
    await reopened.open()
    try:
        after = (
            await reopened.list_tokens(),
            await reopened.list_agents(),
            await reopened.list_sites(),
        )
        assert after == before
    finally:
        await reopened.close()


async def test_a_second_connection_sees_writes_and_enrollment_races_use_a_token_once(
    store_factory: StoreFactory,
) -> None:
    """The admin CLI opens the store while the coordinator has it open (two stores, one
    database), and enrollments race on separate connections."""
    coordinator = store_factory()
    cli = store_factory()
    racers = [store_factory() for _ in range(8)]
    for opened in (coordinator, cli, *racers):
        await opened.open()
    try:
        await cli.add_token(token(max_uses=1))
        assert await coordinator.get_token("tok1") is not None
        results = await asyncio.gather(
            *(own.enroll("tok1", NOW, enrolled(f"racer-{i}")) for i, own in enumerate(racers))
        )
        assert sorted(results) == [False] * 7 + [True]
        used = await coordinator.get_token("tok1")
        assert used is not None and used.uses == 1
        assert len([a for a in await cli.list_agents() if a.enrolled]) == 1
    finally:
        for opened in (coordinator, cli, *racers):
            await opened.close()


async def test_an_unopenable_database_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = SQLiteFleetStore(blocker / DB_FILE)
    with pytest.raises(StoreError, match="cannot open the fleet database"):
        await store.open()
    with pytest.raises(StoreError, match="not open"):
        await store.list_agents()
