"""The overflow distributor's tick over a large fleet: pushes only what changed, makes no
new peer targets for peers that did not change, and lets the event loop serve while it
works (coordinator.routing.overflow.OverflowDistributor)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from coordinator.routing.overflow import (
    TICK_SLICE,
    OverflowDistributor,
    OverflowTargetsFile,
    peers_by_site,
)
from edgefleet.contract import (
    DesiredState,
    Hello,
    LoadedModel,
    LoadReport,
    OverflowTargetsSection,
)
from tests.coordinator.coordinator_testing import sampled_meanwhile

pytestmark = pytest.mark.timeout(30)

NOW = datetime(2026, 12, 2, tzinfo=UTC)


def record(i: int, *, waiting: int = 1) -> AgentRecord:
    return AgentRecord(
        hello=Hello(
            agent_id=f"a{i:05d}",
            site=f"s{i % 100}",
            http_url=f"http://10.0.{i % 250}.{i // 250}:8000",
            models=(LoadedModel("m", "v1"),),
        ),
        status=AgentStatus.CONNECTED,
        session_id="s",
        connected_since=NOW,
        last_seen=NOW,
        last_report=LoadReport(waiting_sequences=waiting),
    )


class Fleet:
    """The registry's side: records, and the sections set on them (as set_section does)."""

    def __init__(self, count: int) -> None:
        self.records = {r.agent_id: r for r in (record(i) for i in range(count))}
        self.pushed: list[str] = []

    def agents(self) -> list[AgentRecord]:
        return [self.records[k] for k in sorted(self.records)]

    def set_section(self, agent_id: str, section: OverflowTargetsSection) -> None:
        held = self.records[agent_id]
        desired = held.desired.with_section(replace(section, generation=len(self.pushed) + 1))
        self.records[agent_id] = replace(held, desired=desired)
        self.pushed.append(agent_id)


def distributor(fleet: Fleet, spread_s: float = 0.0) -> OverflowDistributor:
    return OverflowDistributor(
        OverflowTargetsFile(),
        fleet.agents,
        fleet.set_section,
        saturation_queue_depth=64,
        spread_s=spread_s,
    )


async def test_a_second_tick_over_an_unchanged_fleet_pushes_nothing() -> None:
    fleet = Fleet(12 * TICK_SLICE)  # several slices, and peers at each of 100 sites
    targets = distributor(fleet)
    assert await targets.tick() == len(fleet.records)
    first = {a: r.desired.overflow_targets for a, r in fleet.records.items()}
    # what each agent got: its site's other agents, most room first
    sites = peers_by_site(list(fleet.records.values()), 64)
    some = fleet.records["a00007"]
    got = first["a00007"]
    assert got is not None
    assert got.targets == tuple(t for t in sites["s7"] if t.name != "a00007")
    # new records (new reports), the same Hellos and room: nothing to push
    for agent_id, held in list(fleet.records.items()):
        fleet.records[agent_id] = held.reported(LoadReport(waiting_sequences=2), NOW)
    assert await targets.tick() == 0
    assert fleet.records["a00007"].desired.overflow_targets is got
    # a peer that missed a report (suspect) keeps its place: nothing to push (a starved
    # coordinator sees late reports fleet-wide, and would re-send every site's lists)
    fleet.records["a00107"] = replace(fleet.records["a00107"], liveness=Liveness.SUSPECT)
    assert await targets.tick() == 0
    # a peer that is down leaves the lists of the others at its site (its own list is
    # the same)
    fleet.records["a00107"] = replace(fleet.records["a00107"], liveness=Liveness.DOWN)
    others = {a for a, r in fleet.records.items() if r.hello.site == "s7" and a != "a00107"}
    pushed = len(fleet.pushed)
    assert await targets.tick() == len(others)
    assert set(fleet.pushed[pushed:]) == others
    now = fleet.records["a00007"].desired.overflow_targets
    assert now is not None and "a00107" not in {t.name for t in now.targets}
    assert some.hello is fleet.records["a00007"].hello


async def test_a_tick_lets_the_event_loop_serve_while_it_works() -> None:
    fleet = Fleet(16 * TICK_SLICE)
    targets = distributor(fleet)
    _, ran = await sampled_meanwhile(targets.tick(), lambda: len(fleet.pushed))
    # the other task ran between the pushes, not only before and after them
    assert any(0 < pushed < len(fleet.records) for pushed in ran)


async def test_a_tick_spreads_its_work_over_the_time_it_is_given() -> None:
    """Given half a second, a tick's slices (two passes over 16 slices of agents) are
    paced across it instead of coming back to back: its pushes are spread out in time,
    and every agent gets what an unpaced tick gives it."""
    loop = asyncio.get_running_loop()
    fleet, plain = Fleet(16 * TICK_SLICE), Fleet(16 * TICK_SLICE)
    paced = distributor(fleet, spread_s=0.5)
    pushed_at: list[float] = []
    set_section = fleet.set_section

    def timed(agent_id: str, section: OverflowTargetsSection) -> None:
        pushed_at.append(loop.time())
        set_section(agent_id, section)

    paced._set_section = timed
    started = loop.time()
    assert await paced.tick() == len(fleet.records)
    took = loop.time() - started
    assert 0.45 <= took < 3.0, took
    assert pushed_at[-1] - pushed_at[0] >= 0.2  # the second pass, half the slices, paced
    started = loop.time()
    await distributor(plain).tick()
    assert loop.time() - started < 0.2
    got = {a: r.desired.overflow_targets for a, r in fleet.records.items()}
    want = {a: r.desired.overflow_targets for a, r in plain.records.items()}
    assert {a: t.targets for a, t in got.items() if t} == {
        a: t.targets for a, t in want.items() if t
    }


def test_no_section_when_the_agent_wants_none_and_never_had_one() -> None:
    fleet = Fleet(1)  # alone at its site, no cloud targets
    targets = distributor(fleet)
    assert asyncio.run(targets.tick()) == 0
    assert fleet.records["a00000"].desired == DesiredState()
