"""Keeping a model warm where its demand is (issue 26): the demand tracker, the policy
with an injected clock, and a real coordinator sending LOAD_MODEL over gRPC after lookups.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from coordinator.api.app_keys import REGISTRY_KEY
from coordinator.config import load_config
from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from coordinator.routing.warmth import (
    BUCKET_S,
    CYCLE_SLICE,
    DAY_S,
    HISTORY_S,
    NO_ROOM,
    NO_SESSION,
    OVER_CAP,
    REFRESHED,
    SENT,
    DemandTracker,
    WarmLoad,
    WarmthPolicy,
    WarmthSettings,
)
from devtools.process import wait_until
from edgefleet.contract import (
    Hello,
    LoadedModel,
    LoadReport,
    ModelInventory,
    ModelInventoryState,
)
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import (
    ADMIN_HEADERS,
    MakeCoordinator,
    hello,
    sampled_meanwhile,
)

pytestmark = pytest.mark.timeout(30)

MIB = 1 << 20
# Monday 2026-11-30 00:00 UTC: "day 1"; DAY2 the day after.
DAY1 = datetime(2026, 11, 30, tzinfo=UTC).timestamp()
DAY2 = DAY1 + DAY_S


def at(day: float, hours: float) -> float:
    return day + hours * 3600


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def agent(
    agent_id: str,
    site: str = "shop",
    *,
    cold: tuple[str, ...] = ("m",),
    models: tuple[str, ...] = ("m", "n"),
    budget: int = 0,
    committed: int = 0,
    running: int = 0,
    draining: bool = False,
    liveness: Liveness = Liveness.LIVE,
    remote: bool = False,
    model_bytes: int = 0,
) -> AgentRecord:
    """An agent's record as its latest report leaves it: ``cold`` are its models served on
    demand and not in memory now."""
    inventory = tuple(
        ModelInventory(
            name,
            "v1",
            ModelInventoryState.LOADED,
            bytes_total=model_bytes,
            resident_bytes=0 if name in cold else model_bytes,
        )
        for name in models
    )
    report = LoadReport(
        running_sequences=running,
        inventory=inventory,
        cold_models=tuple((name, 2.0) for name in sorted(cold)),
        memory_budget_bytes=budget,
        memory_committed_bytes=committed,
    )
    now = datetime.now(UTC)
    return AgentRecord(
        hello=Hello(
            agent_id=agent_id,
            site=site,
            http_url=f"http://{agent_id}:8000",
            models=tuple(LoadedModel(name, "v1") for name in models),
        ),
        status=AgentStatus.CONNECTED,
        session_id="s",
        connected_since=now,
        last_seen=now,
        last_report=report,
        liveness=liveness,
        draining=draining,
        remote=remote,
    )


class Fleet:
    """The agents the policy sees, and the LOAD_MODEL commands it sent."""

    def __init__(self, *records: AgentRecord) -> None:
        self.records = list(records)
        self.sent: list[tuple[str, str, str, str]] = []
        self.sessions: set[str] | None = None  # None: every agent has a session here

    def agents_at(self, site: str, model: str) -> list[AgentRecord]:
        return [r for r in self.records if r.hello.site == site and r.serves(model)]

    def send(self, agent_id: str, kind: str, reason: str, model: str) -> bool:
        if self.sessions is not None and agent_id not in self.sessions:
            return False
        self.sent.append((agent_id, kind, reason, model))
        return True


def policy_for(
    fleet: Fleet, clock: Clock, tracker: DemandTracker | None = None, **settings: Any
) -> tuple[WarmthPolicy, DemandTracker, list[WarmLoad]]:
    tracker = tracker or DemandTracker(clock=clock)
    seen: list[WarmLoad] = []
    policy = WarmthPolicy(
        tracker,
        fleet.agents_at,
        fleet.send,
        WarmthSettings(**settings),
        clock=clock,
        on_result=seen.append,
    )
    return policy, tracker, seen


def lookups(
    tracker: DemandTracker, clock: Clock, site: str, model: str, times: list[float]
) -> None:
    for t in times:
        clock.now = t
        tracker.record(site, model)


# ------------------------------------------------------------------ the tracker


def test_lookups_are_counted_per_site_and_model_in_five_minute_buckets() -> None:
    clock = Clock(at(DAY1, 9))
    tracker = DemandTracker(clock=clock)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9), at(DAY1, 9.01), at(DAY1, 10)])
    lookups(tracker, clock, "shop", "n", [at(DAY1, 9.5)])
    lookups(tracker, clock, "depot", "m", [at(DAY1, 9.5)])
    assert tracker.count("shop", "m", at(DAY1, 8.9), at(DAY1, 9.1)) == 2
    assert tracker.count("shop", "m", at(DAY1, 0), at(DAY1, 24)) == 3
    assert tracker.count("shop", "n", at(DAY1, 0), at(DAY1, 24)) == 1
    assert tracker.count("depot", "m", at(DAY1, 0), at(DAY1, 24)) == 1
    assert tracker.count("nowhere", "m", at(DAY1, 0), at(DAY1, 24)) == 0
    # 25 hours on, yesterday's 9:00 is still there; after the 26 hours kept, it is gone
    lookups(tracker, clock, "shop", "m", [at(DAY2, 10)])
    assert tracker.count("shop", "m", at(DAY1, 8.9), at(DAY1, 9.1)) == 2
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9) + HISTORY_S + BUCKET_S])
    assert tracker.count("shop", "m", at(DAY1, 8.9), at(DAY1, 9.1)) == 0
    assert tracker.count("shop", "m", at(DAY2, 9.9), at(DAY2, 10.1)) == 1


def test_every_window_counts_what_a_plain_tally_of_the_lookups_counts() -> None:
    # any window within the history kept, across the ring's wrap, against a plain count
    rng = random.Random(5)
    clock = Clock(at(DAY1, 0))
    tracker = DemandTracker(clock=clock)
    times = sorted(at(DAY1, 0) + rng.uniform(0, 30 * 3600) for _ in range(3000))
    lookups(tracker, clock, "shop", "m", times)
    oldest = (int(clock.now // BUCKET_S) - HISTORY_S // BUCKET_S + 1) * BUCKET_S
    for _ in range(500):
        start = rng.uniform(oldest, clock.now)
        end = start + rng.uniform(0, 8 * 3600)
        first = math.floor(start / BUCKET_S) * BUCKET_S
        last = math.ceil(end / BUCKET_S) * BUCKET_S
        expected = sum(1 for t in times if first <= t < last and t >= oldest)
        assert tracker.count("shop", "m", start, end) == expected, (start, end)


def test_memory_stays_bounded_with_many_sites_and_models() -> None:
    clock = Clock(at(DAY1, 9))
    tracker = DemandTracker(max_pairs=100, clock=clock)
    tracker.record("kept", "m")
    for i in range(1000):
        clock.now += 1
        tracker.record(f"site-{i}", "m")
        if i % 50 == 0:  # looked up again now and then: the most recent, never dropped
            clock.now += BUCKET_S
            tracker.record("kept", "m")
    assert len(tracker) == 100
    assert tracker.dropped == 1001 - 100
    assert ("kept", "m") in tracker.pairs()
    assert ("site-0", "m") not in tracker.pairs() and ("site-999", "m") in tracker.pairs()


# ------------------------------------------------------------------ the policy


def test_yesterdays_morning_demand_loads_the_model_before_todays_first_lookup() -> None:
    clock = Clock(at(DAY1, 8))
    fleet = Fleet(agent("shop-1"))
    policy, tracker, _ = policy_for(fleet, clock)
    # day 1: the shop opens at 9:00, a lookup every 5 minutes until noon
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9) + i * 300 for i in range(36)])
    # overnight and early in the morning nothing happens
    for hour in (13, 18, 23, 24 + 5, 24 + 8, 24 + 8.25):
        clock.now = at(DAY1, hour)
        assert policy.cycle() == [] and fleet.sent == []
    # day 2, 8:50: within half an hour of yesterday's opening: loaded before the first lookup
    clock.now = at(DAY2, 8 + 50 / 60)
    loads = policy.cycle()
    assert fleet.sent == [("shop-1", "load_model", "kept warm: demand at site shop", "m")]
    assert [(w.site, w.model, w.agent_id, w.result) for w in loads] == [
        ("shop", "m", "shop-1", SENT)
    ]
    assert loads[0].recent == 0 and loads[0].yesterday >= 3


def test_no_demand_or_too_little_sends_nothing() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1"))
    policy, tracker, _ = policy_for(fleet, clock, min_lookups=3)
    assert policy.cycle() == []
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9), at(DAY1, 9.1)])  # 2 of 3
    assert policy.cycle() == [] and fleet.sent == []
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9.2)])
    assert [w.result for w in policy.cycle()] == [SENT]
    # demand elsewhere, or for another model, warms nothing here
    fleet2 = Fleet(agent("shop-1"))
    policy2, tracker2, _ = policy_for(fleet2, clock)
    lookups(tracker2, clock, "depot", "m", [clock.now] * 5)
    lookups(tracker2, clock, "shop", "other", [clock.now] * 5)
    assert policy2.cycle() == [] and fleet2.sent == []


def test_recent_demand_fades_after_the_window() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1"))
    policy, tracker, _ = policy_for(fleet, clock, recent_window_s=1800, backoff_s=0)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    clock.now = at(DAY1, 9.4)
    assert len(policy.cycle()) == 1
    clock.now = at(DAY1, 9.7)  # 42 minutes on: past 30 minutes and the bucket's 5
    assert policy.cycle() == []


def test_the_same_agent_is_not_sent_the_same_model_again_within_the_back_off() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1"))
    policy, tracker, _ = policy_for(fleet, clock, backoff_s=300)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    policy.cycle()
    for step in (30, 60, 299):  # its reports still say cold: the load is under way
        clock.now = at(DAY1, 9) + step
        assert policy.cycle() == []
    assert len(fleet.sent) == 1
    clock.now = at(DAY1, 9) + 300  # it went again (evicted, or the load failed)
    assert [w.result for w in policy.cycle()] == [SENT]
    assert len(fleet.sent) == 2


def test_a_warm_agent_at_the_site_means_nothing_is_loaded() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1"), agent("shop-2", cold=("n",)))
    policy, tracker, _ = policy_for(fleet, clock, refresh_s=0)  # no keep-alive refresh
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    assert policy.cycle() == [] and fleet.sent == []
    # an agent that loads nothing on demand (no cold models) counts as warm too
    fleet.records[1] = agent("shop-2", cold=())
    assert policy.cycle() == [] and fleet.sent == []
    # once it lost the model, the cold one gets it
    fleet.records[1] = agent("shop-2", cold=("m",))
    policy.cycle()
    assert [s[0] for s in fleet.sent] == ["shop-1"]


def test_a_warm_agents_keep_alive_is_restarted_while_the_demand_lasts() -> None:
    """A model kept warm stays loaded through a quiet stretch: one agent holding it (of
    those that load on demand, the least loaded) is sent LOAD_MODEL (which restarts a
    loaded model's keep-alive) every refresh_s while its pair is wanted, never one an
    operator unloaded it from, and nothing once the demand has faded."""
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(
        agent("shop-1", cold=(), budget=1 << 30),  # holds m, loads on demand: refreshed
        agent("shop-2", cold=("m",), budget=1 << 30),
        agent("shop-3", cold=(), budget=1 << 30, running=5),  # holds it too, busier
        agent("shop-0", cold=()),  # loads every model at start (no budget): nothing to do
    )
    policy, tracker, seen = policy_for(fleet, clock, refresh_s=120, recent_window_s=1800)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    policy.cycle()
    assert [(s[0], s[1], s[3]) for s in fleet.sent] == [("shop-1", "load_model", "m")]
    assert seen[-1].result == REFRESHED
    clock.now += 60
    policy.cycle()  # within refresh_s: nothing again
    assert len(fleet.sent) == 1
    clock.now += 61
    policy.cycle()
    assert len(fleet.sent) == 2  # restarted again
    policy.operator_command("shop-1", "m", load=False)
    clock.now += 121
    policy.cycle()
    assert len(fleet.sent) == 2  # held: an operator unloaded it there
    clock.now = at(DAY1, 9) + 1800 + 300
    fleet.sent.clear()
    policy.cycle()
    assert fleet.sent == []  # the demand faded


def test_an_operators_unload_holds_warm_loads_of_that_model_on_that_agent() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1"), agent("depot-1", "depot"))
    policy, tracker, _ = policy_for(fleet, clock, backoff_s=0, recent_window_s=1800)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    lookups(tracker, clock, "depot", "m", [at(DAY1, 9)] * 5)
    policy.operator_command("shop-1", "m", load=False)
    assert [w.agent_id for w in policy.cycle()] == ["depot-1"]  # the depot's is not held
    clock.now += 600
    lookups(tracker, clock, "shop", "m", [clock.now] * 5)
    assert "shop-1" not in [w.agent_id for w in policy.cycle()]
    policy.operator_command("shop-1", "m", load=True)  # the operator's load ends the hold
    assert "shop-1" in [w.agent_id for w in policy.cycle()]
    # and a hold ends by itself after the recent window
    policy.operator_command("shop-1", "m", load=False)
    clock.now += 1799
    assert "shop-1" not in [w.agent_id for w in policy.cycle()]
    clock.now += 1
    lookups(tracker, clock, "shop", "m", [clock.now] * 5)
    assert "shop-1" in [w.agent_id for w in policy.cycle()]


def test_draining_suspect_unhealthy_and_remote_agents_are_skipped() -> None:
    clock = Clock(at(DAY1, 9))
    unhealthy = agent("shop-4")
    assert unhealthy.last_report is not None
    unhealthy = AgentRecord(
        **{
            **{f: getattr(unhealthy, f) for f in AgentRecord.__dataclass_fields__},
            "last_report": unhealthy.last_report._replace(unhealthy_reason="disk"),
        }
    )
    skipped = [
        agent("shop-1", draining=True),
        agent("shop-2", liveness=Liveness.SUSPECT),
        agent("shop-3", remote=True),
        unhealthy,
    ]
    fleet = Fleet(*skipped)
    policy, tracker, _ = policy_for(fleet, clock, backoff_s=0)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    assert policy.cycle() == [] and fleet.sent == []
    # a draining agent holding the model is not a warm one either: the live one loads it
    fleet.records = [agent("shop-1", draining=True, cold=()), agent("shop-5")]
    policy.cycle()
    assert [s[0] for s in fleet.sent] == ["shop-5"]


def test_an_agent_whose_budget_has_no_room_for_the_model_is_not_sent_it() -> None:
    clock = Clock(at(DAY1, 9))
    full = agent("shop-1", budget=1000 * MIB, committed=900 * MIB, model_bytes=300 * MIB)
    fleet = Fleet(full)
    policy, tracker, seen = policy_for(fleet, clock)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    assert [(w.result, w.agent_id) for w in policy.cycle()] == [(NO_ROOM, "")]
    assert fleet.sent == []
    assert policy.cycle() == []  # counted once per back-off
    # one with room is chosen, and of two with room the one with the most
    roomy = agent("shop-2", budget=1000 * MIB, committed=500 * MIB, model_bytes=300 * MIB)
    roomier = agent("shop-3", budget=2000 * MIB, committed=500 * MIB, model_bytes=300 * MIB)
    fleet.records = [full, roomy, roomier]
    policy.cycle()
    assert [s[0] for s in fleet.sent] == ["shop-3"]
    assert [w.result for w in seen] == [NO_ROOM, SENT]


def test_of_equal_room_the_least_loaded_is_chosen_and_a_lost_session_is_counted() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(agent("shop-1", running=4), agent("shop-2", running=1))
    policy, tracker, _ = policy_for(fleet, clock)
    lookups(tracker, clock, "shop", "m", [at(DAY1, 9)] * 5)
    fleet.sessions = set()  # its session ended between its report and the send
    assert [(w.agent_id, w.result) for w in policy.cycle()] == [("shop-2", NO_SESSION)]


def test_never_more_commands_per_cycle_than_the_cap_busiest_first() -> None:
    clock = Clock(at(DAY1, 9))
    fleet = Fleet(*(agent(f"{site}-1", site) for site in ("a", "b", "c")))
    policy, tracker, _ = policy_for(fleet, clock, max_commands_per_cycle=2, min_lookups=3)
    for site, n in (("a", 3), ("b", 9), ("c", 5)):
        lookups(tracker, clock, site, "m", [at(DAY1, 9)] * n)
    loads = policy.cycle()
    assert [(w.site, w.result) for w in loads] == [("b", SENT), ("c", SENT), ("a", OVER_CAP)]
    assert [s[0] for s in fleet.sent] == ["b-1", "c-1"]
    clock.now += 30
    assert [(w.site, w.result) for w in policy.cycle()] == [("a", SENT)]


async def test_a_round_in_slices_decides_as_one_pass_and_lets_the_loop_serve() -> None:
    """Many sites with demand: the sliced round sends what one pass sends (cap included),
    and another task runs between its slices, not only before and after it."""
    sites = [f"s{i:03d}" for i in range(7 * CYCLE_SLICE)]

    def setup() -> tuple[WarmthPolicy, Fleet]:
        clock = Clock(at(DAY1, 9))
        fleet = Fleet(*(agent(f"{site}-1", site) for site in sites))
        policy, tracker, _ = policy_for(fleet, clock, max_commands_per_cycle=5 * CYCLE_SLICE)
        for i, site in enumerate(sites):
            lookups(tracker, clock, site, "m", [at(DAY1, 9)] * (5 + i % 4))
        return policy, fleet

    whole, whole_fleet = setup()
    sliced, sliced_fleet = setup()
    got, ran = await sampled_meanwhile(sliced.cycle_in_slices(), lambda: len(sliced_fleet.sent))
    assert got == whole.cycle()
    assert sliced_fleet.sent == whole_fleet.sent and len(whole_fleet.sent) == 5 * CYCLE_SLICE
    assert [w.result for w in got].count(OVER_CAP) == 2 * CYCLE_SLICE
    assert any(0 < sent < len(sliced_fleet.sent) for sent in ran)


# ------------------------------------------------------------------ a real coordinator


async def _reader(call: Any, into: asyncio.Queue[pb.CoordinatorMessage]) -> None:
    with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
        while (message := await call.read()) is not grpc.aio.EOF:
            await into.put(message)


async def _reporter(call: Any, report: pb.LoadReport) -> None:
    with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
        while True:
            await call.write(pb.AgentMessage(load_report=report))
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _session(
    c: Any, agent_id: str, site: str, report: pb.LoadReport
) -> AsyncIterator[asyncio.Queue[pb.CoordinatorMessage]]:
    """A fake agent over gRPC: Hello, then ``report`` every 0.1 s (the test coordinator's
    report interval is 0.2 s); what the coordinator pushes after the Welcome lands in the
    queue yielded."""
    call = c.stub.Session()
    await call.write(hello(agent_id, site=site))
    await call.read()  # Welcome
    pushed: asyncio.Queue[pb.CoordinatorMessage] = asyncio.Queue()
    tasks = [
        asyncio.create_task(_reporter(call, report)),
        asyncio.create_task(_reader(call, pushed)),
    ]
    try:
        yield pushed
    finally:
        call.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _commands(queue: asyncio.Queue[pb.CoordinatorMessage]) -> list[pb.Command]:
    found = []
    while not queue.empty():
        message = queue.get_nowait()
        if message.HasField("command"):
            found.append(message.command)
    return found


async def test_a_cold_agent_gets_load_model_after_lookups_for_its_model_at_its_site(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    # the warm_* keys through the real config loader (a file), every other default as is
    path = tmp_path / "coordinator.toml"
    path.write_text("warm_interval_s = 0.2\nwarm_min_lookups = 3\n")
    loaded = load_config(path, environ={})
    warm = {k: getattr(loaded, k) for k in type(loaded).model_fields if k.startswith("warm_")}
    assert warm["warm_by_demand"] is True  # on by default
    c = await make_coordinator(**warm)
    cold = pb.LoadReport(
        cold_models={"m": 2.0}, memory_budget_bytes=1 << 30, memory_committed_bytes=0
    )
    async with (
        _session(c, "lab-1", "lab", cold) as lab,
        _session(c, "depot-1", "depot", cold) as depot,
    ):
        await wait_until(lambda: _reported(c, 2), message="reports")
        # several policy runs with no demand: nothing pushed
        await asyncio.sleep(0.8)
        assert _commands(lab) == [] and _commands(depot) == []
        for _ in range(3):
            answer = await c.stub.Route(pb.RouteRequest(model="m", site="lab"))
            assert answer.agents[0].agent_id == "lab-1"
        got: list[pb.Command] = []

        def arrived() -> bool:
            got.extend(_commands(lab))
            return bool(got)

        await wait_until(arrived, timeout_s=5, message="LOAD_MODEL at the lab's agent")
        assert [(g.kind, g.model, g.reason) for g in got] == [
            (pb.Command.KIND_LOAD_MODEL, "m", "kept warm: demand at site lab")
        ]
        await asyncio.sleep(0.5)  # within the back-off: not again; the depot had no demand
        assert _commands(lab) == [] and _commands(depot) == []
        async with (
            aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
            http.get(c.http_url + "/metrics") as response,
        ):
            metrics = await response.text()
    assert 'edgefleet_coordinator_warm_loads_total{result="sent"} 1.0' in metrics
    assert "edgefleet_coordinator_warm_tracked_pairs 1.0" in metrics


async def test_an_operators_unload_holds_the_warm_loads_back_until_an_operators_load(
    make_coordinator: MakeCoordinator,
) -> None:
    # a short back-off: without the hold, the policy would load it again within 0.3 s
    c = await make_coordinator(warm_interval_s=0.1, warm_min_lookups=3, warm_backoff_s=0.3)
    cold = pb.LoadReport(cold_models={"m": 2.0})
    async with _session(c, "lab-1", "lab", cold) as lab:
        await wait_until(lambda: _reported(c, 1), message="report")
        got: list[pb.Command] = []

        def reasons() -> list[str]:
            got.extend(_commands(lab))
            return [g.reason for g in got if g.kind == pb.Command.KIND_LOAD_MODEL]

        for _ in range(3):
            await c.stub.Route(pb.RouteRequest(model="m", site="lab"))
        await wait_until(lambda: bool(reasons()), timeout_s=5, message="a warm load")
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as http:
            admin = f"{c.http_url}/v1/admin/agents/lab-1/models/m"
            async with http.post(admin + "/unload") as response:
                assert response.status == 202
            got.clear()
            for _ in range(3):  # the demand goes on
                await c.stub.Route(pb.RouteRequest(model="m", site="lab"))
            await asyncio.sleep(1.0)  # ten policy runs, three back-offs
            assert reasons() == []
            assert [g.kind for g in got] == [pb.Command.KIND_UNLOAD_MODEL]
            async with http.post(admin + "/load") as response:
                assert response.status == 202
        # the operator's load, then (the fake agent still reports it cold) the policy's
        await wait_until(lambda: len(reasons()) >= 2, timeout_s=5, message="warm loads again")
        assert reasons()[:2] == [
            "load_model requested by an operator",
            "kept warm: demand at site lab",
        ]


def _reported(c: Any, count: int) -> bool:
    agents = c.app[REGISTRY_KEY].agents()
    return len(agents) == count and all(r.last_report for r in agents)
