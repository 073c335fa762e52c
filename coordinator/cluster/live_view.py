"""Routing from any coordinator: the live state of the agents whose sessions are elsewhere.

Each coordinator routes from its registry (coordinator/fleet/registry.py). Its own agents'
live state (liveness, last-seen time, the last load report, the model stats each session
reported, summed) goes to table ``agent_last_state`` in the registry's periodic snapshot
(``save_last_states``: every report interval while other coordinators are alive, in
batches), written as this coordinator at the agent's ownership epoch and refused by the
store once the agent is owned by another coordinator or a newer session of it
(coordinator/store/last_state.py). Every write gives the row a new version.

``LiveView.poll()`` (every ``period_s``) reads the rows written after the last version it
read, in version order, and hands each other coordinator's row to the registry
(``apply_remote``): the agent is routed to with that coordinator's liveness and load, as a
*remote* record: no session here, so nothing is pushed to it, drained over a session or
swept here (its coordinator does all that). A row of an agent whose session is here
waits until that session ends (the ownership check ends a session whose agent moved).
The model stats in the rows, taken as differences from the previous row of the same
session, go to ``on_stats`` (the rollout engine's report hook: its gates count every
coordinator's agents).

A coordinator that membership says is not alive (by the database's clock) and that wrote
no row for ``lease_s``: its live and suspect agents are shown ``unconfirmed`` (routed
after live agents, as after a restart) until they reconnect elsewhere (the new owner's
rows, at a newer epoch, replace them) or ``restart_grace_s`` passes (then down).

Alone on its database (SQLite, or the only coordinator on record), ``poll`` reads nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from coordinator.cluster.membership import ClusterMembership
from coordinator.errors import StoreError
from coordinator.fleet.records import AgentRecord, AgentStatus
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.store.agents import AgentTable, StoredAgent
from coordinator.store.last_state import AgentLastState, LastStateTable
from edgefleet.contract import Histogram, LoadReport, ModelStats

logger = logging.getLogger(__name__)

#: Rows read per round trip.
BATCH = 1000
#: Stored agents read at once (the Hellos of agents new here, or of new sessions).
HELLO_READS = 32


class LiveViewStore(LastStateTable, AgentTable, Protocol):
    """What the live view needs of the store."""


StatsHook = Callable[[str, LoadReport], None]


def stats_difference(new: ModelStats, old: ModelStats | None) -> ModelStats | None:
    """What ``new`` (a session's sum) adds to ``old`` (its sum as last read); None when
    nothing (or the sums cannot be compared: then nothing is counted twice)."""
    if old is None:
        return new if new.requests or any(new.ttft_seconds.counts) else None
    requests = new.requests - old.requests
    if requests <= 0:
        return None
    hn, ho = new.ttft_seconds, old.ttft_seconds
    if not ho.counts:
        ttft = hn
    elif hn.upper_bounds == ho.upper_bounds and len(hn.counts) == len(ho.counts):
        counts = tuple(max(0, a - b) for a, b in zip(hn.counts, ho.counts, strict=True))
        ttft = Histogram(hn.upper_bounds, counts, max(0.0, hn.sum - ho.sum))
    else:
        return None
    return ModelStats(
        new.name,
        new.version,
        requests,
        max(0, min(requests, new.failed - old.failed)),
        max(0, new.prompt_tokens - old.prompt_tokens),
        max(0, new.completion_tokens - old.completion_tokens),
        ttft,
    )


class LiveView:
    """This coordinator's reader of the shared live view (see the module doc)."""

    def __init__(
        self,
        store: LiveViewStore,
        registry: LiveFleetRegistry,
        membership: ClusterMembership,
        *,
        period_s: float,
        on_change: Callable[[AgentRecord], None] = lambda record: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self._store = store
        self._registry = registry
        self._membership = membership
        self.period_s = period_s
        self._on_change = on_change
        self._on_stats: list[StatsHook] = []
        self._clock = clock
        self._monotonic = monotonic
        #: The newest row version read.
        self.version = 0
        #: Other coordinators' rows applied, and those that waited for a session here.
        self.applied = 0
        self._waiting: dict[str, AgentLastState] = {}
        #: From the newest applied row's write (the database's clock) to its apply here
        #: (this machine's clock: as exact as the two clocks agree).
        self.last_lag_s: float | None = None
        self.last_error: str | None = None
        self._read_once = False
        # each agent's stats sums as last read: (owner, epoch, {(name, version): sums})
        self._sums: dict[str, tuple[str, int, dict[tuple[str, str], ModelStats]]] = {}
        # when (monotonic) a row of each other coordinator was last read
        self._owner_seen: dict[str, float] = {}

    def on_stats(self, hook: StatsHook) -> None:
        """Hand the model stats other coordinators' agents served to ``hook(agent_id,
        report)`` (a report holding nothing but them), as they are read."""
        self._on_stats.append(hook)

    # ------------------------------------------------------------------ reading

    def shared(self) -> bool:
        """Whether any other coordinator is on record (or was, with agents here)."""
        me = self._membership.coordinator_id
        return any(m.coordinator_id != me for m in self._membership.members) or bool(
            self._registry.remote_count()
        )

    async def poll(self) -> int:
        """Read the rows written since the last read and apply the other coordinators';
        then mark the agents of dead coordinators unconfirmed. The rows applied."""
        others_alive = len(self._membership.alive()) > 1
        self._registry.sum_stats = others_alive
        if not self.shared():
            return 0
        applied = 0
        try:
            while True:
                batch = await self._store.live_states_after(self.version, BATCH)
                applied += await self._apply(batch)
                if batch:
                    self.version = batch[-1].version
                if len(batch) < BATCH:
                    break
            applied += await self._apply(list(self._ready()))
        except StoreError as exc:
            if self.last_error is None:
                logger.warning("live view: could not read the other coordinators' agents: %s",
                               exc)  # fmt: skip
            self.last_error = str(exc)
            return applied
        if self.last_error is not None:
            logger.info("live view: reading the other coordinators' agents again")
        self.last_error = None
        self._read_once = True
        self._orphans()
        return applied

    def _ready(self) -> Iterator[AgentLastState]:
        """Rows that waited for a session here that has ended since."""
        for agent_id, state in list(self._waiting.items()):
            record = self._registry.find((agent_id,))
            if not record or record[0].status is not AgentStatus.CONNECTED:
                del self._waiting[agent_id]
                yield state

    async def _apply(self, rows: list[AgentLastState]) -> int:
        me = self._membership.coordinator_id
        latest: dict[str, AgentLastState] = {}
        now = self._monotonic()
        for state in rows:
            if not state.owner or state.owner == me:
                continue  # this coordinator's own (or unfenced, from before owners)
            self._owner_seen[state.owner] = now
            self._count_stats(state)
            latest[state.agent_id] = state
        if not latest:
            return 0
        stored = await self._hellos(latest.values())
        applied = 0
        newest: AgentLastState | None = None
        for agent_id, state in latest.items():
            record = self._registry.apply_remote(state, stored.get(agent_id))
            if record is None:
                found = self._registry.find((agent_id,))
                if found and found[0].status is AgentStatus.CONNECTED:
                    self._waiting[agent_id] = state  # applied once its session here ends
                continue
            self._waiting.pop(agent_id, None)
            applied += 1
            self._on_change(record)
            if newest is None or state.version > newest.version:
                newest = state
        self.applied += applied
        if newest is not None and newest.written_at is not None:
            written = newest.written_at
            written = written if written.tzinfo else written.replace(tzinfo=UTC)
            self.last_lag_s = max(0.0, self._clock() - written.timestamp())
        return applied

    async def _hellos(self, states: Iterable[AgentLastState]) -> dict[str, StoredAgent | None]:
        """The stored records of the agents whose Hello this registry needs: those it does
        not hold, and those whose row is of another session than the record here (a new
        session may have announced other models or a fixed place)."""
        wanted: list[str] = []
        for state in states:
            found = self._registry.find((state.agent_id,))
            if not found or found[0].epoch not in (0, state.epoch):
                wanted.append(state.agent_id)
        stored: dict[str, StoredAgent | None] = {}
        for start in range(0, len(wanted), HELLO_READS):
            chunk = wanted[start : start + HELLO_READS]
            for agent_id, agent in zip(
                chunk, await asyncio.gather(*(self._store.get_agent(a) for a in chunk)),
                strict=True,
            ):  # fmt: skip
                stored[agent_id] = agent
        return stored

    def _count_stats(self, state: AgentLastState) -> None:
        """Hand what the agent served since its row as last read to the stats hooks (a
        row read at start only sets where to count from)."""
        held = self._sums.get(state.agent_id)
        sums = {(s.name, s.version): s for s in state.stats}
        if held is not None and (held[0], held[1]) == (state.owner, state.epoch):
            before = held[2]
        elif self._read_once:
            before = {}  # a new session: its sums start from nothing
        else:
            before = None  # the first read: served before this coordinator looked
        self._sums[state.agent_id] = (state.owner, state.epoch, sums)
        if before is None or not self._on_stats:
            return
        served = tuple(d for key, s in sums.items() if (d := stats_difference(s, before.get(key))))
        if not served:
            return
        report = LoadReport(model_stats=served)
        for hook in self._on_stats:
            hook(state.agent_id, report)

    def _orphans(self) -> None:
        """The agents of coordinators no longer alive: unconfirmed, later down."""
        if self._membership.last_error is not None:
            return  # the members as last read may be out of date
        alive = {m.coordinator_id for m in self._membership.alive()}
        now = self._monotonic()
        quiet = self._membership.lease_s
        dead = {
            owner
            for owner in self._registry.remote_owners()
            if owner not in alive and now - self._owner_seen.get(owner, -1e18) > quiet
        }
        changed = self._registry.orphan(dead) if dead else []
        if changed:
            logger.warning(
                "live view: %d agents of coordinator(s) %s, which is no longer alive, are "
                "unconfirmed until they reconnect elsewhere", len(changed),
                ", ".join(sorted(dead)),
            )  # fmt: skip
        changed += self._registry.expire_orphans()
        for record in changed:
            self._on_change(record)

    async def run(self) -> None:
        """Poll every ``period_s`` until cancelled."""
        while True:
            await self.poll()
            await asyncio.sleep(self.period_s)

    # -------------------------------------------------------------------- views

    def json(self) -> dict[str, object]:
        """``/healthz``'s ``live_view`` object (no error text: the log has it)."""
        return {
            "version": self.version,
            "applied": self.applied,
            "remote_agents": self._registry.remote_count(),
            "lag_s": None if self.last_lag_s is None else round(self.last_lag_s, 3),
            "ok": self.last_error is None,
        }

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_LiveViewCollector(self))


class _LiveViewCollector(Collector):
    def __init__(self, view: LiveView) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self._view
        yield CounterMetricFamily(
            "edgefleet_coordinator_live_view_rows_applied",
            "Other coordinators' agent live-state rows applied here (shared live view).",
            value=view.applied,
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_live_view_lag_seconds",
            "From the newest applied live-view row's write (database clock) to its apply "
            "here (this machine's clock); NaN before the first.",
            value=float("nan") if view.last_lag_s is None else view.last_lag_s,
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_remote_agents",
            "Agents routed here whose sessions are on other coordinators.",
            value=float(view._registry.remote_count()),
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_live_view_version",
            "The newest live-view row version this coordinator has read.",
            value=float(view.version),
        )
