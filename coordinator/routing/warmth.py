"""Keeping a model warm where its demand is: route lookups per (site, model), and the
policy that loads a model at a site before its next request there.

Agents that load models on demand (agent/engine/residency.py) unload a model idle past
its keep-alive, so the first request of the morning at a site pays the model's load. The
coordinator answers the site's route lookups, so it knows the demand:

``DemandTracker``
    Counts answered lookups per (site, model) in ``BUCKET_S`` buckets, the last
    ``HISTORY_S`` of them (a ring per pair). ``record`` is the router's only cost: a
    clock read, a dict lookup and an increment (a ring slot is cleared only when a new
    bucket starts). At most ``max_pairs`` pairs are kept; a new pair beyond it takes the
    place of the one whose last lookup is oldest.
``WarmthPolicy``
    Run every ``warm_interval_s``: a (site, model) is wanted warm when its lookups over the
    last ``recent_window_s``, or over ``yesterday_window_s`` either side of this time
    yesterday, reach ``min_lookups``. When no live, connected, healthy, non-draining
    agent of this coordinator at the site holds the model in memory (every one lists it
    in its report's ``cold_models``), the one with the most free memory budget (then the
    least load) is sent LOAD_MODEL with the reason "kept warm: demand at site X". While
    the pair stays wanted, one agent there that holds the model and loads models on demand
    (it reports a memory budget; the least loaded) is sent LOAD_MODEL again every
    ``refresh_s``: a loaded model's LOAD_MODEL restarts its keep-alive on the agent, so a
    model kept warm through a quiet stretch stays in memory instead of being unloaded and
    loaded again (results ``refreshed``; one command per wanted pair and ``refresh_s`` at
    most, outside the per-cycle cap: 5,000 agents that load everything at start, as in
    benchmarks/coordinator_scale, were each sent one a cycle by a first version, a 200 ms
    stall of the event loop).

What it never does: send to the same agent for the same model within ``backoff_s``; send
more than ``max_commands_per_cycle`` commands a cycle (the busiest pairs first); send to
an agent on another coordinator (each coordinator warms the agents whose sessions it
holds), a draining, suspect or unhealthy one; send when an agent's free budget (budget
minus committed) is below the model's weights (its largest resident size reported at the
site, else the size of its files on that agent), so a warm load never makes an agent
evict another model for room; load a model on an agent within ``recent_window_s`` of an
operator unloading it there (``operator_command``); unload anything (the agent's
keep-alive does that).
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from coordinator.fleet.registry import FleetRegistry

if TYPE_CHECKING:
    from coordinator.config import CoordinatorConfig

#: Width of one demand bucket (seconds).
BUCKET_S = 300
#: How far back demand is kept: a day, and room around this time yesterday.
HISTORY_S = 26 * 3600
_SLOTS = HISTORY_S // BUCKET_S
DAY_S = 86_400

#: (site, model) pairs a round decides before it lets the event loop serve
#: (``WarmthPolicy.cycle_in_slices``).
CYCLE_SLICE = 50

#: Outcomes of a warm load, as the metric labels them.
SENT, NO_SESSION, NO_ROOM, OVER_CAP = "sent", "no_session", "no_room", "over_cap"
REFRESHED = "refreshed"


class _Series:
    """One pair's ring of bucket counts; ``last`` is the newest bucket number written."""

    __slots__ = ("counts", "last")

    def __init__(self, bucket: int) -> None:
        self.counts = array("I", bytes(4 * _SLOTS))
        self.last = bucket


class DemandTracker:
    """Answered route lookups per (site, model), in ``BUCKET_S`` buckets (module doc)."""

    def __init__(self, max_pairs: int = 4096, clock: Callable[[], float] = time.time) -> None:
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        self._max = max_pairs
        self._clock = clock
        # least recently looked up first
        self._pairs: OrderedDict[tuple[str, str], _Series] = OrderedDict()
        self.dropped = 0  # pairs dropped for room

    def __len__(self) -> int:
        return len(self._pairs)

    def record(self, site: str, model: str) -> None:
        """One lookup for ``model`` at ``site`` answered now."""
        bucket = int(self._clock() // BUCKET_S)
        key = (site, model)
        pairs = self._pairs
        series = pairs.get(key)
        if series is None:
            if len(pairs) >= self._max:
                pairs.popitem(last=False)
                self.dropped += 1
            series = pairs[key] = _Series(bucket)
        elif bucket != series.last:
            if bucket > series.last:
                counts = series.counts
                for b in range(series.last + 1, min(bucket, series.last + _SLOTS) + 1):
                    counts[b % _SLOTS] = 0
                series.last = bucket
                pairs.move_to_end(key)
            elif series.last - bucket >= _SLOTS:  # the clock stepped back past the ring
                return
        series.counts[bucket % _SLOTS] += 1

    def count(self, site: str, model: str, start: float, end: float) -> int:
        """Lookups for ``model`` at ``site`` in the buckets that overlap [start, end)."""
        series = self._pairs.get((site, model))
        return 0 if series is None else _sum(series, start, end)

    def pairs(self) -> list[tuple[str, str]]:
        """Every tracked (site, model), least recently looked up first."""
        return list(self._pairs)

    def windows(
        self, windows: Iterable[tuple[float, float]]
    ) -> Iterable[tuple[tuple[str, str], list[int]]]:
        """Per tracked pair, its lookups in each of ``windows`` ([start, end) pairs)."""
        spans = list(windows)
        for key, series in list(self._pairs.items()):
            yield key, [_sum(series, start, end) for start, end in spans]


def _sum(series: _Series, start: float, end: float) -> int:
    first = max(int(start // BUCKET_S), series.last - _SLOTS + 1)
    last = min(math.ceil(end / BUCKET_S) - 1, series.last)  # the last one starting before end
    if last < first:
        return 0
    counts, i, j = series.counts, first % _SLOTS, last % _SLOTS + 1
    return sum(counts[i:j]) if i < j else sum(counts[i:]) + sum(counts[:j])


@dataclass(frozen=True, slots=True)
class WarmthSettings:
    """The policy's knobs (config ``warm_*``)."""

    # Lookups this recent count as demand now (seconds).
    recent_window_s: float = 1800.0
    # Lookups within this of this time yesterday count as demand now (seconds; 0: never).
    yesterday_window_s: float = 3600.0
    # Lookups in either window at which a pair is wanted warm.
    min_lookups: int = 4
    # No second LOAD_MODEL to the same agent for the same model within this (seconds).
    backoff_s: float = 300.0
    # Commands sent per cycle at most.
    max_commands_per_cycle: int = 10
    # A warm agent's keep-alive is restarted this often while its pair is wanted (seconds;
    # below the agents' keep-alive, 300 s by default; 0: never).
    refresh_s: float = 120.0

    @classmethod
    def from_config(cls, config: CoordinatorConfig) -> WarmthSettings:
        return cls(
            recent_window_s=config.warm_recent_window_s,
            yesterday_window_s=config.warm_yesterday_window_s,
            min_lookups=config.warm_min_lookups,
            backoff_s=config.warm_backoff_s,
            max_commands_per_cycle=config.warm_max_commands_per_cycle,
            refresh_s=config.warm_refresh_s,
        )


@dataclass(frozen=True, slots=True)
class WarmLoad:
    """One LOAD_MODEL the policy decided on (or could not send), for logs and tests."""

    site: str
    model: str
    # The agent it went (or would have gone) to; "" when none had room.
    agent_id: str
    # SENT, NO_SESSION, NO_ROOM, OVER_CAP or REFRESHED.
    result: str
    # What made the pair wanted: its lookups recently, and around this time yesterday.
    recent: int
    yesterday: int


#: The agents at ``site`` (first) serving ``model`` (second).
AgentsAt = Callable[[str, str], list[AgentRecord]]
#: ``CoordinatorServicer.send_command``: (agent id, kind, reason, model) -> sent.
SendCommand = Callable[[str, str, str, str], bool]


def registry_agents_at(registry: FleetRegistry) -> AgentsAt:
    """``AgentsAt`` over the registry's fleet index: a set intersection per pair."""

    def at(site: str, model: str) -> list[AgentRecord]:
        index = registry.index
        here = index.at_site(site)
        if not here:
            return []
        return registry.find(sorted(here & index.serving(model)))

    return at


class WarmthPolicy:
    """Decides which agents get LOAD_MODEL for demand at their site (module doc)."""

    def __init__(
        self,
        tracker: DemandTracker,
        agents_at: AgentsAt,
        send: SendCommand,
        settings: WarmthSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[WarmLoad], None] | None = None,
    ) -> None:
        self._tracker = tracker
        self._agents_at = agents_at
        self._send = send
        self.settings = settings or WarmthSettings()
        self._clock = clock
        self._on_result = on_result
        # (agent id, model) -> when LOAD_MODEL was last sent; (site, model) -> when no agent
        # there had room (counted once per back-off)
        self._sent: dict[tuple[str, str], float] = {}
        self._no_room: dict[tuple[str, str], float] = {}
        # (agent id, model) -> when a warm agent's keep-alive was last restarted
        self._refreshed: dict[tuple[str, str], float] = {}
        # (agent id, model) -> until when an operator's unload holds warm loads back
        self._held: dict[tuple[str, str], float] = {}

    def operator_command(self, agent_id: str, model: str, *, load: bool) -> None:
        """An operator sent the agent LOAD_MODEL (``load``) or UNLOAD_MODEL of ``model``.
        After an unload no warm load of it goes to that agent for ``recent_window_s``: an
        operator's command outranks the demand. A load ends the hold."""
        key = (agent_id, model)
        if load:
            self._held.pop(key, None)
        else:
            self._held[key] = self._clock() + self.settings.recent_window_s

    def wanted(self, now: float | None = None) -> list[tuple[str, str, int, int]]:
        """The pairs wanted warm now, as (site, model, recent, yesterday), busiest first."""
        s = self.settings
        now = self._clock() if now is None else now
        spans = [(now - s.recent_window_s, now + 1.0)]  # this bucket included
        if s.yesterday_window_s > 0:
            then = now - DAY_S
            spans.append((then - s.yesterday_window_s, then + s.yesterday_window_s))
        found = []
        for (site, model), counts in self._tracker.windows(spans):
            recent = counts[0]
            yesterday = counts[1] if len(counts) > 1 else 0
            if recent >= s.min_lookups or yesterday >= s.min_lookups:
                found.append((site, model, recent, yesterday))
        found.sort(key=lambda w: (-max(w[2], w[3]), w[0], w[1]))
        return found

    def cycle(self) -> list[WarmLoad]:
        """One round: LOAD_MODEL where demand is and no eligible agent holds the model."""
        now, done = self._begin()
        sent = 0
        for wanted in self.wanted(now):
            sent += self._decide(wanted, now, done, sent)
        return self._end(done)

    async def cycle_in_slices(self, pairs_per_slice: int = CYCLE_SLICE) -> list[WarmLoad]:
        """``cycle``, letting the event loop serve after every ``pairs_per_slice`` pairs:
        in one pass, the 1,000 pairs with demand of the scale benchmark's fleet (500 sites,
        two models) held the loop about 50 ms every ``warm_interval_s``, route lookups
        waiting behind it."""
        now, done = self._begin()
        sent = 0
        for i, wanted in enumerate(self.wanted(now)):
            if i and not i % pairs_per_slice:
                await asyncio.sleep(0)
            sent += self._decide(wanted, now, done, sent)
        return self._end(done)

    def _begin(self) -> tuple[float, list[WarmLoad]]:
        """A round's start: what backed off or was held long enough is forgotten."""
        s = self.settings
        now = self._clock()
        for book in (self._sent, self._no_room):
            for key in [k for k, at in book.items() if now - at >= s.backoff_s]:
                del book[key]
        for key in [k for k, until in self._held.items() if now >= until]:
            del self._held[key]
        for key in [k for k, at in self._refreshed.items() if now - at >= s.refresh_s]:
            del self._refreshed[key]
        return now, []

    def _end(self, done: list[WarmLoad]) -> list[WarmLoad]:
        if self._on_result is not None:
            for load in done:
                self._on_result(load)
        return done

    def _decide(
        self, wanted: tuple[str, str, int, int], now: float, done: list[WarmLoad], sent: int
    ) -> bool:
        """One (site, model) with demand: refresh its warm agent, or send a load to the
        agent with the most room, or say why not (added to ``done``). ``sent``: the loads
        this round sent so far (``max_commands_per_cycle``); True when this one sent one."""
        site, model, recent, yesterday = wanted
        here = self._agents_at(site, model)
        eligible = [r for r in here if _eligible(r, site)]
        warm = [r for r in eligible if _warm(r, model)]
        if warm:
            # one agent kept warm is enough, and only one that loads on demand (it
            # reports a budget): others have nothing to refresh
            on_demand = [r for r in warm if _room(r) < 1 << 62]
            if on_demand:
                keep = min(on_demand, key=lambda r: (_load(r), r.agent_id))
                done += self._refresh(site, model, keep, now, recent, yesterday)
            return False
        if not eligible:
            return False
        cold = [
            r
            for r in eligible
            if (r.agent_id, model) not in self._sent and (r.agent_id, model) not in self._held
        ]
        if not cold:
            return False  # sent within the back-off (under way, or it went again), or held
        need = _weights_bytes(here, model)
        roomy = [r for r in cold if _room(r) >= need]
        if not roomy:
            if (site, model) not in self._no_room:
                self._no_room[(site, model)] = now
                done.append(WarmLoad(site, model, "", NO_ROOM, recent, yesterday))
            return False
        best = min(roomy, key=lambda r: (-_room(r), _load(r), r.agent_id))
        if sent >= self.settings.max_commands_per_cycle:
            done.append(WarmLoad(site, model, best.agent_id, OVER_CAP, recent, yesterday))
            return False
        ok = self._send(best.agent_id, "load_model", f"kept warm: demand at site {site}", model)
        self._sent[(best.agent_id, model)] = now
        done.append(
            WarmLoad(site, model, best.agent_id, SENT if ok else NO_SESSION, recent, yesterday)
        )
        return ok

    def _refresh(
        self, site: str, model: str, record: AgentRecord, now: float, recent: int,
        yesterday: int,
    ) -> list[WarmLoad]:  # fmt: skip
        """Restart the keep-alive of ``model`` on ``record``, an agent at ``site`` holding
        it (at most once per ``refresh_s``; never where an operator unloaded it)."""
        key = (record.agent_id, model)
        if self.settings.refresh_s <= 0 or key in self._refreshed or key in self._held:
            return []
        self._refreshed[key] = now
        ok = self._send(record.agent_id, "load_model", f"kept warm: demand at site {site}",
                        model)  # fmt: skip
        return [WarmLoad(site, model, record.agent_id, REFRESHED if ok else NO_SESSION, recent,
                         yesterday)]  # fmt: skip


def _eligible(record: AgentRecord, site: str) -> bool:
    """At ``site``, with a session on this coordinator, live, healthy, not draining."""
    report = record.last_report
    return (
        report is not None
        and record.hello.site == site
        and record.status is AgentStatus.CONNECTED
        and not record.remote
        and record.liveness is Liveness.LIVE
        and not record.draining
        and not report.draining
        and not report.unhealthy_reason
    )


def _warm(record: AgentRecord, model: str) -> bool:
    """It serves ``model`` with its weights in memory (or loads no model on demand)."""
    report = record.last_report
    cold = () if report is None else report.cold_models
    return record.serves(model) and all(name != model for name, _ in cold)


def _room(record: AgentRecord) -> int:
    """Its memory budget not committed yet, in bytes (huge: no budget reported)."""
    report = record.last_report
    if report is None or report.memory_budget_bytes <= 0:
        return 1 << 62
    return report.memory_budget_bytes - report.memory_committed_bytes


def _load(record: AgentRecord) -> int:
    report = record.last_report
    return 0 if report is None else report.running_sequences + report.waiting_sequences


def _weights_bytes(records: list[AgentRecord], model: str) -> int:
    """What ``model``'s weights take in memory, as well as the site's reports say: the
    largest resident size of it there, else the largest size of its files there; 1 when
    nothing says (any agent with room left then)."""
    resident = files = 0
    for r in records:
        if r.last_report is None:
            continue
        for item in r.last_report.inventory:
            if item.name == model:
                resident = max(resident, item.resident_bytes)
                files = max(files, item.bytes_total)
    return resident or files or 1
