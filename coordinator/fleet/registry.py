"""The fleet registry: which agents exist, their sessions, inventory, load and liveness.

``FleetRegistry`` is the interface transport code talks to. ``LiveFleetRegistry``
keeps the live view (sessions, load samples, liveness) in memory and writes what must
survive a restart to a ``FleetStore``: each agent's Hello and draining flag as they
change (queued behind the change in memory, coordinator/store/write_behind.py: its
methods stay synchronous and never wait for the store; ``flush`` waits for the writes),
and its live state (liveness, last-seen time, last load report) in batched snapshots
(``save_last_states``, driven by the app's lifecycle). On start (``load``) it reloads
those agents: the ones that were live or suspect as ``UNCONFIRMED`` (still routed,
after live agents) until they reconnect or ``restart_grace_s`` ends, the rest as down.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from coordinator.errors import FleetFullError, SessionTakenError, UnknownAgentError
from coordinator.fleet.index import FleetIndex
from coordinator.fleet.load_table import LoadTable, TableRecords
from coordinator.fleet.records import (
    AgentRecord,
    AgentStatus,
    Liveness,
    routing_hello,
    served_models,
)
from coordinator.store.agents import AgentTable, StoredAgent
from coordinator.store.generations import GenerationCounter, GenerationTable
from coordinator.store.interface import StoreUnavailableError
from coordinator.store.last_state import AgentLastState, LastStateTable
from coordinator.store.write_behind import WriteBehind
from edgefleet.contract import (
    SECTION_FIELDS,
    DesiredState,
    Hello,
    Histogram,
    LoadReport,
    ModelStats,
    Section,
)

logger = logging.getLogger(__name__)

# Agents named one by one per sweep when their liveness changes (or between two sweeps,
# when they come back); the rest are counted in one line. When a whole fleet falls silent
# at once (a cut network, a coordinator starved of CPU) and comes back, thousands of lines
# a second would only add to the load that caused it.
LOG_EACH = 10
# How long a save of the live state waits for the registry's queued writes.
SAVE_WAIT_S = 10.0
# The sweep asks the load table for agents silent since a little after the suspect
# cut: its timestamps are floats, the records' datetimes exact (see sweep()).
SEEN_SLACK_S = 0.001
# Agents the live-state save looks at before it lets the event loop serve (the whole
# fleet at once held it 10-35 ms every save on 5,000 agents).
SNAPSHOT_SLICE = 100

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def add_stats(a: ModelStats, b: ModelStats) -> ModelStats:
    """Two stats of one model version summed (histograms bucket by bucket; ``b``'s when
    the bounds differ, which one agent's never do)."""
    ha, hb = a.ttft_seconds, b.ttft_seconds
    if ha.upper_bounds == hb.upper_bounds and len(ha.counts) == len(hb.counts):
        ttft = Histogram(
            ha.upper_bounds,
            tuple(x + y for x, y in zip(ha.counts, hb.counts, strict=True)),
            ha.sum + hb.sum,
        )
    else:
        ttft = hb if hb.counts else ha
    return ModelStats(
        a.name,
        a.version,
        a.requests + b.requests,
        a.failed + b.failed,
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        ttft,
    )


class FleetRegistry(Protocol):
    """What the transports need from fleet state. Methods are quick and never block long."""

    @property
    def index(self) -> FleetIndex:
        """Candidate lookup by model, site and place."""
        ...

    @property
    def load_table(self) -> LoadTable:
        """Every agent's routing inputs in columns (the router's fast path)."""
        ...

    def open_session(self, hello: Hello, *, enrolled: bool = False) -> str:
        """Record that an agent connected; return the new session id.

        A newer session of an enrolled (authenticated) agent replaces an older one for
        the same agent. An unenrolled Hello never replaces a live session (raises
        SessionTakenError): anyone could send it.
        """
        ...

    def remove(self, agent_id: str) -> AgentRecord:
        """Forget an agent (its live record and its index entry); raises UnknownAgentError."""
        ...

    def claimed(self, agent_id: str, session_id: str, epoch: int) -> None:
        """The session claimed the agent at ownership ``epoch`` (coordinator/store/
        ownership.py; ignored when superseded)."""
        ...

    def record_report(self, agent_id: str, session_id: str, report: LoadReport) -> None:
        """Store the latest load sample of a session (ignored when superseded)."""
        ...

    def record_bye(self, agent_id: str, session_id: str, reason: str) -> None:
        """Note that the agent said goodbye on purpose (it is down from now on)."""
        ...

    def close_session(self, agent_id: str, session_id: str) -> bool:
        """Mark the agent disconnected if this is its current session.

        Returns True when the agent is now disconnected, False when a newer
        session had already replaced this one.
        """
        ...

    def get(self, agent_id: str) -> AgentRecord:
        """One agent's record; raises UnknownAgentError."""
        ...

    def find(self, agent_ids: Iterable[str]) -> list[AgentRecord]:
        """The records of those ids that exist."""
        ...

    def agents(self) -> list[AgentRecord]:
        """Every known agent, connected or not, ordered by agent id."""
        ...

    def connected_count(self) -> int: ...

    def known_count(self) -> int: ...

    def set_draining(self, agent_id: str, draining: bool) -> AgentRecord:
        """Drain (or resume) an agent; raises UnknownAgentError."""
        ...

    def sweep(self, *, forget_stale: bool = True) -> list[AgentRecord]:
        """Update liveness from the time since each agent's last message (an agent whose
        session ended without a Bye is suspect at once). ``forget_stale``: also forget
        (and delete from the database) never-enrolled agents disconnected for
        ``stale_unenrolled_after_s``: a fleet-wide job, the leader's only (issue 24).

        Returns the records whose liveness changed.
        """
        ...

    def desired_state(self, agent_id: str) -> DesiredState:
        """What the agent should run now: every section set for it, with its generation."""
        ...

    def set_section(self, agent_id: str, section: Section) -> DesiredState:
        """Replace one section of an agent's desired state; return the new state.

        The section takes the next generation of the store's counter, whatever generation
        it came with (coordinator/store/generations.py: newer than any this store's coordinators
        sent, also after a restart); the state's version grows. Raises UnknownAgentError,
        or StoreError when the counter's next block cannot be written.
        """
        ...

    async def save_last_states(self, batch_size: int = 500) -> int:
        """Write the live state of every agent that changed since the last save, one
        store transaction per ``batch_size`` agents; the number written."""
        ...

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every store write queued so far (sessions opened and closed,
        draining flags, agents forgotten) is written; False when ``timeout_s`` passed
        first (the database away: the writes stay queued)."""
        ...


class RegistryStore(AgentTable, LastStateTable, GenerationTable, Protocol):
    """What the registry needs of the store."""


class LiveFleetRegistry:
    """FleetRegistry for one coordinator process, persisting through a FleetStore.

    ``await load()`` (or construct with ``await LiveFleetRegistry.open(store)``) before use.
    """

    def __init__(
        self,
        store: RegistryStore,
        *,
        report_interval_ms: int = 2000,
        suspect_after_reports: int = 2,
        down_after_reports: int = 5,
        restart_grace_s: float = 30.0,
        max_agents: int = 20_000,
        stale_unenrolled_after_s: float = 3600.0,
        coordinator_id: str = "",
        clock: Clock = utc_now,
    ) -> None:
        self._store = store
        #: This coordinator (the owner its sessions' live states are written as; "": one
        #: coordinator, written unfenced).
        self.coordinator_id = coordinator_id
        #: Sum the model stats each session reports (the shared live view carries them to
        #: the leader's rollout gates: coordinator/cluster/live_view.py); set while other
        #: coordinators share the database.
        self.sum_stats = False
        self._stats: dict[str, dict[tuple[str, str], ModelStats]] = {}
        # Agents whose sessions are on another coordinator: id -> that coordinator.
        self._remote: dict[str, str] = {}
        # Remote agents shown unconfirmed since their coordinator died: id -> since when.
        self._orphaned: dict[str, datetime] = {}
        self._clock = clock
        # "live again" lines logged since the last sweep, and those counted instead
        self._back_logged = self._back_unlogged = 0
        self._writes = WriteBehind("fleet registry")
        self._generations = GenerationCounter(
            store.reserve_generations, demand=lambda: len(self._agents)
        )
        self._restart_grace = timedelta(seconds=restart_grace_s)
        # Agents on record at most (new ids beyond it are refused), and how long a
        # never-enrolled agent may stay disconnected before its record is removed.
        self.max_agents = max_agents
        self._stale_after = timedelta(seconds=stale_unenrolled_after_s)
        interval = timedelta(milliseconds=report_interval_ms)
        self._suspect_after = interval * suspect_after_reports
        self._down_after = interval * down_after_reports
        # every record stored here is mirrored into the router's load table
        self._table = LoadTable()
        self._agents: dict[str, AgentRecord] = TableRecords(self._table)
        self._connected = 0
        self._index = FleetIndex()
        # What was last saved of each agent's live state, to skip unchanged agents.
        self._saved: dict[str, tuple[datetime, str]] = {}
        # Agents known before a restart stay routable (unconfirmed) until then (load()).
        self._grace_ends = clock() + self._restart_grace

    @classmethod
    async def open(cls, store: RegistryStore, **options: object) -> LiveFleetRegistry:
        """A registry with the agents on record loaded."""
        registry = cls(store, **options)  # type: ignore[arg-type]
        await registry.load()
        return registry

    async def load(self) -> None:
        """Reload the agents on record and reserve the first section generations."""
        stored, states = await self._store.list_agents(), await self._store.list_last_states()
        now = self._clock()
        self._grace_ends = now + self._restart_grace
        self._restore(stored, states, now)
        await self._generations.start()

    async def fresh_generations(self, agent_id: str) -> None:
        """The agent's session opened here with other coordinators alive: hand out only
        generations reserved from now on (coordinator/store/generations.py), and give
        every section it is about to be sent one of them, so none is older than what its
        previous coordinator sent it."""
        if not await self._generations.fresh():
            return
        record = self._agents.get(agent_id)
        if record is None:
            return
        for section in record.desired.sections():
            self.set_section(agent_id, section)

    @property
    def writes(self) -> WriteBehind:
        """The queue of this registry's store writes."""
        return self._writes

    async def flush(self, timeout_s: float | None = None) -> bool:
        if not await self._writes.flush(timeout_s):
            return False
        await self._generations.close()
        return True

    @property
    def index(self) -> FleetIndex:
        return self._index

    @property
    def load_table(self) -> LoadTable:
        return self._table

    def open_session(self, hello: Hello, *, enrolled: bool = False) -> str:
        now = self._clock()
        session_id = uuid.uuid4().hex
        previous = self._agents.get(hello.agent_id)
        if previous is None:
            self._make_room(hello.agent_id, enrolled=enrolled)
        draining = False
        if (
            not enrolled
            and previous is not None
            and previous.status is AgentStatus.CONNECTED
            and previous.liveness is not Liveness.DOWN
        ):
            raise SessionTakenError(
                f"agent {hello.agent_id!r} already has a live session ({previous.session_id}); "
                "an unauthenticated Hello cannot replace it (enroll the agent, or wait until "
                "its session ends)"
            )
        if previous is not None:
            draining = previous.draining
            if previous.status is AgentStatus.CONNECTED:
                self._connected -= 1
                logger.info(
                    "agent %s opened session %s, replacing session %s",
                    hello.agent_id,
                    session_id,
                    previous.session_id,
                )
        self._agents[hello.agent_id] = AgentRecord(
            hello=hello,
            status=AgentStatus.CONNECTED,
            session_id=session_id,
            connected_since=now,
            last_seen=now,
            # Keep the previous sample: better than nothing until the next one.
            last_report=previous.last_report if previous is not None else None,
            liveness=Liveness.LIVE,
            draining=draining,
            enrolled=enrolled,
            desired=previous.desired if previous is not None else DesiredState(),
            owner=self.coordinator_id,
        )
        self._connected += 1
        self._stats.pop(hello.agent_id, None)
        if self._remote.pop(hello.agent_id, None) is not None:
            self._orphaned.pop(hello.agent_id, None)
        kept = None if previous is None else previous.last_report
        if previous is None or routing_hello(previous.hello, kept) != routing_hello(hello, kept):
            self._index.put(routing_hello(hello, kept))
        if previous is not None and previous.liveness is not Liveness.LIVE:
            self._log_live_again(hello.agent_id, previous.liveness)
        self._writes.submit(
            lambda: self._store.save_hello(hello, now), f"agent {hello.agent_id}'s Hello"
        )
        return session_id

    def claimed(self, agent_id: str, session_id: str, epoch: int) -> None:
        """The session ``session_id`` claimed the agent at ``epoch`` (its live states are
        written at that epoch: a write after the agent moved on is refused)."""
        record = self._current(agent_id, session_id)
        if record is not None:
            self._agents[agent_id] = replace(record, epoch=epoch)

    def record_report(self, agent_id: str, session_id: str, report: LoadReport) -> None:
        record = self._current(agent_id, session_id)
        if record is None:
            return
        if report.model_stats and self.sum_stats:
            self._sum_stats(agent_id, report.model_stats)
        if record.liveness is not Liveness.LIVE:
            self._log_live_again(agent_id, record.liveness)
        if report.unhealthy_reason != record.unhealthy_reason:
            if report.unhealthy_reason:
                logger.warning(
                    "agent %s is unhealthy (no routes): %s", agent_id, report.unhealthy_reason
                )
            else:
                logger.info("agent %s is healthy again", agent_id)
        if report.inventory or (record.last_report is not None and record.last_report.inventory):
            before = served_models(record.hello, record.last_report)
            if served_models(record.hello, report) != before:  # re-index what it serves
                self._index.put(routing_hello(record.hello, report))
        self._agents[agent_id] = record.reported(report, self._clock())

    def record_bye(self, agent_id: str, session_id: str, reason: str) -> None:
        record = self._current(agent_id, session_id)
        if record is not None:
            self._agents[agent_id] = replace(
                record, bye_reason=reason, last_seen=self._clock(), liveness=Liveness.DOWN
            )

    def close_session(self, agent_id: str, session_id: str) -> bool:
        record = self._current(agent_id, session_id)
        if record is None or record.status is not AgentStatus.CONNECTED:
            return False
        self._agents[agent_id] = replace(
            record, status=AgentStatus.DISCONNECTED, connected_since=None
        )
        self._connected -= 1
        seen = record.last_seen
        self._writes.submit(
            lambda: self._store.save_last_seen(agent_id, seen), f"agent {agent_id}'s last seen"
        )
        return True

    def remove(self, agent_id: str) -> AgentRecord:
        record = self._agents.pop(agent_id, None)
        if record is None:
            raise UnknownAgentError(agent_id)
        if record.status is AgentStatus.CONNECTED:
            self._connected -= 1
        self._index.remove(agent_id)
        self._saved.pop(agent_id, None)
        self._forget_remote(agent_id)
        logger.info("agent %s removed from the registry", agent_id)
        return record

    def get(self, agent_id: str) -> AgentRecord:
        try:
            return self._agents[agent_id]
        except KeyError:
            raise UnknownAgentError(agent_id) from None

    def find(self, agent_ids: Iterable[str]) -> list[AgentRecord]:
        agents = self._agents
        return [agents[i] for i in agent_ids if i in agents]

    def agents(self) -> list[AgentRecord]:
        return [self._agents[key] for key in sorted(self._agents)]

    def connected_count(self) -> int:
        return self._connected

    def known_count(self) -> int:
        return len(self._agents)

    def set_draining(self, agent_id: str, draining: bool) -> AgentRecord:
        record = self.get(agent_id)
        self._writes.submit(
            lambda: self._store.set_draining(agent_id, draining), f"agent {agent_id} draining"
        )
        report = record.last_report
        if not draining and report is not None and report.draining:
            # The resume supersedes the agent's last word; its next report confirms it.
            report = report._replace(draining=False)
        record = replace(record, draining=draining, last_report=report)
        self._agents[agent_id] = record
        logger.info("agent %s %s", agent_id, "draining" if draining else "resumed")
        return record

    def _log_live_again(self, agent_id: str, was: Liveness) -> None:
        if self._back_logged < LOG_EACH:
            self._back_logged += 1
            logger.info("agent %s is live again (was %s)", agent_id, was)
        else:
            self._back_unlogged += 1

    def sweep(self, *, forget_stale: bool = True) -> list[AgentRecord]:
        now = self._clock()
        if self._back_unlogged:
            logger.info("and %d more agents live again", self._back_unlogged)
        self._back_logged = self._back_unlogged = 0
        if forget_stale:
            self.remove_stale_unenrolled(now)
        changed: list[AgentRecord] = []
        expired: list[AgentRecord] = []
        # silent for down_after (suspect_after) or longer: last seen at or before these
        down_before, suspect_before = now - self._down_after, now - self._suspect_after
        # the agents that can change (a pass in numpy: looking at every record, in
        # Python, held the event loop 8-20 ms every quarter interval on 5,000 agents)
        agents = self._agents
        for agent_id in self._table.sweep_candidates(suspect_before.timestamp() + SEEN_SLACK_S):
            record = agents[agent_id]
            if record.liveness is Liveness.DOWN or record.remote:
                continue  # a remote agent's liveness is its coordinator's (live_view.py)
            if record.liveness is Liveness.UNCONFIRMED:
                if (after_grace := self._sweep_unconfirmed(now)) is not None:
                    record = replace(record, liveness=after_grace)
                    self._agents[agent_id] = record
                    expired.append(record)
                continue
            last_seen = record.last_seen
            if last_seen <= down_before:
                liveness = Liveness.DOWN
            elif last_seen <= suspect_before or record.status is AgentStatus.DISCONNECTED:
                # a session that ended without a Bye (a crash, a cut link): ranked after
                # every live agent at once, not after two missed reports; still routed, as
                # it may be serving its site, until its reports are overdue
                liveness = Liveness.SUSPECT
            else:
                continue
            if liveness is not record.liveness:
                record = replace(record, liveness=liveness)
                self._agents[agent_id] = record
                changed.append(record)
        for record in changed[:LOG_EACH]:
            logger.warning(
                "agent %s is %s: no report for %.1f s%s",
                record.agent_id,
                record.liveness,
                (now - record.last_seen).total_seconds(),
                " (its session ended without a Bye)"
                if record.status is AgentStatus.DISCONNECTED
                else "",
            )
        if len(changed) > LOG_EACH:
            more = Counter(str(r.liveness) for r in changed[LOG_EACH:])
            logger.warning(
                "and %d more agents: %s",
                len(changed) - LOG_EACH,
                ", ".join(f"{n} {liveness}" for liveness, n in sorted(more.items())),
            )
        if expired:
            logger.warning(
                "%d agents known before the restart did not reconnect within the grace "
                "period; they are down (e.g. %s)",
                len(expired),
                ", ".join(r.agent_id for r in expired[:5]),
            )
        return changed + expired

    def desired_state(self, agent_id: str) -> DesiredState:
        record = self._agents.get(agent_id)
        return DesiredState() if record is None else record.desired

    def set_section(self, agent_id: str, section: Section) -> DesiredState:
        record = self.get(agent_id)
        held = record.desired
        name = SECTION_FIELDS[type(section)]
        generation = self._generations.next()
        desired = held.with_section(replace(section, generation=generation))
        desired = replace(desired, version=held.version + 1)
        self._agents[agent_id] = replace(record, desired=desired)
        # the models section changes when an operator acts: logged; overflow targets and
        # keys are pushed to every agent when peers' room or budgets move (thousands a
        # minute in a large fleet: a line each cost an eighth of the coordinator's CPU
        # when a starved fleet's liveness flapped), so at debug only (metrics count them)
        logger.log(
            logging.INFO if name == "models" else logging.DEBUG,
            "agent %s: desired %s is now generation %d (version %d)",
            agent_id,
            name,
            generation,
            desired.version,
        )
        return desired

    # ------------------------------------------------------------------ bounds

    def _make_room(self, agent_id: str, *, enrolled: bool) -> None:
        """Room for one more agent, or FleetFullError.

        At the cap, an enrolled newcomer takes the place of the never-enrolled,
        disconnected agent seen longest ago (so a flood of unauthenticated Hellos cannot
        lock enrolled agents out); anyone else is refused.
        """
        if len(self._agents) < self.max_agents:
            return
        if enrolled:
            idle = [
                r
                for r in self._agents.values()
                if not r.enrolled and r.status is AgentStatus.DISCONNECTED
            ]
            if idle:
                victim = min(idle, key=lambda r: r.last_seen)
                logger.warning(
                    "fleet at max_agents (%d): enrolled agent %s replaces never-enrolled "
                    "agent %s (disconnected since %s)",
                    self.max_agents,
                    agent_id,
                    victim.agent_id,
                    victim.last_seen.isoformat(timespec="seconds"),
                )
                self._remove([victim.agent_id])
                return
        raise FleetFullError(
            f"the coordinator holds its maximum of {self.max_agents} agents (max_agents); "
            f"agent {agent_id} is new and cannot be added"
        )

    def remove_stale_unenrolled(self, now: datetime | None = None) -> list[str]:
        """Forget never-enrolled agents disconnected for ``stale_unenrolled_after_s``."""
        if self._connected == len(self._agents):
            return []  # every agent is connected (each sweep asks: no pass over the fleet)
        cutoff = (self._clock() if now is None else now) - self._stale_after
        stale = [
            agent_id
            for agent_id, r in self._agents.items()
            if not r.enrolled
            and r.status is AgentStatus.DISCONNECTED
            and not r.remote
            and r.last_seen < cutoff
        ]
        if stale:
            self._remove(stale)
            logger.info(
                "removed %d never-enrolled agents not seen for %.0f s (e.g. %s)",
                len(stale),
                self._stale_after.total_seconds(),
                ", ".join(stale[:5]),
            )
        return stale

    def _remove(self, agent_ids: list[str]) -> None:
        for agent_id in agent_ids:
            del self._agents[agent_id]
            self._saved.pop(agent_id, None)
            self._index.remove(agent_id)
            self._forget_remote(agent_id)
        gone = list(agent_ids)
        self._writes.submit(
            lambda: self._store.delete_unenrolled_agents(gone), f"{len(gone)} agents forgotten"
        )

    # ------------------------------------------------ restart: restore and save

    def _restore(
        self, stored_agents: list[StoredAgent], last_states: list[AgentLastState], now: datetime
    ) -> None:
        """Reload the agents on record: unconfirmed when they were last seen alive.

        An agent is unconfirmed when its saved state says live, suspect or unconfirmed
        (opening a session saves "live" at once, so a kill before the next snapshot
        loses no agent); down when it says down or nothing was saved (a database from
        before states were saved).
        """
        states = {s.agent_id: s for s in last_states}
        unconfirmed = 0
        for stored in stored_agents:
            if stored.hello is None:
                continue
            state = states.get(stored.agent_id)
            alive = state is not None and state.liveness is not Liveness.DOWN
            if state is not None:
                last_seen, report = state.last_seen, state.report
            else:
                last_seen, report = stored.last_seen or now, None
            unconfirmed += alive
            self._agents[stored.agent_id] = AgentRecord(
                hello=stored.hello,
                status=AgentStatus.DISCONNECTED,
                session_id="",
                connected_since=None,
                last_seen=last_seen,
                last_report=report,
                liveness=Liveness.UNCONFIRMED if alive else Liveness.DOWN,
                draining=stored.draining,
                enrolled=stored.enrolled,
            )
            self._index.put(routing_hello(stored.hello, report))
        if self._agents:
            logger.info(
                "restored %d agents from the store: %d unconfirmed (routed until they "
                "reconnect or the grace period ends at %s), %d down",
                self.known_count(),
                unconfirmed,
                self._grace_ends.isoformat(timespec="seconds"),
                self.known_count() - unconfirmed,
            )

    async def save_last_states(self, batch_size: int = 500) -> int:
        # Writes queued before the snapshot land before it (a Hello's "live" must not
        # overwrite the "down" of a Bye that came after it); while the database is away
        # they wait, and so does this save (tried again next period).
        if not await self._writes.flush(SAVE_WAIT_S):
            raise StoreUnavailableError(
                f"{self._writes.pending()} queued writes are still waiting for the fleet "
                "database; the live state is saved after them"
            )
        changed: list[AgentLastState] = []
        fingerprints: list[tuple[str, tuple[datetime, str]]] = []
        saved = self._saved
        records = list(self._agents.values())  # immutable: each agent's state as of now
        for start in range(0, len(records), SNAPSHOT_SLICE):
            if start:
                await asyncio.sleep(0)  # let lookups and reports in between slices
            for record in records[start : start + SNAPSHOT_SLICE]:
                if record.remote:
                    continue  # its coordinator writes it
                agent_id = record.agent_id
                fingerprint = (record.last_seen, record.liveness.value)
                if saved.get(agent_id) != fingerprint:
                    stats = self._stats.get(agent_id)
                    changed.append(
                        AgentLastState(
                            agent_id,
                            record.liveness,
                            record.last_seen,
                            record.last_report,
                            epoch=record.epoch,
                            stats=() if stats is None else tuple(stats.values()),
                        )
                    )
                    fingerprints.append((agent_id, fingerprint))
        written = 0
        owner = self.coordinator_id
        for start in range(0, len(changed), batch_size):
            batch = changed[start : start + batch_size]
            refused = await self._store.save_last_states(batch, self._clock(), owner=owner)
            if refused:  # moved on: the new owner's session is newer (not tried again)
                logger.info(
                    "live state of %d agents not written: another coordinator owns them "
                    "now (e.g. %s)", len(refused), ", ".join(refused[:5]),
                )  # fmt: skip
            agents = self._agents  # an agent forgotten meanwhile stays forgotten
            saved.update(f for f in fingerprints[start : start + batch_size] if f[0] in agents)
            written += len(batch) - len(refused or ())
        return written

    # ------------------------------------------- the shared live view (remote agents)

    def _sum_stats(self, agent_id: str, reported: Iterable[ModelStats]) -> None:
        totals = self._stats.get(agent_id)
        if totals is None:
            totals = self._stats[agent_id] = {}
        for stats in reported:
            key = (stats.name, stats.version)
            held = totals.get(key)
            totals[key] = stats if held is None else add_stats(held, stats)

    def remote_owner(self, agent_id: str) -> str | None:
        """The coordinator a remote agent's session is on; None for an agent not remote."""
        return self._remote.get(agent_id)

    def remote_owners(self) -> set[str]:
        """The coordinators the remote agents' sessions are on."""
        return set(self._remote.values())

    def remote_count(self) -> int:
        return len(self._remote)

    def _forget_remote(self, agent_id: str) -> None:
        self._remote.pop(agent_id, None)
        self._orphaned.pop(agent_id, None)
        self._stats.pop(agent_id, None)

    def apply_remote(
        self, state: AgentLastState, stored: StoredAgent | None = None
    ) -> AgentRecord | None:
        """Another coordinator's row of the shared live view (its agent's session is
        there): the agent's record here becomes that row (remote), routed to with the
        row's liveness and load. ``stored``: the agent's record from the store, needed
        when this registry does not hold it yet or the row is of a new session (its
        Hello). Returns the new record, or None when the row is not applied: the agent
        has a session here (this coordinator's record wins until it ends: the ownership
        check ends it when the agent moved), the row is of an older session than the
        record here (epochs grow with every session open), the agent is unknown or
        revoked, or the fleet is at ``max_agents``."""
        agent_id = state.agent_id
        previous = self._agents.get(agent_id)
        if previous is not None and previous.status is AgentStatus.CONNECTED:
            return None
        if previous is not None and previous.epoch > state.epoch:
            return None  # of a session older than the one this record is of
        if stored is not None and (stored.revoked or stored.hello is None):
            return None
        hello = stored.hello if stored is not None else None
        if hello is None:
            if previous is None:
                return None
            hello = previous.hello
        if previous is None:
            if len(self._agents) >= self.max_agents:
                return None
            draining = stored.draining if stored is not None else False
            enrolled = stored.enrolled if stored is not None else False
            desired = DesiredState()
        else:
            draining, enrolled, desired = previous.draining, previous.enrolled, previous.desired
        record = AgentRecord(
            hello=hello,
            status=AgentStatus.DISCONNECTED,
            session_id="",
            connected_since=None,
            last_seen=state.last_seen,
            last_report=state.report,
            liveness=state.liveness,
            draining=draining,
            enrolled=enrolled,
            desired=desired,
            owner=state.owner,
            epoch=state.epoch,
            remote=True,
        )
        self._agents[agent_id] = record
        self._remote[agent_id] = state.owner
        self._orphaned.pop(agent_id, None)
        self._saved.pop(agent_id, None)
        before = None if previous is None else routing_hello(previous.hello, previous.last_report)
        now = routing_hello(hello, state.report)
        if before != now:
            self._index.put(now)
        return record

    def orphan(self, dead: set[str], now: datetime | None = None) -> list[AgentRecord]:
        """The coordinators ``dead`` are not alive (membership, by the database's clock):
        their live and suspect agents are unconfirmed (routed after live agents, as after a
        restart) until they reconnect elsewhere or ``restart_grace_s`` passes (then down:
        ``expire_orphans``). The records changed."""
        now = self._clock() if now is None else now
        changed: list[AgentRecord] = []
        for agent_id, owner in self._remote.items():
            if owner not in dead or agent_id in self._orphaned:
                continue
            record = self._agents[agent_id]
            self._orphaned[agent_id] = now
            if record.liveness in (Liveness.LIVE, Liveness.SUSPECT):
                record = replace(record, liveness=Liveness.UNCONFIRMED)
                self._agents[agent_id] = record
                changed.append(record)
        return changed

    def expire_orphans(self, now: datetime | None = None) -> list[AgentRecord]:
        """Orphaned agents unconfirmed for ``restart_grace_s``: down. The records changed."""
        if not self._orphaned:
            return []
        now = self._clock() if now is None else now
        cutoff = now - self._restart_grace
        changed: list[AgentRecord] = []
        for agent_id, since in list(self._orphaned.items()):
            if since > cutoff:
                continue
            del self._orphaned[agent_id]
            record = self._agents.get(agent_id)
            if record is not None and record.remote and record.liveness is Liveness.UNCONFIRMED:
                record = replace(record, liveness=Liveness.DOWN)
                self._agents[agent_id] = record
                changed.append(record)
        return changed

    def _sweep_unconfirmed(self, now: datetime) -> Liveness | None:
        """Down once the restart grace period is over without a session; else unchanged."""
        return Liveness.DOWN if now >= self._grace_ends else None

    def _current(self, agent_id: str, session_id: str) -> AgentRecord | None:
        record = self._agents.get(agent_id)
        if record is None or record.session_id != session_id:
            return None
        return record
