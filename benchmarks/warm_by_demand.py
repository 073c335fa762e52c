"""Keeping models warm where their demand is (issue 26): a replayed day of route lookups.

Two days of lookups (seeded) for six sites in three time zones (UTC+1, UTC-5, UTC+8), two
or three models each, in an office-hours shape: a start between 8:00 and 9:30 local, a
lunch dip, an evening taper and a sparse night; some sites have a model used only a few
times a day. Each lookup is followed by its request at the site's agent. They are replayed
on a simulated clock through the coordinator's own ``DemandTracker`` and ``WarmthPolicy``
(run every ``warm_interval_s``, with the default ``warm_*`` settings unless flags say
otherwise), over one simulated agent per site that behaves as the agent's residency does:
a request for a model not in memory loads it (and pays the load), LOAD_MODEL loads it, and
a loaded model is unloaded ``keep_alive_s`` after its last use (300 s: the agent's default).
The policy sees each agent as its load report would show it (``cold_models``, budget,
committed, inventory) in an ``AgentRecord``.

Day 1 teaches the tracker; day 2 (UTC) is measured, with the policy off (lookups replayed
against the agents alone) and on, side by side:

- requests that paid a load (the model not in memory, or still loading, on arrival);
- the first request of each local morning (from an hour before the site opens; a stray
  lookup in the night is none) that paid one, for the models in daily use (not those used
  a few times a day);
- loads avoided (cold requests off minus on), loads in all, and extra loads: loads the
  policy caused that were unloaded without serving a request;
- model-hours warm: the time models spent loaded (the memory the policy costs).

Also the tracker's cost per lookup (the router's only added work), and a route lookup in
``Router.route`` with ``warm_by_demand`` off and on over the same 1,000-agent registry,
interleaved.

    python -m benchmarks.warm_by_demand [--seed 7] [--min-lookups 4] [--recent-window-s 1800]
        [--yesterday-window-s 3600] [--interval-s 30] [--backoff-s 300]

(defaults: the coordinator's ``warm_*`` defaults)

Writes ``benchmarks/results/warm_by_demand.json``. Runs in a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.results_file import target, write_results
from coordinator.config import CoordinatorConfig
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.records import AgentRecord, AgentStatus
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.routing.scorer import RouteQuery
from coordinator.routing.service import Router
from coordinator.routing.warmth import DAY_S, DemandTracker, WarmthPolicy, WarmthSettings
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet.contract import (
    Hello,
    LoadedModel,
    LoadReport,
    Location,
    ModelInventory,
    ModelInventoryState,
)

MiB = 1 << 20
KEEP_ALIVE_S = 300.0
# What one model's load takes, and one request's service (the model stays busy that long)
LOAD_S = 2.0
SERVICE_S = 5.0
BUDGET = 4096 * MiB
FOOTPRINT = {"chat": 700 * MiB, "code": 550 * MiB, "rare": 300 * MiB}
# Day 0 00:00 UTC (a Monday); the lookups cover day 0 and day 1 (measured).
START = datetime(2026, 11, 30, tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Site:
    name: str
    utc_offset_h: int
    # requests per hour at the busiest office hour, per model
    peak_per_h: dict[str, float]
    # local hour the site opens (its first requests)
    opens_h: float
    # models used only a few times a day: how many times
    rare_per_day: dict[str, int] = field(default_factory=dict)


SITES = (
    Site("paris-shop", 1, {"chat": 40.0, "code": 6.0}, 8.5, {"rare": 4}),
    Site("berlin-office", 1, {"chat": 25.0, "code": 12.0}, 8.0),
    Site("nyc-branch", -5, {"chat": 30.0, "code": 4.0}, 9.0, {"rare": 3}),
    Site("boston-lab", -5, {"chat": 10.0, "code": 15.0}, 9.5),
    Site("singapore-hub", 8, {"chat": 50.0, "code": 8.0}, 8.5),
    Site("perth-depot", 8, {"chat": 8.0}, 8.0, {"code": 5}),
)


def shape(local_h: float, opens_h: float) -> float:
    """Share of the peak rate at a local hour: night, a morning ramp from the opening, a
    lunch dip, an afternoon, an evening taper."""
    if local_h < opens_h or local_h >= 19.5:
        return 0.01  # sparse night: a few stray lookups
    if local_h < opens_h + 1:
        return 0.3 + 0.7 * (local_h - opens_h)
    if 12.0 <= local_h < 13.5:
        return 0.25
    if local_h >= 17.5:
        return max(0.05, 1.0 - (local_h - 17.5) / 2.0)
    return 1.0


def generate(rng: random.Random) -> list[tuple[float, str, str]]:
    """(time, site, model) for every lookup of the two days, in time order (thinning of a
    Poisson process at each model's peak rate)."""
    lookups: list[tuple[float, str, str]] = []
    for site in SITES:
        for model, peak in site.peak_per_h.items():
            t = START
            while True:
                t += rng.expovariate(peak / 3600.0)
                if t >= START + 2 * DAY_S:
                    break
                local_h = ((t - START) / 3600.0 + site.utc_offset_h) % 24
                if rng.random() < shape(local_h, site.opens_h):
                    lookups.append((t, site.name, model))
        for model, per_day in site.rare_per_day.items():
            for day in range(2):
                for _ in range(per_day):
                    local_h = rng.uniform(site.opens_h, 18.0)
                    # within the same UTC day for every site here (UTC-5 to UTC+8)
                    t = START + day * DAY_S + (local_h - site.utc_offset_h) * 3600.0
                    lookups.append((t, site.name, model))
    lookups.sort()
    return lookups


@dataclass
class Loaded:
    since: float
    ready_at: float
    expires: float
    by_policy: bool
    used: bool = False


@dataclass
class Tally:
    requests: int = 0
    cold_requests: int = 0
    morning_requests: int = 0
    cold_morning_requests: int = 0
    loads: int = 0
    policy_loads: int = 0
    extra_loads: int = 0
    warm_s: float = 0.0


class SimAgent:
    """One site's agent: loads on a request or LOAD_MODEL, unloads keep-alive after use."""

    def __init__(self, site: Site, window: tuple[float, float], tally: Tally) -> None:
        self.site = site
        self.models = sorted({*site.peak_per_h, *site.rare_per_day})
        self.loaded: dict[str, Loaded] = {}
        self.window = window
        self.tally = tally

    def _measured(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]

    def advance(self, now: float) -> None:
        for model, slot in list(self.loaded.items()):
            if slot.expires <= now:
                self._unload(model, slot)

    def _unload(self, model: str, slot: Loaded) -> None:
        del self.loaded[model]
        start, end = max(slot.since, self.window[0]), min(slot.expires, self.window[1])
        self.tally.warm_s += max(0.0, end - start)
        if slot.by_policy and not slot.used and self._measured(slot.since):
            self.tally.extra_loads += 1

    def _load(self, model: str, now: float, by_policy: bool) -> Loaded:
        slot = Loaded(now, now + LOAD_S, now + LOAD_S + KEEP_ALIVE_S, by_policy)
        self.loaded[model] = slot
        if self._measured(now):
            self.tally.loads += 1
            self.tally.policy_loads += by_policy
        return slot

    def request(self, now: float, model: str, morning: bool) -> None:
        self.advance(now)
        slot = self.loaded.get(model)
        cold = slot is None or now < slot.ready_at
        if slot is None:
            slot = self._load(model, now, by_policy=False)
        slot.used = True
        slot.expires = max(slot.expires, max(now, slot.ready_at) + SERVICE_S + KEEP_ALIVE_S)
        if self._measured(now):
            self.tally.requests += 1
            self.tally.cold_requests += cold
            self.tally.morning_requests += morning
            self.tally.cold_morning_requests += cold and morning

    def load_model(self, now: float, model: str) -> None:
        self.advance(now)
        slot = self.loaded.get(model)
        if slot is None:
            self._load(model, now, by_policy=True)
        else:  # loaded: its keep-alive starts again (the agent's Residency.load)
            slot.expires = max(slot.expires, now + KEEP_ALIVE_S)

    def record(self, now: float) -> AgentRecord:
        """The agent as its latest load report shows it to the coordinator."""
        self.advance(now)
        cold = tuple((m, LOAD_S) for m in self.models if m not in self.loaded)
        committed = sum(FOOTPRINT[m] for m in self.loaded)
        inventory = tuple(
            ModelInventory(m, "v1", ModelInventoryState.LOADED, bytes_total=FOOTPRINT[m],
                           resident_bytes=FOOTPRINT[m] if m in self.loaded else 0)
            for m in self.models
        )  # fmt: skip
        report = LoadReport(
            inventory=inventory,
            cold_models=cold,
            memory_budget_bytes=BUDGET,
            memory_committed_bytes=committed,
        )
        when = datetime.fromtimestamp(now, UTC)
        return AgentRecord(
            hello=Hello(
                agent_id=f"{self.site.name}-1",
                site=self.site.name,
                http_url=f"http://{self.site.name}:8000",
                models=tuple(LoadedModel(m, "v1") for m in self.models),
            ),
            status=AgentStatus.CONNECTED,
            session_id="s",
            connected_since=when,
            last_seen=when,
            last_report=report,
        )

    def finish(self, end: float) -> None:
        for model, slot in list(self.loaded.items()):
            slot.expires = min(slot.expires, end)
            self._unload(model, slot)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def replay(
    lookups: list[tuple[float, str, str]],
    settings: WarmthSettings | None,
    interval_s: float,
) -> tuple[Tally, int]:
    """Replay both days; ``settings`` None: the policy off. The day-2 tally, and how many
    (site, model) pairs the tracker held at the end."""
    window = (START + DAY_S, START + 2 * DAY_S)
    tally = Tally()
    sites = {s.name: s for s in SITES}
    agents = {name: SimAgent(site, window, tally) for name, site in sites.items()}
    clock = Clock()
    tracker = DemandTracker(clock=clock)
    policy = None
    if settings is not None:

        def agents_at(site: str, model: str) -> list[AgentRecord]:
            agent = agents.get(site)
            if agent is None or model not in agent.models:
                return []
            return [agent.record(clock.now)]

        def send(agent_id: str, kind: str, reason: str, model: str) -> bool:
            agents[agent_id.removesuffix("-1")].load_model(clock.now, model)
            return True

        policy = WarmthPolicy(tracker, agents_at, send, settings, clock=clock)
    # the local days each (site, model) has had a request in office hours: its first one
    # of a day is that day's first of the morning
    days_seen: set[tuple[str, str, int]] = set()
    events: list[tuple[float, int, str, str]] = [(t, 1, s, m) for t, s, m in lookups]
    if policy is not None:
        cycles = int(2 * DAY_S // interval_s)
        events += [(START + i * interval_s, 0, "", "") for i in range(1, cycles)]
    heapq.heapify(events)
    while events:
        t, kind, site, model = heapq.heappop(events)
        clock.now = t
        if kind == 0:
            assert policy is not None
            policy.cycle()
            continue
        tracker.record(site, model)
        day = _local_day(sites[site], t)
        morning = (
            day is not None
            and model not in sites[site].rare_per_day
            and (site, model, day) not in days_seen
        )
        if day is not None:
            days_seen.add((site, model, day))
        agents[site].request(t, model, morning)
    for agent in agents.values():
        agent.finish(window[1])
    return tally, len(tracker)


def _local_day(site: Site, t: float) -> int | None:
    """The site's local day of ``t`` when ``t`` is in its office hours (from an hour before
    it opens to 19:30 local); None at night (a stray lookup is no morning)."""
    local_h = (t - START) / 3600.0 + site.utc_offset_h
    if not site.opens_h - 1 <= local_h % 24 < 19.5:
        return None
    return math.floor(local_h / 24.0)


def tracker_cost_ns(n: int = 200_000) -> float:
    """Nanoseconds per ``DemandTracker.record`` over 1,000 (site, model) pairs."""
    tracker = DemandTracker()
    keys = [(f"site-{i % 500}", f"model-{i % 2}") for i in range(n)]
    started = time.perf_counter_ns()
    for site, model in keys:
        tracker.record(site, model)
    return (time.perf_counter_ns() - started) / n


async def _router_cost_us(agents: int = 1000, lookups: int = 20_000) -> dict[str, float]:
    """A route lookup's time in ``Router.route`` with ``warm_by_demand`` off (two routers:
    what two identical ones differ by is this comparison's noise) and on, over the same
    registry (1,000 agents at 100 sites serving 2 models, on SQLite in a temporary
    directory), interleaved in rounds; microseconds per lookup."""
    rng = random.Random(3)
    with tempfile.TemporaryDirectory() as data:
        store = SQLiteFleetStore.in_directory(Path(data))
        await store.open()
        try:
            registry = await LiveFleetRegistry.open(store)
            for i in range(agents):
                agent_id = f"a{i:04d}"
                session = registry.open_session(
                    Hello(
                        agent_id=agent_id,
                        site=f"site-{i % 100}",
                        http_url=f"http://{agent_id}:8000",
                        location=Location(rng.uniform(40, 55), rng.uniform(-5, 20)),
                        models=(LoadedModel("chat", "v1"), LoadedModel("code", "v1")),
                    )
                )
                registry.record_report(
                    agent_id, session, LoadReport(running_sequences=rng.randrange(4))
                )
            plain = Router.from_config(
                registry, CoordinatorConfig(warm_by_demand=False), CoordinatorMetrics(registry)
            )
            # the same scorer (the load table is derived for one policy), counting demand
            counting = Router(
                registry,
                plain._scorer,
                plain._overflow,
                CoordinatorMetrics(registry),
                demand=DemandTracker(),
            )
            # a second router without it: the noise floor of this comparison
            again = Router(registry, plain._scorer, plain._overflow, CoordinatorMetrics(registry))
            routers = {"off": plain, "off_again": again, "on": counting}
            queries = [
                RouteQuery(model=rng.choice(("chat", "code")), site=f"site-{rng.randrange(100)}")
                for _ in range(lookups // 10)
            ]
            spent = dict.fromkeys(routers, 0.0)
            for round_ in range(10):  # in a turned order every other round
                for name in sorted(routers, reverse=bool(round_ % 2)):
                    router = routers[name]
                    started = time.perf_counter()
                    for query in queries:
                        router.route(query)
                    spent[name] += time.perf_counter() - started
        finally:
            await store.close()
    return {name: round(seconds / lookups * 1e6, 1) for name, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = CoordinatorConfig()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--min-lookups", type=int, default=defaults.warm_min_lookups)
    parser.add_argument("--recent-window-s", type=float, default=defaults.warm_recent_window_s)
    parser.add_argument(
        "--yesterday-window-s", type=float, default=defaults.warm_yesterday_window_s
    )
    parser.add_argument("--interval-s", type=float, default=defaults.warm_interval_s)
    parser.add_argument("--backoff-s", type=float, default=defaults.warm_backoff_s)
    args = parser.parse_args()
    started = time.perf_counter()
    lookups = generate(random.Random(args.seed))
    settings = WarmthSettings(
        recent_window_s=args.recent_window_s,
        yesterday_window_s=args.yesterday_window_s,
        min_lookups=args.min_lookups,
        backoff_s=args.backoff_s,
        max_commands_per_cycle=defaults.warm_max_commands_per_cycle,
    )
    off, _ = replay(lookups, None, args.interval_s)
    on, pairs = replay(lookups, settings, args.interval_s)
    recent_only, _ = replay(
        lookups,
        WarmthSettings(**{**_fields(settings), "yesterday_window_s": 0.0}),
        args.interval_s,
    )
    cost_ns = tracker_cost_ns()
    router_us = asyncio.run(_router_cost_us())
    elapsed = time.perf_counter() - started
    figures: dict[str, Any] = {
        "settings": {
            **_fields(settings),
            "interval_s": args.interval_s,
            "seed": args.seed,
            "keep_alive_s": KEEP_ALIVE_S,
            "load_s": LOAD_S,
        },
        "sites": len(SITES),
        "pairs_tracked": pairs,
        "lookups_two_days": len(lookups),
        "day2_requests": on.requests,
        "off": _row(off),
        "on": _row(on),
        "on_without_yesterday": _row(recent_only),
        "loads_avoided": off.cold_requests - on.cold_requests,
        "extra_loads_per_load_avoided": _ratio(
            on.extra_loads, off.cold_requests - on.cold_requests
        ),
        "cold_requests_ratio_on_vs_off": _ratio(on.cold_requests, off.cold_requests),
        "morning_cold_ratio_on_vs_off": _ratio(on.cold_morning_requests, off.cold_morning_requests),
        "model_hours_ratio_on_vs_off": _ratio(on.warm_s, off.warm_s),
        "tracker_record_ns": round(cost_ns, 1),
        "route_lookup_us": router_us,
        "run_s": round(elapsed, 2),
    }
    avoided = off.cold_requests - on.cold_requests
    extra_per_avoided = _ratio(on.extra_loads, avoided)
    targets = {
        "cold_requests_ratio_on_vs_off": target(
            figures["cold_requests_ratio_on_vs_off"], "<= 0.5",
            figures["cold_requests_ratio_on_vs_off"] <= 0.5),
        "morning_cold_ratio_on_vs_off": target(
            figures["morning_cold_ratio_on_vs_off"], "<= 0.25",
            figures["morning_cold_ratio_on_vs_off"] <= 0.25),
        "extra_loads_per_load_avoided": target(
            extra_per_avoided, "<= 1.5", avoided > 0 and extra_per_avoided <= 1.5),
        "tracker_record_ns": target(round(cost_ns, 1), "< 5000 (1% of a 0.5 ms lookup)",
                                    cost_ns < 5000),
        "run_s": target(round(elapsed, 2), "< 60", elapsed < 60),
    }  # fmt: skip
    for name, row in (("off", off), ("on", on), ("on, recent only", recent_only)):
        print(f"{name:>16}: {_line(row)}")
    print(f"route lookup {router_us['off']} / {router_us['off_again']} us off (two routers), "
          f"{router_us['on']} us on")  # fmt: skip
    print(f"loads avoided {figures['loads_avoided']}, tracker {cost_ns:.0f} ns per lookup, "
          f"{len(lookups)} lookups, {elapsed:.1f} s")  # fmt: skip
    path = write_results("warm_by_demand", figures, targets)
    print(f"wrote {path}")


def _fields(settings: WarmthSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in WarmthSettings.__dataclass_fields__}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else (0.0 if a == 0 else math.inf)


def _row(t: Tally) -> dict[str, Any]:
    return {
        "requests": t.requests,
        "cold_requests": t.cold_requests,
        "morning_requests": t.morning_requests,
        "cold_morning_requests": t.cold_morning_requests,
        "loads": t.loads,
        "policy_loads": t.policy_loads,
        "extra_loads": t.extra_loads,
        "model_hours_warm": round(t.warm_s / 3600.0, 2),
    }


def _line(t: Tally) -> str:
    return (f"{t.cold_requests}/{t.requests} requests paid a load, first of the morning "
            f"{t.cold_morning_requests}/{t.morning_requests}, loads {t.loads} (policy "
            f"{t.policy_loads}, {t.extra_loads} never used), {t.warm_s / 3600:.1f} "
            "model-hours warm")  # fmt: skip


if __name__ == "__main__":
    main()
