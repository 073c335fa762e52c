"""The rollout engine runs only on the leader (issue 24): two engines on one database, each
with a leadership backed by the store's real ``leader`` lease (its epoch and fence). The
leader's rollout writes are fenced; once another coordinator took the lease over, the old
leader's next write is refused (LeaseLostError) before it pushes anything, it stops at
once, and the new leader resumes the rollout from the store at the same step with its soak
time kept. On both store backends; a clock the tests advance (no sleeping for soaks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.rollouts.engine import NotLeaderError, RolloutEngine, TickResult
from coordinator.rollouts.model import RolloutState
from coordinator.store.membership import LeaseFence, LeaseLostError, LeaseState
from tests.coordinator.model_sync_standins import Selector
from tests.coordinator.store_backends import StoreFactory, backend, store_factory
from tests.coordinator.test_rollouts import NEW, Fleet, policy

__all__ = ["backend", "store_factory"]  # fixtures: every test runs on both stores

LEASE_S = 60.0


class Lease:
    """A coordinator's view of the leader lease, as ClusterMembership keeps it: what it
    last got from ``acquire_lease``, believed until told otherwise (a leader paused or cut
    off does not know it was superseded: only the database's fence check tells it)."""

    def __init__(self, store: object, holder: str) -> None:
        self._store = store
        self.holder = holder
        self.state: LeaseState | None = None
        self.lost_calls: list[LeaseLostError] = []

    async def take(self) -> bool:
        self.state = await self._store.acquire_lease(  # type: ignore[attr-defined]
            "leader", self.holder, self.holder + "-process", LEASE_S
        )
        return self.state.held

    @property
    def fence(self) -> LeaseFence | None:
        return self.state.fence if self.state is not None and self.state.held else None

    def lost(self, exc: LeaseLostError) -> None:
        self.lost_calls.append(exc)
        self.state = None


class Pushes:
    """Counts the assignment layer's pushes (assign, clear, set_rule)."""

    def __init__(self, fleet: Fleet) -> None:
        self.count = 0
        inner = fleet.assignments
        for name in ("assign", "clear", "set_rule"):
            original = getattr(inner, name)

            def counted(*args: object, _original: object = original, **kw: object) -> object:
                self.count += 1
                return _original(*args, **kw)  # type: ignore[operator]

            setattr(inner, name, counted)


async def engine_for(fleet: Fleet, lease: Lease) -> tuple[RolloutEngine, list[str]]:
    """An engine as a coordinator makes it (a store connection of its own), led by
    ``lease``; and the audit entries it writes."""
    store = fleet.make_store()
    await store.open()
    fleet.stores.append(store)
    audited: list[str] = []

    async def audit(action: str, rollout_id: str, detail: str) -> None:
        audited.append(f"{action}: {detail}")

    engine = RolloutEngine(
        store,
        catalog=fleet.catalog,
        assignments=fleet.assignments,
        selector_factory=Selector,
        registry=fleet.registry,
        clock=fleet.clock,
        audit=audit,
        leadership=lease,
    )
    await engine.load()
    return engine, audited


@pytest.fixture
async def fleet(store_factory: StoreFactory) -> AsyncIterator[Fleet]:
    made = await Fleet.create(store_factory, agents=10)
    yield made
    await made.close()


async def test_a_superseded_leader_writes_nothing_and_the_new_one_resumes_the_soak(
    fleet: Fleet,
) -> None:
    lease_a, lease_b = Lease(fleet.store, "coord-a"), Lease(fleet.store, "coord-b")
    assert await lease_a.take()
    a, audited_a = await engine_for(fleet, lease_a)
    b, audited_b = await engine_for(fleet, lease_b)
    assert a.active and not b.active
    assert not await lease_b.take()  # a holds it

    # a leads: the canary passes, wave 1 moves and soaks
    fleet.engine = a  # the agents' reports reach a
    fleet.baseline()
    rollout = await a.start(policy(canary_count=1, waves=[50, 100]))
    fleet.serve(rollout.plan[0][0], 250)
    fleet.clock.advance(601)
    assert (await a.tick()).passed == (rollout.rollout_id,)
    wave = (await a.get(rollout.rollout_id)).plan[1]
    started = (await a.get(rollout.rollout_id)).step_started_at
    for agent_id in wave:
        fleet.serve(agent_id, 30)
    await a.tick()  # the step's stats are saved with the tick
    fleet.clock.advance(400)

    # b is not the leader: it runs nothing, and refuses actions (the API forwards them)
    assert await b.tick() == TickResult()
    assert not b.active
    with pytest.raises(NotLeaderError):
        await b.pause(rollout.rollout_id)
    assert (await b.get(rollout.rollout_id)).step == 1  # reads: from the store

    # a is frozen past its lease: b takes the lease over (a new epoch); a does not know
    await fleet.store.release_lease(lease_a.state.fence)  # type: ignore[union-attr]
    assert await lease_b.take()
    assert lease_b.fence is not None and lease_a.fence is not None
    assert lease_b.fence.epoch == lease_a.fence.epoch + 1
    assert (await b.tick()).passed == ()  # takes over: 400 s of the 600 s soak are over
    assert b.active and b.takeovers == 1
    resumed = await b.get(rollout.rollout_id)
    assert resumed.state == RolloutState.RUNNING and resumed.step == 1
    assert resumed.step_started_at == started  # the soak goes on, not started again
    assert resumed.step_stats.requests == 120
    assert resumed.last_gate is not None and 399 < resumed.last_gate["soak_elapsed_s"] < 401
    fleet.engine = b

    # a wakes at the end of the soak: its step would pass, but its first write is
    # refused (fenced) before it pushes anything, and it stops
    fleet.clock.advance(201)
    pushes = Pushes(fleet)
    with pytest.raises(NotLeaderError, match="no longer leads"):
        await a.tick()
    assert pushes.count == 0 and not a.active and len(lease_a.lost_calls) == 1
    assert audited_a == ["rollout step passed: step 0: 250 requests"]
    stored = await fleet.store.get_rollout(rollout.rollout_id)
    assert stored is not None and stored.body["step"] == 1
    assert await a.tick() == TickResult()  # inactive: nothing (no lease)
    assert pushes.count == 0

    # b: the soak counts from the stored start (601 s), so the step passes now, once
    for agent_id in wave:
        fleet.serve(agent_id, 30)
    assert (await b.tick()).passed == (rollout.rollout_id,)
    assert pushes.count == 1  # step 2 moved by b
    assert fleet.desired(resumed.plan[2][0]) == NEW
    assert audited_b == ["rollout step passed: step 1: 240 requests"]
    history = [(h["event"], h.get("step")) for h in (await b.get(rollout.rollout_id)).history]
    assert history.count(("step_passed", 1)) == 1 and history.count(("step_passed", 0)) == 1
    assert history.count(("step_moved", 2)) == 1


async def test_a_leader_again_reloads_from_the_store(fleet: Fleet) -> None:
    """Leading again (a new tenure): what it had in memory is gone; the store's state is
    what it resumes, including what the other leader did meanwhile (a pause)."""
    lease_a, lease_b = Lease(fleet.store, "coord-a"), Lease(fleet.store, "coord-b")
    assert await lease_a.take()
    a, _ = await engine_for(fleet, lease_a)
    b, _ = await engine_for(fleet, lease_b)
    rollout = await a.start(policy(canary_count=1))
    fleet.clock.advance(100)
    await fleet.store.release_lease(lease_a.fence)  # type: ignore[arg-type]
    assert await lease_b.take()
    paused = await b.pause(rollout.rollout_id)  # b leads: it loads, then pauses
    assert paused.state == RolloutState.PAUSED and b.active
    fleet.clock.advance(50)
    await fleet.store.release_lease(lease_b.fence)  # type: ignore[arg-type]
    assert await lease_a.take()
    await a.tick()
    assert a.active and a.takeovers == 2
    again = await a.get(rollout.rollout_id)
    assert again.state == RolloutState.PAUSED and again.step == 0
    resumed = await a.resume(rollout.rollout_id)
    # 100 s soaked, paused 50 s: the soak clock stopped meanwhile
    assert resumed.step_started_at == fleet.clock.now - 100
    with pytest.raises(NotLeaderError):
        await b.abort(rollout.rollout_id)  # b: refused by its own clock, or the fence
    stored = await fleet.store.get_rollout(rollout.rollout_id)
    assert stored is not None and stored.state == RolloutState.RUNNING.value
