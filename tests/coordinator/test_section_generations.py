"""Desired-state section generations: one counter in the fleet database that only goes up.

Agents keep the newest generation of each section across reconnects and ignore older
ones, so the counter must stay above every generation sent before: across restarts, when
the clock goes back, and above the clock-based generations (milliseconds since the epoch)
that coordinators before migration 8 sent, which agents still hold after the upgrade.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.errors import StoreError
from coordinator.fleet.records import Liveness
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.store import migrations
from coordinator.store.generations import GenerationCounter
from coordinator.store.interface import AgentLastState
from coordinator.store.migrations import GENERATION_MARGIN_MS
from coordinator.store.report_json import REPORT_FIELDS, report_to_json
from coordinator.store.sqlite import DB_FILE, SQLiteFleetStore
from edgefleet.contract import (
    ConfigSection,
    Hello,
    KeysSection,
    LoadedModel,
    LoadReport,
    OverflowTargetsSection,
    SectionGenerations,
)
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures: the counter's tests run on both stores

pytestmark = pytest.mark.timeout(60)

DAY_MS = 86_400_000
# The version before the counter: keys and models generations were the clock in ms.
BEFORE_COUNTER = 7


def now_ms() -> int:
    return int(time.time() * 1000)


async def old_database(
    path: Path, monkeypatch: pytest.MonkeyPatch, states: list[AgentLastState], saved_at: datetime
) -> None:
    """A fleet database as the coordinator before migration 8 left it (schema version 7),
    with these agents' last states saved by its snapshot at ``saved_at``: the rows hold
    only the columns that version wrote (today's ``save_last_states`` also writes the
    shared live view's columns of migration 14, which a schema 7 table lacks)."""
    with monkeypatch.context() as old:
        old.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:BEFORE_COUNTER])
        old.setattr(migrations, "SCHEMA_VERSION", BEFORE_COUNTER)
        store = SQLiteFleetStore(path)
        await store.open()
        try:
            assert await store.schema_version() == BEFORE_COUNTER
            for state in states:
                await store.save_hello(Hello(agent_id=state.agent_id, site="lab"), state.last_seen)
        finally:
            await store.close()
    with sqlite3.connect(path) as raw:  # the schema 7 coordinator's snapshot
        raw.executemany(
            "INSERT OR REPLACE INTO agent_last_state (agent_id, liveness, last_seen, report_fields,"
            " report_json, saved_at) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    s.agent_id,
                    s.liveness.value,
                    s.last_seen.timestamp(),
                    None if s.report is None else REPORT_FIELDS,
                    report_to_json(s.report),
                    saved_at.timestamp(),
                )
                for s in states
            ],
        )
    raw.close()


def applied(keys: int, models: int = 0, overflow: int = 0) -> LoadReport:
    return LoadReport(applied=SectionGenerations(models, overflow, keys, 0))


async def first_generation(path: Path) -> int:
    """The first generation a coordinator opening ``path`` now hands out."""
    store = SQLiteFleetStore(path)
    await store.open()
    try:
        assert await store.schema_version() == migrations.SCHEMA_VERSION
        counter = GenerationCounter(store.reserve_generations)
        await counter.start()
        return counter.next()
    finally:
        await store.close()


async def test_the_migration_starts_above_clock_generations_agents_applied_on_a_clock_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old coordinator's clock ran two days ahead of this machine's: the keys and models
    generations its agents applied (saved in their last states) are far above the clock
    here, and the counter starts above them all the same."""
    db = tmp_path / DB_FILE
    ahead = now_ms() + 2 * DAY_MS
    now = datetime.now(UTC)
    await old_database(
        db,
        monkeypatch,
        [
            AgentLastState("edge-1", Liveness.LIVE, now, applied(keys=ahead, models=ahead - 5)),
            AgentLastState("edge-2", Liveness.LIVE, now, applied(keys=ahead - 900, overflow=3)),
            AgentLastState("edge-3", Liveness.DOWN, now - timedelta(hours=1), None),
        ],
        now,
    )
    first = await first_generation(db)
    assert first > ahead + GENERATION_MARGIN_MS - 1
    # The upgraded rows are the restored fleet's, and the snapshot writes them again.
    store = SQLiteFleetStore(db)
    await store.open()
    try:
        restored = {s.agent_id: s for s in await store.list_last_states()}
        assert sorted(restored) == ["edge-1", "edge-2", "edge-3"]
        assert restored["edge-1"].report == applied(keys=ahead, models=ahead - 5)
        assert restored["edge-3"].liveness is Liveness.DOWN and restored["edge-3"].report is None
        assert await store.save_last_states(list(restored.values()), datetime.now(UTC)) == []
        assert {s.agent_id for s in await store.live_states_after(0, 10)} == set(restored)
    finally:
        await store.close()


async def test_the_migration_starts_above_the_newest_time_the_database_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No agent reported its generations (say, the old coordinator was killed before its
    first snapshot held a report), but the snapshot's time, taken by a clock a day ahead
    of this machine's, bounds what that clock gave as generations."""
    db = tmp_path / DB_FILE
    saved = datetime.now(UTC) + timedelta(days=1)
    await old_database(
        db, monkeypatch, [AgentLastState("edge-1", Liveness.LIVE, saved, None)], saved
    )
    assert await first_generation(db) > saved.timestamp() * 1000 + GENERATION_MARGIN_MS - 1


async def test_the_migration_starts_above_this_machines_clock_on_an_empty_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = now_ms()
    await old_database(tmp_path / "old.db", monkeypatch, [], datetime.now(UTC))
    assert await first_generation(tmp_path / "old.db") >= before + GENERATION_MARGIN_MS
    assert await first_generation(tmp_path / "fresh.db") >= before + GENERATION_MARGIN_MS


async def test_a_saved_report_this_version_cannot_read_does_not_stop_the_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / DB_FILE
    now = datetime.now(UTC)
    ahead = now_ms() + 2 * DAY_MS
    await old_database(
        db,
        monkeypatch,
        [
            AgentLastState("edge-1", Liveness.LIVE, now, applied(keys=ahead)),
            AgentLastState("edge-2", Liveness.LIVE, now, applied(keys=1)),
        ],
        now,
    )
    with sqlite3.connect(db) as raw:  # a row another version wrote
        raw.execute(
            "UPDATE agent_last_state SET report_fields = 'applied', report_json = '[\"x\"]' "
            "WHERE agent_id = 'edge-2'"
        )
    assert await first_generation(db) > ahead


async def test_generations_go_on_above_every_block_after_restarts_and_a_clock_gone_back(
    store_factory: StoreFactory,
) -> None:
    """Each coordinator start is a new counter on the same store; the third one's clock is
    a day behind the first's."""
    store = store_factory()
    await store.open()
    try:
        clock = [now_ms()]
        handed: list[int] = []
        for back in (0, 0, DAY_MS):

            def clock_ms(back: int = back) -> int:
                return clock[0] - back

            counter = GenerationCounter(store.reserve_generations, block=4, clock_ms=clock_ms)
            await counter.start()
            for _ in range(6):  # past the end of a block
                handed.append(counter.next())
                await counter.reserved()  # the next block, reserved ahead
            clock[0] += 1  # a millisecond between restarts: far less than a block's worth
        assert handed == sorted(set(handed))
    finally:
        await store.close()


async def test_the_counter_never_falls_behind_the_clock(store_factory: StoreFactory) -> None:
    """A database restored from a backup holds the counter as it was then: the clock, moved
    on since, keeps the next generations above what agents were sent after the backup."""
    store = store_factory()
    await store.open()
    try:
        backed_up = GenerationCounter(store.reserve_generations)
        await backed_up.start()
        later = backed_up.next() + 10 * DAY_MS  # the clock when the backup is restored
        restored = GenerationCounter(store.reserve_generations, clock_ms=lambda: later)
        await restored.start()
        assert [restored.next(), restored.next()] == [later, later + 1]
    finally:
        await store.close()


async def test_every_section_the_registry_sets_takes_the_stores_next_generation(
    store_factory: StoreFactory,
) -> None:
    """Whatever generation a section comes with (the distributors send 0), the registry
    gives it the next of the counter, so a restarted coordinator's are newer."""
    held: list[int] = []
    for _ in range(2):  # a coordinator and the one restarted on its database
        store = store_factory()
        await store.open()
        try:
            registry = await LiveFleetRegistry.open(store)
            registry.open_session(Hello(agent_id="edge-1", models=(LoadedModel("m", "v1"),)))
            for section in (
                OverflowTargetsSection(0, ()),
                KeysSection(5, ()),
                ConfigSection(10**15, {"a": "b"}),
                OverflowTargetsSection(0, ()),
            ):
                desired = registry.set_section("edge-1", section)
                held.append(max(desired.generations()))
            await registry.flush()
        finally:
            await store.close()
    assert held == sorted(set(held))
    assert held[0] > now_ms() - 60_000  # not counted from 1
    assert held[-1] < 10**15  # nor taken from the section


async def test_the_next_block_is_reserved_ahead_and_grows_with_the_fleet(
    store_factory: StoreFactory,
) -> None:
    """next() never waits for the store: the next block is written while the current one
    still lasts, and a fleet-wide push in one go (a section for each of 3,000 agents)
    finds enough reserved. With nothing reserved (the store not answering) it raises."""
    store = store_factory()
    await store.open()
    try:
        agents = [10]
        counter = GenerationCounter(store.reserve_generations, demand=lambda: agents[0])
        with pytest.raises(StoreError, match="no desired-state section generation"):
            counter.next()  # not started: nothing reserved
        await counter.reserved()
        agents[0] = 3000  # the fleet grew
        first = counter.next()
        await counter.reserved()  # under half of 4 per agent was left: one more block
        assert counter.remaining() >= 2 * 3000
        handed = [counter.next() for _ in range(3000)]  # one synchronous pass, no await
        assert handed == list(range(handed[0], handed[0] + 3000)) and handed[0] > first
    finally:
        await store.close()


async def test_fresh_hands_out_only_what_was_reserved_after_it_began() -> None:
    """Two coordinators' counters over one store (the database's counter): A reserved its
    block before B, so A's next generations are below B's; after ``fresh()`` A hands out
    only generations above everything B reserved before, and sessions opening together
    share one reservation."""
    issued = [0]
    calls = []

    async def reserve(count: int, at_least: int) -> int:
        calls.append(count)
        await asyncio.sleep(0.01)
        first = max(issued[0] + 1, at_least)
        issued[0] = first + count - 1
        return first

    a = GenerationCounter(reserve, block=10, clock_ms=lambda: 0)
    b = GenerationCounter(reserve, block=10, clock_ms=lambda: 0)
    await a.start()
    await b.start()
    assert a.next() == 1 and b.next() == 11  # B's block is above A's
    assert b.next() == 12
    calls.clear()
    assert await asyncio.gather(a.fresh(), a.fresh(), a.fresh()) == [True, True, True]
    assert calls == [10]  # one reservation for the three
    assert a.next() == 21 and a.remaining() == 9  # A's old block dropped
