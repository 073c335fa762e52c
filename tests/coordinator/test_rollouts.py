"""The rollout engine: canary then waves, gates (self-check, error rate, TTFT regression
against the previous version, too few requests), automatic rollback, pause/resume/abort,
and a restart mid-rollout that resumes from the stored state.

A real fleet registry on a real SQLite store (its rollouts table too); the model catalog
and assignment layer are the in-memory stand-ins of ``model_sync_standins`` (their
interface is MODELSYNC.md's). Time is a clock the tests advance: no sleeping for soaks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.rollouts.engine import (
    RolloutConflictError,
    RolloutEngine,
    UnknownRolloutError,
    UnknownVersionError,
)
from coordinator.rollouts.gates import (
    InvalidStats,
    MergedHistogram,
    Verdict,
    check_stats,
)
from coordinator.rollouts.model import PolicyError, RolloutPolicy, RolloutState
from edgefleet.contract import (
    Hello,
    Histogram,
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    ModelStats,
    SelfCheckResult,
)
from tests.coordinator.model_sync_standins import Selector, StandinAssignments, StandinCatalog
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

__all__ = ["backend", "store_factory"]  # fixtures: every test runs on both stores

BOUNDS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
MODEL, OLD, NEW = "smollm2", "1", "2"
PASSED = SelfCheckResult(passed=True, perplexity_ratio=1.02)


def ttft(seconds: float, n: int) -> Histogram:
    """n observations of ``seconds`` in BOUNDS' buckets."""
    counts = [0] * (len(BOUNDS) + 1)
    index = next((i for i, b in enumerate(BOUNDS) if seconds <= b), len(BOUNDS))
    counts[index] = n
    return Histogram(upper_bounds=BOUNDS, counts=tuple(counts), sum=seconds * n)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Fleet:
    """Agents with live sessions on a real registry, the stand-ins, and the engine."""

    registry: LiveFleetRegistry
    assignments: StandinAssignments
    engine: RolloutEngine

    def __init__(self, make_store: StoreFactory) -> None:
        self.make_store = make_store
        self.store = make_store()
        self.stores = [self.store]
        self.sessions: dict[str, str] = {}
        self.catalog = StandinCatalog((MODEL, OLD), (MODEL, NEW), (MODEL, "3"))
        self.clock = Clock()
        self.audited: list[tuple[str, str, str]] = []

    @classmethod
    async def create(cls, make_store: StoreFactory, agents: int, sites: int = 1) -> Fleet:
        fleet = cls(make_store)
        await fleet.store.open()
        fleet.registry = await LiveFleetRegistry.open(fleet.store)
        for i in range(agents):
            agent_id = f"a{i:02d}"
            hello = Hello(agent_id=agent_id, site=f"site-{i % sites}")
            fleet.sessions[agent_id] = fleet.registry.open_session(hello)
        fleet.assignments = StandinAssignments(fleet.registry)
        await fleet.assignments.set_rule(Selector(), MODEL, OLD)
        fleet.engine = await fleet.new_engine()
        return fleet

    async def new_engine(self) -> RolloutEngine:
        """An engine as a (re)started coordinator makes it: a store of its own."""
        store = self.make_store()
        await store.open()
        self.stores.append(store)
        self.audited = []

        async def audit(*entry: str) -> None:
            self.audited.append((entry[0], entry[1], entry[2]))

        engine = RolloutEngine(
            store,
            catalog=self.catalog,
            assignments=self.assignments,
            selector_factory=Selector,
            registry=self.registry,
            clock=self.clock,
            audit=audit,
        )
        await engine.load()
        return engine

    def desired(self, agent_id: str) -> str:
        found = self.assignments.desired_for(agent_id).get(MODEL)
        return "" if found is None else found.version

    def report(
        self,
        agent_id: str,
        *,
        state: ModelInventoryState = ModelInventoryState.LOADED,
        check: SelfCheckResult | None = PASSED,
        stats: tuple[ModelStats, ...] = (),
        version: str = NEW,
    ) -> None:
        inventory = (ModelInventory(MODEL, version, state=state, self_check=check),)
        report = LoadReport(inventory=inventory, model_stats=stats)
        self.registry.record_report(agent_id, self.sessions[agent_id], report)
        self.engine.on_report(agent_id, report)

    def serve(self, agent_id: str, requests: int, *, failed: int = 0, seconds: float = 0.15,
              version: str = NEW) -> None:  # fmt: skip
        """The agent reports the new version loaded, and what it served."""
        stats = ModelStats(MODEL, version, requests=requests, failed=failed,
                           ttft_seconds=ttft(seconds, requests - failed))  # fmt: skip
        self.report(agent_id, stats=(stats,), version=version)

    def baseline(self, requests: int = 400, seconds: float = 0.15) -> None:
        """The previous version served this before the rollout (agent a00 reports it)."""
        stats = ModelStats(MODEL, OLD, requests=requests, ttft_seconds=ttft(seconds, requests))
        self.registry.record_report("a00", self.sessions["a00"], LoadReport(model_stats=(stats,)))
        self.engine.on_report("a00", LoadReport(model_stats=(stats,)))

    async def close(self) -> None:
        await self.registry.flush()
        for store in self.stores:
            await store.close()


@pytest.fixture
async def fleet(store_factory: StoreFactory) -> AsyncIterator[Fleet]:
    """On each store backend (tests/coordinator/store_backends.py)."""
    made = await Fleet.create(store_factory, agents=10)
    yield made
    await made.close()


def policy(**fields: object) -> RolloutPolicy:
    body: dict[str, object] = {"model": MODEL, "version": NEW, "soak_s": 600, **fields}
    return RolloutPolicy.from_json(body)


async def test_canary_then_waves_then_the_rule(fleet: Fleet) -> None:
    fleet.baseline()
    rollout = await fleet.engine.start(policy(canary_count=1, waves=[50, 100]), created_by="ops")
    assert rollout.previous_version == OLD
    assert [len(s) for s in rollout.plan] == [1, 4, 5]
    canary = rollout.plan[0]
    # Only the canary moved; everyone else still desires the old version.
    assert [fleet.desired(a) for a in sorted(fleet.sessions)] == [NEW] + [OLD] * 9
    assert (await fleet.engine.tick()).passed == ()  # nothing served yet
    fleet.serve(canary[0], 250)
    fleet.clock.advance(300)
    result = await fleet.engine.tick()
    assert (
        result.passed == ()
        and "soak 300/600 s" in (await fleet.engine.get(rollout.rollout_id)).detail
    )
    fleet.clock.advance(301)
    result = await fleet.engine.tick()
    assert result.passed == (rollout.rollout_id,) and result.moved == (rollout.rollout_id,)
    current = await fleet.engine.get(rollout.rollout_id)
    assert current.step == 1 and current.step_stats.requests == 0
    assert sum(fleet.desired(a) == NEW for a in fleet.sessions) == 5
    # Wave 1: stats of the canary no longer count (it is not this step's agent).
    fleet.serve(canary[0], 1000, failed=500)
    for agent_id in current.plan[1]:
        fleet.serve(agent_id, 60)
    fleet.clock.advance(601)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
    current = await fleet.engine.get(rollout.rollout_id)
    assert current.step == 2 and all(fleet.desired(a) == NEW for a in fleet.sessions)
    for agent_id in current.plan[2]:
        fleet.serve(agent_id, 50)
    fleet.clock.advance(601)
    result = await fleet.engine.tick()
    assert result.completed == (rollout.rollout_id,)
    done = await fleet.engine.get(rollout.rollout_id)
    assert done.state == RolloutState.COMPLETED
    # The rule names the new version and the per-agent overrides are gone.
    assert fleet.assignments.explicit == {}
    assert all(fleet.desired(a) == NEW for a in fleet.sessions)
    # An agent that joins later matches the rule: it gets the new version.
    fleet.sessions["late"] = fleet.registry.open_session(Hello(agent_id="late", site="site-0"))
    assert fleet.desired("late") == NEW
    events = [h["event"] for h in done.history]
    assert events == ["started", "step_moved", "step_passed", "step_moved", "step_passed",
                      "step_moved", "step_passed", "completed"]  # fmt: skip
    assert [a[0] for a in fleet.audited] == ["rollout step passed"] * 3 + ["rollout completed"]


async def test_a_failed_self_check_rolls_the_moved_agents_back(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_percent=20, waves=[100]))
    canary = rollout.plan[0]
    assert len(canary) == 2
    fleet.report(canary[0])  # fine
    fleet.report(
        canary[1],
        state=ModelInventoryState.FAILED,
        check=SelfCheckResult(passed=False, perplexity_ratio=1.8, greedy_matched=3,
                              greedy_total=5, detail="perplexity 1.80x fp32 (limit 1.15x)"),
    )  # fmt: skip
    result = await fleet.engine.tick()  # no soak, no requests needed to fail
    assert result.rolled_back == (rollout.rollout_id,)
    done = await fleet.engine.get(rollout.rollout_id)
    assert done.state == RolloutState.ROLLED_BACK
    assert f"agent {canary[1]}" in done.detail and "1.80x" in done.detail
    assert all(fleet.desired(a) == OLD for a in fleet.sessions)
    assert fleet.assignments.explicit == {}  # back on the rule they had
    # Never reached beyond the canary.
    moved = {a for kind, ids, _, v in fleet.assignments.changes if kind == "assign" and v == NEW
             for a in ids}  # fmt: skip
    assert moved == set(canary)
    assert fleet.engine.rollbacks == 1
    # A failed self-check reported while still loaded (not FAILED) fails it too.
    second = await fleet.engine.start(policy(canary_count=1))
    fleet.report(second.plan[0][0], check=SelfCheckResult(passed=False, detail="greedy 2/5"))
    assert (await fleet.engine.tick()).rolled_back == (second.rollout_id,)


async def test_the_error_rate_gate_rolls_back_before_the_soak_ends(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=2, max_error_rate=0.05))
    fleet.serve(rollout.plan[0][0], 100, failed=2)
    fleet.serve(rollout.plan[0][1], 100, failed=9)  # 11/200 = 5.5%
    fleet.clock.advance(10)
    assert (await fleet.engine.tick()).rolled_back == (rollout.rollout_id,)
    done = await fleet.engine.get(rollout.rollout_id)
    assert "error rate 0.0550 above 0.05" in done.detail
    assert done.last_gate is not None and done.last_gate["requests"] == 200
    assert all(fleet.desired(a) == OLD for a in fleet.sessions)


async def test_a_ttft_regression_against_the_previous_version_rolls_back(fleet: Fleet) -> None:
    fleet.baseline(requests=1000, seconds=0.15)
    rollout = await fleet.engine.start(policy(canary_count=1, max_ttft_p99_ratio=1.5))
    # The old version keeps serving on the other agents during the rollout: baseline too.
    fleet.serve("a05", 200, seconds=0.15, version=OLD)
    assert (await fleet.engine.get(rollout.rollout_id)).baseline.total == 1200
    fleet.serve(rollout.plan[0][0], 300, seconds=0.7)  # several times slower, none failed
    fleet.clock.advance(5)
    assert (await fleet.engine.tick()).rolled_back == (rollout.rollout_id,)
    done = await fleet.engine.get(rollout.rollout_id)
    assert "TTFT p99" in done.detail and "limit 1.5x" in done.detail
    gate = done.last_gate
    assert gate is not None and gate["ttft_ratio"] > 1.5 and gate["failed"] == 0
    # p99s come from the merged histograms: 0.15 s in (0.1, 0.2] and 0.7 s in (0.4, 0.8].
    assert 0.1 < gate["baseline_ttft_p99_s"] <= 0.2 and 0.4 < gate["ttft_p99_s"] <= 0.8
    assert fleet.desired(rollout.plan[0][0]) == OLD


async def test_no_baseline_means_no_ttft_comparison_but_the_rest_still_holds(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=1, waves=[100], soak_s=0))
    fleet.serve(rollout.plan[0][0], 250, seconds=2.0)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
    gate = (await fleet.engine.get(rollout.rollout_id)).history[-2]["gate"]
    assert gate["baseline_ttft_p99_s"] is None and gate["ttft_ratio"] is None


async def test_the_gate_compares_with_unmoved_agents_over_the_same_step(fleet: Fleet) -> None:
    """The whole fleet slows down during the step (a load surge): the new version is as
    fast as the old one on the agents not moved, so the step passes, although it is 4x
    the previous version's history."""
    fleet.baseline(requests=10_000, seconds=0.15)
    rollout = await fleet.engine.start(policy(canary_count=1, waves=[100], soak_s=0,
                                        max_ttft_p99_ratio=1.5))  # fmt: skip
    canary = rollout.plan[0][0]
    others = [a for a in sorted(fleet.sessions) if a != canary]
    fleet.serve(others[0], 60, seconds=0.6, version=OLD)
    fleet.serve(canary, 300, seconds=0.7)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
    gate = (await fleet.engine.get(rollout.rollout_id)).history[-2]["gate"]
    assert gate["baseline_source"] == "control" and gate["ttft_ratio"] <= 1.5
    assert 0.4 < gate["baseline_ttft_p99_s"] <= 0.8
    # The next step starts a new control group: nothing yet, so the history is the
    # baseline (the surge's 60 requests are under 1% of it) and 0.7 s fails against it.
    moved = (await fleet.engine.get(rollout.rollout_id)).plan[1]
    for agent_id in moved:
        fleet.serve(agent_id, 30, seconds=0.7)
    assert (await fleet.engine.tick()).rolled_back == (rollout.rollout_id,)
    done = await fleet.engine.get(rollout.rollout_id)
    assert done.last_gate is not None and done.last_gate["baseline_source"] == "history"
    assert "its recent history" in done.detail


async def test_the_old_version_on_a_swapping_agent_is_not_a_baseline(fleet: Fleet) -> None:
    """A moved agent keeps serving the old version while it loads and self-checks the new
    one; those slow requests measure the swap and would hide a regression."""
    fleet.baseline(requests=1000, seconds=0.15)
    rollout = await fleet.engine.start(policy(canary_count=1, max_ttft_p99_ratio=1.5))
    canary = rollout.plan[0][0]
    fleet.serve(canary, 500, seconds=3.0, version=OLD)  # the swap's slow requests
    running = await fleet.engine.get(rollout.rollout_id)
    assert running.baseline.total == 1000 and running.control.total == 0
    fleet.serve(canary, 300, seconds=0.7)
    fleet.clock.advance(5)
    assert (await fleet.engine.tick()).rolled_back == (rollout.rollout_id,)
    gate = (await fleet.engine.get(rollout.rollout_id)).last_gate
    assert gate is not None and gate["baseline_source"] == "history"
    assert gate["ttft_ratio"] > 1.5


async def test_too_few_requests_is_not_passed(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=1))
    canary = rollout.plan[0][0]
    fleet.serve(canary, 150)
    fleet.clock.advance(10_000)
    for _ in range(3):
        result = await fleet.engine.tick()
        assert result.passed == () and result.rolled_back == ()
    waiting = await fleet.engine.get(rollout.rollout_id)
    assert waiting.state == RolloutState.RUNNING and "150/200 requests" in waiting.detail
    assert waiting.last_gate is not None and waiting.last_gate["verdict"] == Verdict.WAIT
    fleet.serve(canary, 50)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)


async def test_a_step_needs_every_moved_agent_loaded(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=2, soak_s=0))
    first, second = rollout.plan[0]
    fleet.serve(first, 300)
    fleet.report(second, state=ModelInventoryState.DOWNLOADING, check=None)
    assert (await fleet.engine.tick()).passed == ()
    assert "1/2 moved agents loaded" in (await fleet.engine.get(rollout.rollout_id)).detail
    fleet.report(second, state=ModelInventoryState.LOADED, check=None)  # no self-check yet
    assert (await fleet.engine.tick()).passed == ()
    fleet.report(second)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)


async def test_step_timeout_fails_a_step_that_never_passes(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=1, soak_s=60, step_timeout_s=3600))
    fleet.clock.advance(3601)
    assert (await fleet.engine.tick()).rolled_back == (rollout.rollout_id,)
    assert "step_timeout_s=3600" in (await fleet.engine.get(rollout.rollout_id)).detail


async def test_pause_resume_and_abort(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=1, waves=[100]))
    canary = rollout.plan[0][0]
    fleet.serve(canary, 300)
    fleet.clock.advance(200)
    await fleet.engine.pause(rollout.rollout_id)
    fleet.clock.advance(10_000)  # paused: the soak clock stops, nothing moves
    assert await fleet.engine.tick() == (await fleet.engine.tick()).__class__()
    paused = await fleet.engine.get(rollout.rollout_id)
    assert paused.state == RolloutState.PAUSED and paused.step == 0
    assert fleet.engine.gate(paused).soak_elapsed_s == pytest.approx(200)
    await fleet.engine.resume(rollout.rollout_id)
    assert (await fleet.engine.tick()).passed == ()  # 200 s of 600 soaked
    fleet.clock.advance(401)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
    assert sum(fleet.desired(a) == NEW for a in fleet.sessions) == 10
    aborted = await fleet.engine.abort(rollout.rollout_id)
    assert aborted.state == RolloutState.ABORTED and "sent back" in aborted.detail
    assert all(fleet.desired(a) == OLD for a in fleet.sessions)
    with pytest.raises(RolloutConflictError, match="aborted already"):
        await fleet.engine.pause(rollout.rollout_id)
    with pytest.raises(UnknownRolloutError):
        await fleet.engine.resume("ro-nope")
    # Abort keeping the moved agents where they are.
    kept = await fleet.engine.start(policy(canary_count=3))
    await fleet.engine.abort(kept.rollout_id, rollback=False)
    assert sum(fleet.desired(a) == NEW for a in fleet.sessions) == 3


async def test_an_agent_pinned_elsewhere_goes_back_to_its_own_version(fleet: Fleet) -> None:
    await fleet.assignments.assign(["a00"], MODEL, "3")  # an operator's pin before the rollout
    rollout = await fleet.engine.start(policy(canary_count=2))
    assert rollout.prior["a00"] == "3" and rollout.previous_version == OLD
    await fleet.engine.abort(rollout.rollout_id)
    assert fleet.desired("a00") == "3" and fleet.desired("a01") == OLD


async def test_a_restart_mid_rollout_resumes_from_the_stored_state(fleet: Fleet) -> None:
    fleet.baseline()
    rollout = await fleet.engine.start(policy(canary_count=1, waves=[50, 100]))
    fleet.serve(rollout.plan[0][0], 250)
    fleet.clock.advance(601)
    await fleet.engine.tick()  # canary passed, wave 1 moved
    wave = (await fleet.engine.get(rollout.rollout_id)).plan[1]
    for agent_id in wave:
        fleet.serve(agent_id, 30)
    await fleet.engine.tick()  # the stats are saved with the tick
    fleet.clock.advance(400)
    # The coordinator restarts: a new engine on the same database, nothing in memory.
    fleet.engine = await fleet.new_engine()
    resumed = await fleet.engine.get(rollout.rollout_id)
    assert resumed.state == RolloutState.RUNNING and resumed.step == 1
    assert resumed.step_stats.requests == 120 and resumed.baseline.total == 400
    for agent_id in wave:
        fleet.serve(agent_id, 30)
    # The soak counts from the stored start: 400 s before the restart + 201 s after.
    fleet.clock.advance(201)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
    final = await fleet.engine.get(rollout.rollout_id)
    assert final.step == 2
    for agent_id in final.plan[2]:
        fleet.serve(agent_id, 50)
    fleet.clock.advance(601)
    assert (await fleet.engine.tick()).completed == (rollout.rollout_id,)
    assert [r.rollout_id for r in await fleet.engine.rollouts((RolloutState.COMPLETED,))] == [
        rollout.rollout_id
    ]


async def test_start_is_refused_clearly(fleet: Fleet) -> None:
    with pytest.raises(UnknownVersionError, match="smollm2@9 is not in the catalog"):
        await fleet.engine.start(policy(version="9"))
    fleet.catalog.entries[(MODEL, "3")] = fleet.catalog.entries[(MODEL, "3")].__class__(
        MODEL, "3", deprecated=True
    )
    with pytest.raises(RolloutConflictError, match="deprecated"):
        await fleet.engine.start(policy(version="3"))
    with pytest.raises(RolloutConflictError, match="matches no agent"):
        await fleet.engine.start(policy(selector={"sites": ["nowhere"]}))
    first = await fleet.engine.start(policy())
    with pytest.raises(RolloutConflictError, match=first.rollout_id):
        await fleet.engine.start(policy())


async def test_selector_limits_the_rollout(store_factory: StoreFactory) -> None:
    fleet = await Fleet.create(store_factory, agents=6, sites=3)
    try:
        rollout = await fleet.engine.start(policy(selector={"sites": ["site-1"]}, canary_count=5))
        assert rollout.plan == [["a01", "a04"]]
        await fleet.engine.abort(rollout.rollout_id, rollback=False)
        assert {a for a in fleet.sessions if fleet.desired(a) == NEW} == {"a01", "a04"}
    finally:
        await fleet.close()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"version": NEW}, "model"),
        ({"model": MODEL, "version": "../x"}, "version"),
        ({"model": MODEL, "version": NEW, "waves": [50]}, "waves"),
        ({"model": MODEL, "version": NEW, "waves": [60, 40, 100]}, "waves"),
        ({"model": MODEL, "version": NEW, "waves": "all"}, "waves"),
        ({"model": MODEL, "version": NEW, "canary_count": 0}, "canary_count"),
        ({"model": MODEL, "version": NEW, "canary_count": 1, "canary_percent": 5},
         "canary_count"),
        ({"model": MODEL, "version": NEW, "canary_percent": 0}, "canary_percent"),
        ({"model": MODEL, "version": NEW, "min_requests": -1}, "min_requests"),
        ({"model": MODEL, "version": NEW, "max_error_rate": 2}, "max_error_rate"),
        ({"model": MODEL, "version": NEW, "max_ttft_p99_ratio": 0.5}, "max_ttft_p99_ratio"),
        ({"model": MODEL, "version": NEW, "soak_s": float("nan")}, "soak_s"),
        ({"model": MODEL, "version": NEW, "soak_s": True}, "soak_s"),
        ({"model": MODEL, "version": NEW, "selector": {"sites": "a"}}, "selector.sites"),
        ({"model": MODEL, "version": NEW, "selector": {"labels": ["nokey"]}}, "selector.labels"),
        ({"model": MODEL, "version": NEW, "selector": {"zone": []}}, "selector"),
        ({"model": MODEL, "version": NEW, "from_version": NEW}, "from_version"),
        ({"model": MODEL, "version": NEW, "speed": "fast"}, "speed"),
    ],
)  # fmt: skip
async def test_policy_validation(body: dict[str, object], param: str) -> None:
    with pytest.raises(PolicyError) as caught:
        RolloutPolicy.from_json(body)
    assert caught.value.param == param


async def test_plan_sizes() -> None:
    agents = [f"a{i:03d}" for i in range(100)]
    steps = policy(canary_percent=5, waves=[25, 50, 100]).plan(agents)
    assert [len(s) for s in steps] == [5, 20, 25, 50]
    assert [a for s in steps for a in s] == agents
    assert [len(s) for s in policy(canary_count=30, waves=[20, 100]).plan(agents)] == [30, 70]
    assert policy(canary_count=5).plan(agents[:3]) == [agents[:3]]


async def test_merged_histograms_give_the_fleet_p99_never_an_average() -> None:
    # Agent A: 990 fast requests; agent B: 10 very slow ones. The fleet's p99 sits at the
    # boundary of the slow bucket; averaging the two agents' p99s would say ~1.2 s.
    fast, slow = ttft(0.04, 990), ttft(3.0, 10)
    merged = MergedHistogram()
    merged.add(fast)
    merged.add(slow)
    assert merged.total == 1000
    assert merged.quantile(0.99) == pytest.approx(0.05)
    assert merged.quantile(0.995) == pytest.approx(1.6 + 1.6 * 0.5)
    # Other bounds are re-bucketed upwards (a merge never makes a version look faster).
    other = Histogram(upper_bounds=(0.3, 5.0), counts=(10, 0, 0), sum=1.0)
    merged.add(other)
    assert merged.counts[BOUNDS.index(0.4)] == 10 and merged.total == 1010
    assert MergedHistogram().quantile(0.99) is None
    assert MergedHistogram.from_json(merged.json()).counts == merged.counts


@pytest.mark.parametrize(
    "stats",
    [
        ModelStats(MODEL, NEW, requests=-1),
        ModelStats(MODEL, NEW, requests=5, failed=6),
        ModelStats(MODEL, NEW, requests=5, ttft_seconds=Histogram((1.0,), (1,))),
        ModelStats(MODEL, NEW, requests=5, ttft_seconds=Histogram((1.0, 0.5), (1, 1, 1))),
        ModelStats(MODEL, NEW, requests=5, ttft_seconds=Histogram((float("inf"),), (1, 1))),
        ModelStats(MODEL, NEW, requests=5, ttft_seconds=Histogram((1.0,), (9, 0))),
        ModelStats(MODEL, NEW, requests=5, ttft_seconds=Histogram((1.0,), (1, 0), float("nan"))),
    ],
)
async def test_impossible_stats_are_refused(stats: ModelStats, fleet: Fleet) -> None:
    with pytest.raises(InvalidStats):
        check_stats(stats)
    rollout = await fleet.engine.start(policy(canary_count=1))
    fleet.report(rollout.plan[0][0], stats=(stats,))
    assert (await fleet.engine.get(rollout.rollout_id)).step_stats.requests == 0
    assert fleet.engine.invalid_stats == 1


async def test_an_agent_removed_from_the_fleet_is_not_waited_for(fleet: Fleet) -> None:
    rollout = await fleet.engine.start(policy(canary_count=2, soak_s=0))
    first, second = rollout.plan[0]
    fleet.serve(first, 300)
    assert (await fleet.engine.tick()).passed == ()
    assert "1/2 moved agents loaded" in (await fleet.engine.get(rollout.rollout_id)).detail
    fleet.registry.remove(second)
    assert (await fleet.engine.tick()).passed == (rollout.rollout_id,)
