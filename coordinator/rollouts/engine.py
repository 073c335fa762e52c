"""Staged model rollouts: canary, waves, soak, gates and automatic rollback.

A rollout moves the agents a selector matches from their version of a model to a new one
in steps: a canary (a count or a percentage of the agents), then waves (cumulative
percentages). Each step's agents get an explicit assignment of the new version
(``ModelAssignments.assign``, which pushes their ModelsSection); the step is then watched
for ``soak_s`` seconds of wall clock from its STORED start (a restart does not reset it)
and must pass its gate (``coordinator.rollouts.gates``: loaded and self-checked on every
moved agent, enough requests, error rate, TTFT p99 against the previous version from
merged histograms). A passed step moves the next one; the last one completing sets the
selector's rule to the new version (agents that join later get it) and drops the
per-agent overrides.

A failed gate stops the rollout and moves every agent it moved back to the version it
desired before (Greengrass's rollback semantics): their overrides are cleared, and where
the rule would give another version than the one they had, they are assigned that one.
Operators pause (no step moves, the soak clock stops), resume and abort (rolls back too,
unless asked to keep the moved agents where they are).

Collaborators are given to the engine (it creates none): the model catalog, the
assignment layer, a factory for the assignment layer's selector, the fleet registry (who
exists, their last inventory) and the store (coordinator/store/rollouts.py). Its clock is
a parameter, so tests advance time without sleeping. ``await load()`` resumes the active
rollouts; ``tick()`` drives them (the app awaits it every report interval); ``on_report``
is the ReportHooks callback that collects ModelStats (in memory: no store call). Operator
actions and ticks take turns (one lock): each awaits its store writes and assignment
changes, and none sees another half done.

Only the leader runs rollouts (issue 24). Given a ``leadership`` (the app's
``ClusterMembership``), the engine is *active* only while that coordinator holds the
leader lease: on each tick it looks at the lease's fence; a new tenure (an epoch it has not
loaded under) reloads the running and paused rollouts from the store, each at its stored
step with its stored soak start (so the soak goes on where the old leader left it, and a
soak already over passes at the next tick). Every rollout write carries the fence
(``save_rollout(..., fence=...)``): a refused one (``LeaseLostError``) stops the engine at
once (the membership is told, nothing in memory is kept, no further write or push) until
it leads again. Before every push of model sections (assign, clear, set_rule) the engine
checks that the fence is still the one it loaded under, which a leader paused past its
lease knows on waking by its own monotonic clock. An inactive engine answers reads from
the store and refuses actions with :class:`NotLeaderError` (the HTTP API forwards them to
the leader). Without a ``leadership`` (tests, a bare engine) it always leads, unfenced.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from coordinator.errors import RecoverableError
from coordinator.fleet.records import AgentRecord
from coordinator.fleet.registry import FleetRegistry
from coordinator.rollouts.gates import (
    GateResult,
    InvalidStats,
    MergedHistogram,
    StepStats,
    Verdict,
    check_stats,
    evaluate_gate,
)
from coordinator.rollouts.model import Rollout, RolloutPolicy, RolloutState, SelectorSpec
from coordinator.store.membership import LeaseFence, LeaseLostError
from coordinator.store.rollouts import RolloutTable
from edgefleet.contract import LoadReport, ModelInventory, ModelStats

logger = logging.getLogger(__name__)

# The previous version's TTFT is remembered over this window before a rollout starts
# (per minute), for the gate's baseline.
BASELINE_WINDOW_S = 3600.0
BASELINE_BUCKET_S = 60.0
# (model, version) pairs whose recent TTFT is remembered at most (agents cannot grow it).
MAX_TRACKED_VERSIONS = 512


# ------------------------------------------------------------------ collaborators


class CatalogVersionView(Protocol):
    @property
    def deprecated(self) -> bool: ...


class CatalogView(Protocol):
    """What the engine needs of ``coordinator.catalog.catalog.ModelCatalog``."""

    def get(self, name: str, version: str) -> CatalogVersionView | None: ...


class AssignmentView(Protocol):
    @property
    def version(self) -> str: ...


class SelectorView(Protocol):
    """``coordinator.catalog.assignments.Selector``."""

    def matches(self, record: AgentRecord) -> bool: ...


class AssignmentsView(Protocol):
    """What the engine needs of ``coordinator.catalog.assignments.ModelAssignments``."""

    async def set_rule(
        self, selector: Any, name: str, version: str, rollout_id: str = ""
    ) -> object: ...

    async def assign(
        self, agent_ids: Iterable[str], name: str, version: str, rollout_id: str = ""
    ) -> object: ...

    async def clear(self, agent_ids: Iterable[str], name: str) -> object: ...

    def desired_for(self, agent_id: str) -> Mapping[str, AssignmentView]: ...


class Leadership(Protocol):
    """What the engine needs of ``coordinator.cluster.membership.ClusterMembership``."""

    @property
    def fence(self) -> LeaseFence | None: ...

    def lost(self, exc: LeaseLostError) -> None: ...


SelectorFactory = Callable[..., SelectorView]
# audit(action, target, detail): an entry in the audit log by the coordinator itself.
AuditHook = Callable[[str, str, str], Awaitable[None]]


# ------------------------------------------------------------------ errors


class RolloutError(RecoverableError):
    """A rollout request that cannot be done (answered 4xx)."""

    status = 400
    code = "rollout_error"


class UnknownRolloutError(RolloutError):
    status = 404
    code = "rollout_not_found"

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"no rollout {rollout_id!r}")


class RolloutConflictError(RolloutError):
    """The request does not fit the rollout's (or the model's) current state."""

    status = 409
    code = "rollout_conflict"


class UnknownVersionError(RolloutError):
    status = 404
    code = "model_version_not_found"


class NotLeaderError(RolloutError):
    """This coordinator does not lead (or stopped leading): rollouts run on the leader."""

    status = 503
    code = "not_leader"


# ------------------------------------------------------------------ baseline window


class RecentTtft:
    """Recent TTFT histograms per (model, version), in per-minute buckets."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], deque[tuple[float, MergedHistogram]]] = {}

    def add(self, at: float, stats: ModelStats) -> None:
        key = (stats.name, stats.version)
        buckets = self._buckets.get(key)
        if buckets is None:
            if len(self._buckets) >= MAX_TRACKED_VERSIONS:
                return
            buckets = self._buckets[key] = deque()
        start = at - at % BASELINE_BUCKET_S
        if not buckets or buckets[-1][0] != start:
            buckets.append((start, MergedHistogram()))
        buckets[-1][1].add(stats.ttft_seconds)
        while buckets and buckets[0][0] < at - BASELINE_WINDOW_S:
            buckets.popleft()

    def merged(self, name: str, version: str, since: float) -> MergedHistogram:
        out = MergedHistogram()
        for start, histogram in self._buckets.get((name, version), ()):
            if start + BASELINE_BUCKET_S > since:
                out.add(histogram)
        return out


# ------------------------------------------------------------------ the engine


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one tick did (for logs and tests)."""

    moved: tuple[str, ...] = ()  # rollout ids whose next step was moved
    passed: tuple[str, ...] = ()
    completed: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()


class RolloutEngine:
    """Runs every rollout: start, tick, pause/resume/abort, and the stats hook."""

    def __init__(
        self,
        store: RolloutTable,
        *,
        catalog: CatalogView,
        assignments: AssignmentsView,
        selector_factory: SelectorFactory,
        registry: FleetRegistry,
        clock: Callable[[], float] = time.time,
        audit: AuditHook | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._store = store
        self._leadership = leadership
        # Whether this engine runs rollouts now, and the fence it loaded them under (None
        # without a leadership: unfenced writes).
        self._leading = False
        self._fence: LeaseFence | None = None
        #: Times this engine took over (loaded the rollouts for a new tenure) / stood down.
        self.takeovers = 0
        self.stand_downs = 0
        self._catalog = catalog
        self._assignments = assignments
        self._selector_factory = selector_factory
        self._registry = registry
        self._clock = clock
        self._audit = audit
        self._recent = RecentTtft()
        # Active rollouts (running or paused), by id: loaded from the store (load()).
        self._active: dict[str, Rollout] = {}
        # Rollouts in the store by state (the metric), and each active one's stored state.
        self._counts: Counter[str] = Counter()
        self._stored_state: dict[str, str] = {}
        self._turn = asyncio.Lock()
        self._dirty: set[str] = set()
        # The current step's agents as a set, per rollout (the report hook's lookup).
        self._step_sets: dict[str, tuple[int, frozenset[str]]] = {}
        # Every agent moved so far as a set, per rollout (keyed by steps moved).
        self._moved_sets: dict[str, tuple[int, frozenset[str]]] = {}
        self.invalid_stats = 0
        self.rollbacks = 0

    @property
    def active(self) -> bool:
        """Whether this engine runs the rollouts now (this coordinator leads)."""
        return self._leading

    async def load(self) -> None:
        """Resume the rollouts the store holds as running or paused (with a leadership:
        only when this coordinator leads; else just the counts, and ``tick`` takes over
        once it leads)."""
        if self._leadership is None:
            await self._load()
            self._leading = True
        elif not await self._lead():
            self._counts = Counter(await self._store.count_rollouts_by_state())

    async def _lead(self) -> bool:
        """Whether this engine may run rollouts now: stands down when the lease is gone,
        (re)loads the rollouts from the store on a new tenure."""
        if self._leadership is None:
            return self._leading
        fence = self._leadership.fence
        if fence is not None and self._leading and fence == self._fence:
            return True
        if self._leading:
            self._stand_down("this coordinator no longer leads")
        if fence is None:
            return False
        self._fence = fence
        await self._load()  # a StoreError leaves it inactive: tried again next tick
        self._leading = True
        self.takeovers += 1
        # The agents each rollout moved desire its version here too (the previous leader
        # assigned them through its own assignment layer; they may reconnect here).
        for rollout in list(self._active.values()):
            moved = rollout.moved_agents()
            if not moved:
                continue
            self._check_lead()
            try:
                await self._assignments.assign(
                    moved, rollout.model, rollout.version, rollout.rollout_id
                )
            except Exception as exc:  # the rollout goes on: its gate waits for them
                logger.warning("rollout %s: could not assign %s@%s to its %d moved agents "
                               "here: %s", rollout.rollout_id, rollout.model, rollout.version,
                               len(moved), exc)  # fmt: skip
        logger.info("rollout engine active: this coordinator leads (epoch %d), %d rollouts "
                    "resumed from the store", fence.epoch, len(self._active))  # fmt: skip
        return True

    def _stand_down(self, why: str) -> None:
        """Stop at once: forget the rollouts in memory (the store has them; the next
        leader, or this one leading again, loads them)."""
        if self._leading:
            self.stand_downs += 1
            logger.warning("rollout engine stopped: %s (%d rollouts left to the leader)",
                           why, len(self._active))  # fmt: skip
        self._leading = False
        self._fence = None
        self._active.clear()
        self._stored_state.clear()
        self._step_sets.clear()
        self._moved_sets.clear()
        self._dirty.clear()

    def _check_lead(self) -> None:
        """Raise NotLeaderError unless the lease is still the one the rollouts were loaded
        under (before each push of model sections, and each write)."""
        if self._leadership is None:
            return
        if not self._leading or self._leadership.fence != self._fence:
            self._stand_down("the leader lease is no longer this coordinator's")
            raise NotLeaderError("this coordinator no longer leads; rollouts run on the leader")

    async def _load(self) -> None:
        self._active.clear()
        self._stored_state.clear()
        self._step_sets.clear()
        self._moved_sets.clear()
        self._dirty.clear()
        active = (RolloutState.RUNNING.value, RolloutState.PAUSED.value)
        stored = await self._store.list_rollouts(states=active, limit=1_000_000)
        self._counts = Counter(await self._store.count_rollouts_by_state())
        for found in stored:
            rollout = Rollout.from_json(found.body)
            self._active[rollout.rollout_id] = rollout
            self._stored_state[rollout.rollout_id] = found.state
            logger.info("rollout %s of %s@%s resumes at step %d (%s)", rollout.rollout_id,
                        rollout.model, rollout.version, rollout.step, rollout.state)  # fmt: skip

    # -------------------------------------------------------------- reads

    async def get(self, rollout_id: str) -> Rollout:
        found = self._active.get(rollout_id)
        if found is None:
            stored = await self._store.get_rollout(rollout_id)
            if stored is None:
                raise UnknownRolloutError(rollout_id)
            found = Rollout.from_json(stored.body)
        return found

    async def rollouts(
        self, states: tuple[RolloutState, ...] = (), limit: int = 1000
    ) -> list[Rollout]:
        """Newest first; active ones from memory (their stats are the latest)."""
        stored = await self._store.list_rollouts(states=[s.value for s in states], limit=limit)
        return [self._active.get(r.rollout_id) or Rollout.from_json(r.body) for r in stored]

    def counts_by_state(self) -> dict[str, int]:
        """Rollouts in the store by state (kept as they are saved: no store call)."""
        return {state: n for state, n in self._counts.items() if n > 0}

    # -------------------------------------------------------------- operator actions

    async def start(self, policy: RolloutPolicy, *, created_by: str = "") -> Rollout:
        """Plan a rollout and move its canary; raises RolloutError."""
        async with self._turn:
            await self._require_lead()
            return await self._start(policy, created_by)

    async def _start(self, policy: RolloutPolicy, created_by: str) -> Rollout:
        found = self._catalog.get(policy.model, policy.version)
        if found is None:
            raise UnknownVersionError(f"{policy.model}@{policy.version} is not in the catalog")
        if found.deprecated:
            raise RolloutConflictError(f"{policy.model}@{policy.version} is deprecated")
        busy = [r for r in self._active.values() if r.model == policy.model]
        if busy:
            raise RolloutConflictError(
                f"rollout {busy[0].rollout_id} of {policy.model} is {busy[0].state.value}: "
                "abort it or let it finish first"
            )
        if policy.from_version and self._catalog.get(policy.model, policy.from_version) is None:
            raise UnknownVersionError(
                f"{policy.model}@{policy.from_version} (from_version) is not in the catalog"
            )
        agents = self._matching(policy.selector)
        if not agents:
            raise RolloutConflictError("the selector matches no agent the coordinator knows")
        prior = {}
        for agent_id in agents:
            desired = self._assignments.desired_for(agent_id).get(policy.model)
            prior[agent_id] = "" if desired is None else desired.version
        previous = policy.from_version or _most_common(
            v for v in prior.values() if v and v != policy.version
        )
        now = self._clock()
        rollout = Rollout(
            rollout_id="ro-" + secrets.token_hex(6),
            policy=policy,
            previous_version=previous,
            plan=policy.plan(agents),
            prior=prior,
            created_at=now,
            updated_at=now,
            created_by=created_by,
            baseline=self._recent.merged(policy.model, previous, now - BASELINE_WINDOW_S)
            if previous
            else MergedHistogram(),
        )
        rollout.note(now, "started", agents=len(agents), steps=len(rollout.plan))
        self._active[rollout.rollout_id] = rollout
        await self._move_step(rollout, now)
        logger.info("rollout %s: %s@%s over %d agents in %d steps (from %s)",
                    rollout.rollout_id, policy.model, policy.version, len(agents),
                    len(rollout.plan), previous or "nothing")  # fmt: skip
        return rollout

    async def _require_lead(self) -> None:
        if not await self._lead():
            raise NotLeaderError("this coordinator does not lead; rollouts run on the leader")

    async def pause(self, rollout_id: str) -> Rollout:
        async with self._turn:
            await self._require_lead()
            rollout = await self._active_one(rollout_id)
            if rollout.state == RolloutState.RUNNING:
                now = self._clock()
                rollout.state, rollout.paused_at = RolloutState.PAUSED, now
                rollout.note(now, "paused", step=rollout.step)
                await self._save(rollout, now)
            return rollout

    async def resume(self, rollout_id: str) -> Rollout:
        async with self._turn:
            await self._require_lead()
            rollout = await self._active_one(rollout_id)
            if rollout.state == RolloutState.PAUSED:
                now = self._clock()
                if rollout.step_started_at is not None and rollout.paused_at is not None:
                    rollout.step_started_at += max(0.0, now - rollout.paused_at)
                rollout.state, rollout.paused_at = RolloutState.RUNNING, None
                rollout.note(now, "resumed", step=rollout.step)
                await self._save(rollout, now)
            return rollout

    async def abort(self, rollout_id: str, *, rollback: bool = True, reason: str = "") -> Rollout:
        async with self._turn:
            await self._require_lead()
            rollout = await self._active_one(rollout_id)
            now = self._clock()
            detail = reason or "aborted by an operator"
            if rollback:
                await self._send_back(rollout)
                detail += "; moved agents sent back to their previous version"
            else:
                detail += "; moved agents kept on the new version"
            await self._finish(rollout, RolloutState.ABORTED, detail, now)
            return rollout

    # -------------------------------------------------------------- stats

    def on_report(self, agent_id: str, report: LoadReport) -> None:
        """ReportHooks callback: count each version's stats toward gates and baselines."""
        if not report.model_stats:
            return
        now = self._clock()
        for stats in report.model_stats:
            try:
                check_stats(stats)
            except InvalidStats as exc:
                self.invalid_stats += 1
                if self.invalid_stats == 1 or self.invalid_stats % 1000 == 0:
                    logger.warning("agent %s sent invalid model stats (%s); ignored (%d so far)",
                                   agent_id, exc, self.invalid_stats)  # fmt: skip
                continue
            self._recent.add(now, stats)
            for rollout in self._active.values():
                if rollout.model != stats.name:
                    continue
                if stats.version == rollout.version:
                    if rollout.step_started_at is not None and agent_id in self._step_set(rollout):
                        rollout.step_stats.add(stats)
                        self._dirty.add(rollout.rollout_id)
                elif stats.version == rollout.previous_version:
                    if agent_id in self._moved_set(rollout):
                        continue  # served while it swapped: measures the swap, not the version
                    rollout.baseline.add(stats.ttft_seconds)
                    if rollout.step_started_at is not None:
                        rollout.control.add(stats.ttft_seconds)
                    self._dirty.add(rollout.rollout_id)

    # -------------------------------------------------------------- the clock

    async def tick(self) -> TickResult:
        """Move, judge, complete or roll back every running rollout; save what changed.
        Not leading: nothing but the counts (from the store); a lease lost meanwhile
        stops it at once (NotLeaderError)."""
        async with self._turn:
            if not await self._lead():
                self._counts = Counter(await self._store.count_rollouts_by_state())
                return TickResult()
            return await self._tick()

    async def _tick(self) -> TickResult:
        now = self._clock()
        moved: list[str] = []
        passed: list[str] = []
        completed: list[str] = []
        rolled_back: list[str] = []
        for rollout in list(self._active.values()):
            if rollout.state != RolloutState.RUNNING:
                continue
            if rollout.step_started_at is None:
                await self._move_step(rollout, now)
                moved.append(rollout.rollout_id)
                continue
            gate = self.gate(rollout, now)
            rollout.last_gate = gate.json()
            self._dirty.add(rollout.rollout_id)
            timeout = rollout.policy.step_timeout_s
            if gate.verdict == Verdict.FAIL or (
                gate.verdict == Verdict.WAIT and timeout > 0 and gate.soak_elapsed_s > timeout
            ):
                why = "; ".join(gate.reasons)
                if gate.verdict == Verdict.WAIT:
                    why = f"step not passed within step_timeout_s={timeout:g}: {why}"
                await self._roll_back(rollout, why, now)
                rolled_back.append(rollout.rollout_id)
            elif gate.verdict == Verdict.PASS:
                passed.append(rollout.rollout_id)
                rollout.note(now, "step_passed", step=rollout.step, gate=gate.json())
                # audited once the step's outcome is saved (fenced): a leader that lost
                # its lease meanwhile audits nothing, and its successor passes it once
                audit = f"step {rollout.step}: {gate.requests} requests"
                if rollout.step + 1 >= len(rollout.plan):
                    await self._save(rollout, now)
                    await self._audit_step_passed(rollout, audit)
                    await self._complete(rollout, now)
                    completed.append(rollout.rollout_id)
                else:
                    rollout.step += 1
                    rollout.step_started_at = None
                    rollout.step_stats = StepStats()
                    await self._move_step(rollout, now)
                    await self._audit_step_passed(rollout, audit)
                    moved.append(rollout.rollout_id)
            else:
                rollout.detail = "waiting: " + "; ".join(gate.reasons)
        for rollout_id in list(self._dirty):
            changed = self._active.get(rollout_id)
            if changed is not None:
                await self._save(changed, now)
        self._dirty.clear()
        return TickResult(tuple(moved), tuple(passed), tuple(completed), tuple(rolled_back))

    async def _audit_step_passed(self, rollout: Rollout, detail: str) -> None:
        if self._audit is not None:
            await self._audit("rollout step passed", rollout.rollout_id, detail)

    def gate(self, rollout: Rollout, now: float | None = None) -> GateResult:
        """The current step's gate as it stands."""
        now = self._clock() if now is None else now
        started = rollout.step_started_at if rollout.step_started_at is not None else now
        end = rollout.paused_at if rollout.paused_at is not None else now
        return evaluate_gate(
            thresholds=rollout.policy.thresholds,
            # Agents removed from the fleet since the plan was made are not waited for.
            inventories={
                r.agent_id: self._inventory(r, rollout)
                for r in self._registry.find(rollout.current_agents())
            },
            stats=rollout.step_stats,
            baseline=rollout.baseline,
            control=rollout.control,
            soak_elapsed_s=max(0.0, end - started),
            soak_s=rollout.policy.soak_s,
        )

    # -------------------------------------------------------------- internals

    async def _active_one(self, rollout_id: str) -> Rollout:
        active = self._active.get(rollout_id)
        if active is None:
            done = await self._store.get_rollout(rollout_id)
            if done is None:
                raise UnknownRolloutError(rollout_id)
            raise RolloutConflictError(f"rollout {rollout_id} is {done.state} already")
        return active

    def _step_set(self, rollout: Rollout) -> frozenset[str]:
        cached = self._step_sets.get(rollout.rollout_id)
        if cached is None or cached[0] != rollout.step:
            cached = (rollout.step, frozenset(rollout.current_agents()))
            self._step_sets[rollout.rollout_id] = cached
        return cached[1]

    def _moved_set(self, rollout: Rollout) -> frozenset[str]:
        upto = rollout.step + (1 if rollout.step_started_at is not None else 0)
        cached = self._moved_sets.get(rollout.rollout_id)
        if cached is None or cached[0] != upto:
            cached = (upto, frozenset(rollout.moved_agents()))
            self._moved_sets[rollout.rollout_id] = cached
        return cached[1]

    def _matching(self, spec: SelectorSpec) -> list[str]:
        selector = self._selector_factory(
            sites=spec.sites, labels=spec.labels, agent_ids=spec.agent_ids
        )
        return sorted(r.agent_id for r in self._registry.agents() if selector.matches(r))

    def _inventory(self, record: AgentRecord, rollout: Rollout) -> ModelInventory | None:
        report = record.last_report
        if report is None:
            return None
        for entry in report.inventory:
            if entry.name == rollout.model and entry.version == rollout.version:
                return entry
        return None

    async def _move_step(self, rollout: Rollout, now: float) -> None:
        # Saved (fenced) before any push: a leader that lost its lease learns it here and
        # moves nobody; a rollout stored with its step not started yet is moved (again:
        # the same assignment) by whichever coordinator leads next.
        rollout.step_started_at = None
        await self._save(rollout, now)
        agents = rollout.current_agents()
        await self._assignments.assign(agents, rollout.model, rollout.version, rollout.rollout_id)
        rollout.step_started_at = now
        rollout.step_stats = StepStats()
        rollout.control = MergedHistogram()
        rollout.detail = f"step {rollout.step} moved {len(agents)} agents"
        rollout.note(now, "step_moved", step=rollout.step, agents=len(agents))
        await self._save(rollout, now)

    async def _complete(self, rollout: Rollout, now: float) -> None:
        await self._save(rollout, now)  # fenced, before any push (see _move_step)
        spec = rollout.policy.selector
        selector = self._selector_factory(
            sites=spec.sites, labels=spec.labels, agent_ids=spec.agent_ids
        )
        await self._assignments.set_rule(
            selector, rollout.model, rollout.version, rollout.rollout_id
        )
        await self._assignments.clear([a for step in rollout.plan for a in step], rollout.model)
        await self._finish(rollout, RolloutState.COMPLETED,
                     f"every step passed; the selector's rule is {rollout.model}@"
                     f"{rollout.version}", now)  # fmt: skip

    async def _roll_back(self, rollout: Rollout, why: str, now: float) -> None:
        moved = await self._send_back(rollout)
        self.rollbacks += 1
        logger.warning(
            "rollout %s of %s@%s failed its gate at step %d (%s): %d agents sent back to %s",
            rollout.rollout_id, rollout.model, rollout.version, rollout.step, why, len(moved),
            rollout.previous_version or "nothing",
        )  # fmt: skip
        await self._finish(rollout, RolloutState.ROLLED_BACK,
                     f"gate failed at step {rollout.step}: {why}", now)  # fmt: skip

    async def _send_back(self, rollout: Rollout) -> list[str]:
        """Every moved agent back to the version it desired before the rollout."""
        moved = rollout.moved_agents()
        if not moved:
            return moved
        await self._save(rollout, self._clock())  # fenced, before any push (see _move_step)
        await self._assignments.clear(moved, rollout.model)
        back: dict[str, list[str]] = {}
        for agent_id in moved:
            before = rollout.prior.get(agent_id, "")
            now_desired = self._assignments.desired_for(agent_id).get(rollout.model)
            if before and (now_desired is None or now_desired.version != before):
                back.setdefault(before, []).append(agent_id)
        for version, agent_ids in back.items():
            await self._assignments.assign(agent_ids, rollout.model, version)
        return moved

    async def _finish(self, rollout: Rollout, state: RolloutState, detail: str, now: float) -> None:
        rollout.state, rollout.detail, rollout.finished_at = state, detail, now
        rollout.paused_at = None
        rollout.note(now, state.value, detail=detail)
        await self._save(rollout, now)
        self._active.pop(rollout.rollout_id, None)
        self._step_sets.pop(rollout.rollout_id, None)
        self._moved_sets.pop(rollout.rollout_id, None)
        self._stored_state.pop(rollout.rollout_id, None)
        if self._audit is not None:
            await self._audit(f"rollout {state.value}", rollout.rollout_id, detail)

    async def _save(self, rollout: Rollout, now: float) -> None:
        self._check_lead()
        begun = time.monotonic()  # (a write refused later was begun while the lease held)
        rollout.updated_at = now
        stored = rollout.stored()
        if self._fence is not None:  # which leader wrote it (operators, tests)
            saved_by = {"coordinator_id": self._fence.holder, "epoch": self._fence.epoch}
            stored = replace(stored, body={**stored.body, "saved_by": saved_by})
        try:
            await self._store.save_rollout(stored, fence=self._fence)
        except LeaseLostError as exc:
            # another coordinator leads now: stop at once, nothing more written or pushed
            if self._leadership is not None:
                self._leadership.lost(exc)
            # the monotonic clock is the system's: a test compares it with when it paused
            # this process (a write under way then is refused on waking; none begins after)
            self._stand_down(f"a rollout write begun at monotonic {begun:.3f} was refused ({exc})")
            raise NotLeaderError(f"this coordinator no longer leads: {exc}") from exc
        self._dirty.discard(rollout.rollout_id)
        before = self._stored_state.get(rollout.rollout_id)
        if before != rollout.state.value:
            if before is not None:
                self._counts[before] -= 1
            self._counts[rollout.state.value] += 1
            self._stored_state[rollout.rollout_id] = rollout.state.value


def _most_common(versions: Iterable[str]) -> str:
    counts = Counter(versions)
    if not counts:
        return ""
    top = max(counts.values())
    return min(v for v, n in counts.items() if n == top)
