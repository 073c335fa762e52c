"""The registry's load table: the router's fast path (``RouteScorer.rank_rows``)
answers exactly as scoring the records does, through every kind of registry change, and
the liveness sweep, which looks only at the agents the table names, changes every agent
it should.

A real registry on a real SQLite store is put through sessions, reports (loaded,
saturated, unhealthy, draining, with inventories), operator drains, missed reports
(suspect, down), ends of sessions and removals; after each step many random queries are
asked of the router twice, with the fast path and with it turned off, and the decisions
must be equal: the same agents in the same order with the same scores and parts, the
same exclusion counts and the same reason.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.records import AgentStatus, Liveness
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.routing.scorer import RouteDecision, RouteQuery, RouteScorer
from coordinator.routing.service import Router
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import (
    Hello,
    LoadedModel,
    LoadReport,
    Location,
    ModelInventory,
    ModelInventoryState,
)

MODELS = ("m1", "m2")
SITES = ("paris", "lyon", "berlin", "")


def _hello(rng: random.Random, agent_id: str) -> Hello:
    placed = rng.random() > 0.1
    return Hello(
        agent_id=agent_id,
        site=rng.choice(SITES),
        http_url="" if rng.random() < 0.05 else f"http://{agent_id}:8000",
        location=Location(rng.uniform(40, 55), rng.uniform(-5, 20)) if placed else None,
        models=tuple(LoadedModel(m, "v1") for m in MODELS if rng.random() < 0.8)
        or (LoadedModel("m1", "v1"),),
    )


def _report(rng: random.Random) -> LoadReport:
    inventory: tuple[ModelInventory, ...] = ()
    if rng.random() < 0.2:  # an inventory: what it serves now, maybe a second version
        inventory = tuple(
            ModelInventory(
                name=m,
                version=rng.choice(("v1", "v2")),
                state=rng.choice((ModelInventoryState.LOADED, ModelInventoryState.LOADING)),
            )
            for m in MODELS
        )
    return LoadReport(
        running_sequences=rng.randrange(8),
        waiting_sequences=rng.choice((0, 0, 1, 3, 64)),  # 64: saturated by queue
        tokens_per_second=rng.choice((0.0, rng.uniform(5, 60))),
        kv_cache_used_fraction=rng.choice((rng.uniform(0, 0.9), 0.99)),  # 0.99: saturated
        draining=rng.random() < 0.05,
        unhealthy_reason="disk full" if rng.random() < 0.05 else "",
        inventory=inventory,
        # models it serves but loads on demand: the fast path leaves lookups of a model
        # cold on a candidate to rank (rare here, or the share asked below would not hold)
        cold_models=tuple(
            (m, round(rng.uniform(0.2, 3), 3)) for m in MODELS if rng.random() < 0.005
        ),
    )


def _queries(rng: random.Random, ids: list[str], n: int) -> list[RouteQuery]:
    queries = []
    for _ in range(n):
        queries.append(
            RouteQuery(
                model=rng.choice((*MODELS, "absent")),
                location=rng.choice((None, Location(rng.uniform(40, 55), rng.uniform(-5, 20)))),
                site=rng.choice(SITES),
                max_wait_ms=rng.choice((0, 0, 500, 5000)),
                limit=rng.choice((0, 1, 3, 50)),
                # what only the reference path takes: still answered, the same way
                version=rng.choice((None,) * 9 + ("v2",)),
                exclude=frozenset(rng.sample(ids, 1))
                if ids and rng.random() < 0.1
                else frozenset(),
            )
        )
    return queries


class _Counting(RouteScorer):
    """A scorer that counts the lookups its fast path answered."""

    fast = 0

    def rank_rows(self, *args: object, **kwargs: object) -> RouteDecision | None:
        decision = super().rank_rows(*args, **kwargs)  # type: ignore[arg-type]
        self.fast += decision is not None
        return decision


class _ReferenceOnly(RouteScorer):
    def rank_rows(self, *args: object, **kwargs: object) -> None:
        return None


def _routers(registry: LiveFleetRegistry, pool: int) -> tuple[Router, Router, _Counting]:
    config = CoordinatorConfig()
    metrics = CoordinatorMetrics(registry)
    reference = Router.from_config(registry, config, metrics)
    fast_scorer = _Counting(reference._scorer.policy)
    fast = Router(registry, fast_scorer, reference._overflow, metrics, candidate_pool=pool)
    slow = Router(
        registry,
        _ReferenceOnly(fast_scorer.policy),
        reference._overflow,
        metrics,
        candidate_pool=pool,
    )
    # both share one policy object, so the table stays derived for the fast one
    assert registry.load_table.derived_for is fast_scorer.policy
    return fast, slow, fast_scorer


def _same(fast: RouteDecision, slow: RouteDecision, query: RouteQuery) -> None:
    assert fast.agents == slow.agents, query
    assert dict(fast.excluded) == dict(slow.excluded), query
    assert fast.reason == slow.reason, query
    assert fast.overflow == slow.overflow, query


@pytest.mark.parametrize("pool", [64, 5])
async def test_the_fast_path_decides_as_the_records_do(tmp_path: Path, pool: int) -> None:
    rng = random.Random(20261202 + pool)
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        registry = await LiveFleetRegistry.open(store, clock=lambda: now[0])
        fast, slow, counting = _routers(registry, pool)
        sessions: dict[str, str] = {}
        asked = 0

        def check(n: int = 40) -> None:
            nonlocal asked
            ids = sorted(sessions)
            table = registry.load_table
            for agent_id, row in table.row.items():  # the table holds every current record
                assert table.records[row] is registry.get(agent_id), agent_id
            for query in _queries(rng, ids, n):
                # the index samples agents of unknown place at random (more than the pool
                # of them): both routers draw the same sample
                drawn = registry.index._rng.getstate()
                decided = fast.route(query)
                registry.index._rng.setstate(drawn)
                _same(decided, slow.route(query), query)
                asked += 1

        for i in range(120):
            agent_id = f"a{i:03d}"
            sessions[agent_id] = registry.open_session(_hello(rng, agent_id))
        check()
        for step in range(12):
            for agent_id, session_id in sessions.items():
                if rng.random() < 0.9:
                    registry.record_report(agent_id, session_id, _report(rng))
            check()
            for agent_id in rng.sample(sorted(sessions), 5):
                registry.set_draining(agent_id, rng.random() < 0.5)
            check()
            if step % 3 == 1:  # some go silent: suspect, then down
                now[0] += timedelta(seconds=5 if step < 6 else 11)
                registry.sweep()
                check()
            if step == 4:  # sessions end; some agents come back with a new Hello
                ended = rng.sample(sorted(sessions), 20)
                for agent_id in ended:
                    registry.close_session(agent_id, sessions[agent_id])
                check()
                for agent_id in ended[:10]:
                    sessions[agent_id] = registry.open_session(_hello(rng, agent_id))
                check()
            if step == 7:  # agents removed, new ones take their rows
                for agent_id in rng.sample(sorted(sessions), 8):
                    registry.remove(agent_id)
                    del sessions[agent_id]
                for i in range(8):
                    agent_id = f"new{i}"
                    sessions[agent_id] = registry.open_session(_hello(rng, agent_id))
                check()
        # the fast path answered most of the lookups (the rest asked what only rank does)
        assert counting.fast > asked * 0.6, (counting.fast, asked)
        assert len(registry.load_table) == registry.known_count()
    finally:
        await store.close()


def test_the_fast_path_is_off_for_a_table_derived_by_another_policy() -> None:
    """A scorer whose policy did not derive the table's columns must not read them."""
    from coordinator.fleet.load_table import LoadTable

    table = LoadTable()
    mine, other = RouteScorer(), RouteScorer()
    table.derive_with(other.policy, other.derive, 0.5)
    assert mine.rank_rows(table, [], RouteQuery(model="m1")) is None
    assert other.rank_rows(table, [], RouteQuery(model="m1")) is not None


def _expected_liveness(
    registry: LiveFleetRegistry, now: datetime, down_after: timedelta, suspect_after: timedelta
) -> dict[str, str]:
    """What a sweep at ``now`` makes of every record: the sweep's rule, over every
    agent (the sweep itself only looks at those the load table names)."""
    expected = {}
    for record in registry.agents():
        liveness = record.liveness
        if liveness is Liveness.UNCONFIRMED or liveness is Liveness.DOWN:
            pass  # (no unconfirmed agents here: nothing restored)
        elif record.last_seen <= now - down_after:
            liveness = Liveness.DOWN
        elif record.last_seen <= now - suspect_after or record.status is AgentStatus.DISCONNECTED:
            liveness = Liveness.SUSPECT
        expected[record.agent_id] = liveness.value
    return expected


async def test_the_sweep_changes_every_agent_it_should_and_no_other(tmp_path: Path) -> None:
    """The sweep looks only at the agents the load table names: each step, what it
    leaves behind must equal the rule applied to every record (silences ending exactly
    at the cut included: the table's float timestamps must not lose one)."""
    rng = random.Random(7)
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = SQLiteFleetStore.in_directory(tmp_path)
    await store.open()
    try:
        registry = await LiveFleetRegistry.open(
            store, report_interval_ms=1000, clock=lambda: now[0]
        )
        down_after, suspect_after = timedelta(seconds=5), timedelta(seconds=2)
        sessions = {
            f"a{i:03d}": registry.open_session(_hello(rng, f"a{i:03d}")) for i in range(300)
        }
        changed = 0
        for _ in range(40):
            # time moves by whole and odd amounts, so some silences end exactly on the cut
            now[0] += rng.choice(
                (timedelta(milliseconds=250), timedelta(seconds=1), timedelta(microseconds=333_333))
            )
            for agent_id, session_id in list(sessions.items()):
                roll = rng.random()
                if roll < 0.5:
                    registry.record_report(agent_id, session_id, _report(rng))
                elif roll < 0.51:
                    registry.close_session(agent_id, session_id)
                elif roll < 0.52 and registry.get(agent_id).status is AgentStatus.DISCONNECTED:
                    sessions[agent_id] = registry.open_session(_hello(rng, agent_id))
            expected = _expected_liveness(registry, now[0], down_after, suspect_after)
            changed += len(registry.sweep())
            assert {r.agent_id: r.liveness.value for r in registry.agents()} == expected
        assert changed > 100  # agents went suspect and down, and came back
    finally:
        await store.close()
