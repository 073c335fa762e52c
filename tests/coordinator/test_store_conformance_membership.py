"""The fleet store's conformance suite, membership and the leader lease: two store instances
on one database stand for two coordinators. Every test runs on both backends
(tests/coordinator/store_backends.py); on PostgreSQL they are two connection pools to one
real server, whose clock decides who is alive and who leads.

The fencing test is issue 24's: A leads; A pauses (stops renewing) past its short lease; B
takes over at epoch + 1; A's fenced write is refused (nothing of it kept) and A learns it
no longer leads, not merely that its lease expired.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from coordinator.cluster.membership import LEADER_LEASE, ClusterMembership
from coordinator.store import migrations
from coordinator.store.interface import (
    CoordinatorMember,
    FleetStore,
    LeaseFence,
    LeaseLostError,
    StoredRollout,
)
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.postgres import migrations as postgres_migrations
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures

pytestmark = pytest.mark.timeout(60)

LEASE_S = 1.0


@pytest.fixture
async def pair(store_factory: StoreFactory) -> AsyncIterator[tuple[FleetStore, FleetStore]]:
    """Two coordinators' stores on one database."""
    a, b = store_factory(), store_factory()
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


def member(coordinator_id: str, incarnation: str = "i1", **changes: object) -> CoordinatorMember:
    fields: dict[str, object] = {
        "coordinator_id": coordinator_id,
        "incarnation": incarnation,
        "grpc_address": f"{coordinator_id}:50051",
        "http_address": f"https://{coordinator_id}:8080",
        "version": "1.2.3",
    }
    fields.update(changes)
    return CoordinatorMember(**fields)  # type: ignore[arg-type]


def rollout(state: str, updated_at: float) -> StoredRollout:
    return StoredRollout("ro_1", "llm", "v2", state, 1.0, updated_at, {"step": state})


async def test_a_database_of_the_version_before_gets_the_tables_and_keeps_its_rows(
    store_factory: StoreFactory, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = migrations if backend == "sqlite" else postgres_migrations
    with monkeypatch.context() as old:
        old.setattr(history, "SCHEMA_VERSION", history.SCHEMA_VERSION - 1)
        before = store_factory()
        await before.open()
        await before.save_rollout(rollout("running", 2.0))
        assert await before.schema_version() == history.SCHEMA_VERSION  # type: ignore[attr-defined]
        await before.close()
    upgraded = store_factory()
    await upgraded.open()
    try:
        assert await upgraded.schema_version() == history.SCHEMA_VERSION  # type: ignore[attr-defined]
        assert await upgraded.get_rollout("ro_1") == rollout("running", 2.0)
        assert await upgraded.heartbeat_member(member("coord-a"), 5.0)
        assert [m.coordinator_id for m in await upgraded.list_members(5.0)] == ["coord-a"]
        led = await upgraded.acquire_lease(LEADER_LEASE, "coord-a", "ia", 5.0)
        await upgraded.save_rollout(rollout("done", 3.0), fence=led.fence)
        assert await upgraded.get_rollout("ro_1") == rollout("done", 3.0)
    finally:
        await upgraded.close()


async def test_members_heartbeat_list_each_other_and_die_by_the_databases_clock(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    assert await a.list_members(5.0) == []
    # what a caller says about times is ignored: the database's clock sets them
    future = datetime.now(UTC) + timedelta(days=1)
    assert await a.heartbeat_member(member("coord-a", heartbeat_at=future), 5.0)
    assert await b.heartbeat_member(member("coord-b"), 5.0)
    listed = await b.list_members(5.0)
    assert [(m.coordinator_id, m.alive) for m in listed] == [("coord-a", True), ("coord-b", True)]
    first = listed[0]
    assert (first.grpc_address, first.http_address, first.version, first.incarnation) == (
        "coord-a:50051", "https://coord-a:8080", "1.2.3", "i1",
    )  # fmt: skip
    assert first.heartbeat_at is not None and first.started_at is not None
    assert first.heartbeat_at < future - timedelta(hours=23)

    # a heartbeat again keeps started_at, moves heartbeat_at and the addresses
    await asyncio.sleep(0.05)
    assert await a.heartbeat_member(member("coord-a", grpc_address="10.0.0.1:50051"), 5.0)
    (again,) = [m for m in await a.list_members(5.0) if m.coordinator_id == "coord-a"]
    assert again.heartbeat_at is not None and again.started_at == first.started_at
    assert again.heartbeat_at > first.heartbeat_at
    assert again.grpc_address == "10.0.0.1:50051"

    # another process under the same id, while the first is alive: refused, nothing written
    assert not await b.heartbeat_member(member("coord-a", "i2", version="9.9"), 5.0)
    (kept,) = [m for m in await a.list_members(5.0) if m.coordinator_id == "coord-a"]
    assert (kept.incarnation, kept.version) == ("i1", "1.2.3")

    # silent for longer than dead_after_s: dead, and its id free for a new process
    await asyncio.sleep(0.4)
    assert await b.heartbeat_member(member("coord-b"), 0.3)
    alive = {m.coordinator_id: m.alive for m in await a.list_members(0.3)}
    assert alive == {"coord-a": False, "coord-b": True}
    assert await b.heartbeat_member(member("coord-a", "i2", version="9.9"), 0.3)
    (restarted,) = [m for m in await a.list_members(5.0) if m.coordinator_id == "coord-a"]
    assert (restarted.incarnation, restarted.version, restarted.alive) == ("i2", "9.9", True)
    assert restarted.started_at is not None and first.started_at is not None
    assert restarted.started_at > first.started_at

    # a clean stop removes its own row only
    await a.remove_member("coord-a", "i1")  # the old process's: not this row
    await a.remove_member("coord-b", "i1")
    assert [m.coordinator_id for m in await b.list_members(5.0)] == ["coord-a"]


async def test_a_superseded_leaders_fenced_write_is_refused(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    led = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", LEASE_S)
    assert (led.held, led.holder, led.epoch) == (True, "coord-a", 1)
    assert 0 < led.remaining_s <= LEASE_S
    refused = await b.acquire_lease(LEADER_LEASE, "coord-b", "ib", LEASE_S)
    assert (refused.held, refused.holder, refused.epoch) == (False, "coord-a", 1)
    renewed = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", LEASE_S)
    assert (renewed.held, renewed.epoch) == (True, 1)  # a renewal keeps the epoch
    fence_a = renewed.fence
    assert fence_a == LeaseFence(LEADER_LEASE, "coord-a", 1)
    await a.save_rollout(rollout("running", 2.0), fence=fence_a)
    assert await a.lease_valid(fence_a)

    # A pauses (no renewal) past its lease; B takes over at the next epoch
    await asyncio.sleep(LEASE_S + 0.2)
    assert not await a.lease_valid(fence_a)
    took = await b.acquire_lease(LEADER_LEASE, "coord-b", "ib", LEASE_S)
    assert (took.held, took.holder, took.epoch) == (True, "coord-b", 2)
    await b.save_rollout(rollout("paused", 3.0), fence=took.fence)

    # A resumes: its write at epoch 1 is refused, nothing of it kept
    with pytest.raises(LeaseLostError, match="no longer held by coord-a at epoch 1"):
        await a.save_rollout(rollout("done", 4.0), fence=fence_a)
    stored = await b.get_rollout("ro_1")
    assert stored is not None and (stored.state, stored.updated_at) == ("paused", 3.0)
    # and A learns who leads: its renewal is refused while B's lease runs
    lost = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", LEASE_S)
    assert (lost.held, lost.holder, lost.epoch) == (False, "coord-b", 2)
    # a brand-new rollout is refused too (the insert, not only the update)
    with pytest.raises(LeaseLostError):
        await a.save_rollout(replace(rollout("running", 5.0), rollout_id="ro_2"), fence=fence_a)
    assert await b.get_rollout("ro_2") is None
    # unfenced writes (everything today) are unaffected
    await a.save_rollout(replace(rollout("running", 5.0), rollout_id="ro_3"))
    assert await b.get_rollout("ro_3") is not None


async def test_a_lapsed_lease_taken_again_by_its_holder_gets_a_new_epoch(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, _ = pair
    first = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", LEASE_S)
    await asyncio.sleep(LEASE_S + 0.2)
    again = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", LEASE_S)
    assert (again.held, again.epoch) == (True, first.epoch + 1)
    with pytest.raises(LeaseLostError):  # writes made under the lapsed tenure
        await a.save_rollout(rollout("running", 2.0), fence=first.fence)
    # the same id in a new process (a restart) is a new tenure too, once the old one lapsed
    restarted = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia-2", LEASE_S)
    assert not restarted.held
    await asyncio.sleep(LEASE_S + 0.2)
    restarted = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia-2", LEASE_S)
    assert (restarted.held, restarted.epoch) == (True, again.epoch + 1)


async def test_a_released_lease_is_taken_over_at_once(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    a, b = pair
    led = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", 30.0)
    await b.release_lease(LeaseFence(LEADER_LEASE, "coord-a", led.epoch + 1))  # a stale fence
    assert not (await b.acquire_lease(LEADER_LEASE, "coord-b", "ib", 30.0)).held
    await a.release_lease(led.fence)
    took = await b.acquire_lease(LEADER_LEASE, "coord-b", "ib", 30.0)
    assert (took.held, took.epoch) == (True, led.epoch + 1)


async def test_two_coordinators_one_leads_and_a_paused_leader_steps_down(
    pair: tuple[FleetStore, FleetStore],
) -> None:
    """ClusterMembership over the real store: a paused leader knows on waking (its own
    monotonic clock) that it no longer leads, and its next step names the new leader."""
    a_store, b_store = pair
    now = [0.0]

    def clock() -> float:
        return now[0]

    a = ClusterMembership(a_store, "coord-a", lease_s=LEASE_S, clock=clock,
                          addresses=lambda: ("a:50051", "https://a:8080"))  # fmt: skip
    b = ClusterMembership(b_store, "coord-b", lease_s=LEASE_S, clock=clock)
    await a.step()
    await b.step()
    await a.step()  # sees b alive
    assert (a.is_leader, b.is_leader) == (True, False)
    assert a.fence == LeaseFence(LEADER_LEASE, "coord-a", 1) and b.fence is None
    assert a.json() == {
        "id": "coord-a", "members_alive": 2, "is_leader": True, "leader": "coord-a",
        "lease_epoch": 1, "duplicate_id": False,
    }  # fmt: skip
    assert [m.coordinator_id for m in a.alive()] == ["coord-a", "coord-b"]
    assert a.alive()[0].grpc_address == "a:50051" and a.last_error is None
    assert b.leader_id == "coord-a"

    # a is paused: the time passes for both clocks, a does not step
    now[0] += LEASE_S + 0.2
    await asyncio.sleep(LEASE_S + 0.2)
    assert not a.is_leader  # known on waking, before any round trip
    await b.step()
    assert (b.is_leader, b.epoch) == (True, 2)
    fence_a = LeaseFence(LEADER_LEASE, "coord-a", 1)
    with pytest.raises(LeaseLostError):
        await a_store.save_rollout(rollout("running", 2.0), fence=fence_a)
    await a.step()
    assert (a.is_leader, a.leader_id, a.epoch) == (False, "coord-b", 2)
    assert [m.coordinator_id for m in a.alive()] == ["coord-a", "coord-b"]
    # a clean stop hands over at once
    await b.stop()
    await a.step()
    assert (a.is_leader, a.epoch) == (True, 3)
    assert [m.coordinator_id for m in a.members] == ["coord-a"]


async def test_on_postgresql_a_fenced_write_racing_a_takeover_is_ordered_by_the_lease_row(
    postgres_url: str,
) -> None:
    """The share lock of the lease row in a fenced write: a takeover under way (another
    coordinator's transaction that moved the lease, not committed yet) holds the fenced
    write up, and once committed the write sees it and is refused; a snapshot read alone
    would have let it through (the lease had not expired)."""
    a = PostgresFleetStore(postgres_url)
    await a.open()
    try:
        led = await a.acquire_lease(LEADER_LEASE, "coord-a", "ia", 30.0)
        async with await psycopg.AsyncConnection.connect(postgres_url) as other:
            await other.execute(
                "UPDATE leases SET holder = 'coord-b', incarnation = 'ib', epoch = epoch + 1,"
                " expires_at = clock_timestamp() + interval '30 seconds' WHERE name = %s",
                (LEADER_LEASE,),
            )
            write = asyncio.ensure_future(a.save_rollout(rollout("running", 2.0), fence=led.fence))
            await asyncio.sleep(0.5)
            assert not write.done()  # waits for the takeover to commit or roll back
            await other.commit()
            with pytest.raises(LeaseLostError):
                await write
        assert await a.get_rollout("ro_1") is None
        # and a change of the lease row (a takeover, a release) waits for a fenced write
        lease = await a.acquire_lease(LEADER_LEASE, "coord-b", "ib", 30.0)
        async with await psycopg.AsyncConnection.connect(postgres_url) as writer:
            await writer.execute(
                "SELECT 1 FROM leases WHERE name = %s AND epoch = %s FOR SHARE",
                (LEADER_LEASE, lease.epoch),
            )
            release = asyncio.ensure_future(a.release_lease(lease.fence))
            await asyncio.sleep(0.5)
            assert not release.done()
            await writer.commit()
            await release
        assert not await a.lease_valid(lease.fence)
    finally:
        await a.close()
