"""Puts the rollout engine into a coordinator app: the app's store, the ReportHooks
callback, the tick every report interval, audit entries for what it does on its own, and
its ``/metrics`` families. The app's ``ClusterMembership`` (``app[CLUSTER_KEY]``) is the
engine's leadership: it runs rollouts only while this coordinator holds the leader lease,
its writes fenced by it (coordinator/rollouts/engine.py).

``create_app(config, rollouts=RolloutDeps(...))`` calls :func:`install_rollouts` (the
collaborators are given, the engine creates none; with the model catalog merged,
``create_app`` passes its own catalog and assignment layer when none are given).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.api.app_keys import (
    AUDIT_KEY,
    CLUSTER_KEY,
    CONFIG_KEY,
    METRICS_KEY,
    REGISTRY_KEY,
    ROLLOUTS_KEY,
    STORE_KEY,
)
from coordinator.background import periodic_task
from coordinator.fleet.metrics import PREFIX
from coordinator.rollouts.engine import (
    AssignmentsView,
    CatalogView,
    NotLeaderError,
    RolloutEngine,
    SelectorFactory,
)
from coordinator.rollouts.model import RolloutState
from edgefleet.contract import LoadReport

logger = logging.getLogger(__name__)

ReportHook = Callable[[str, LoadReport], None]


class RolloutMetrics(Collector):
    """``edgefleet_coordinator_rollouts{state}`` and the engine's counters, read at scrape."""

    def __init__(self, engine: RolloutEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        by_state = GaugeMetricFamily(
            f"{PREFIX}_rollouts", "Model rollouts, by state.", labels=["state"]
        )
        counts = self._engine.counts_by_state()
        for state in RolloutState:
            by_state.add_metric([state.value], float(counts.get(state.value, 0)))
        yield by_state
        rollbacks = CounterMetricFamily(
            f"{PREFIX}_rollout_rollbacks",
            "Rollouts rolled back by a failed gate since the coordinator started.",
        )
        rollbacks.add_metric([], float(self._engine.rollbacks))
        yield rollbacks
        invalid = CounterMetricFamily(
            f"{PREFIX}_rollout_invalid_model_stats",
            "ModelStats entries from agents ignored as impossible, since start.",
        )
        invalid.add_metric([], float(self._engine.invalid_stats))
        yield invalid
        active = GaugeMetricFamily(
            f"{PREFIX}_rollout_engine_active",
            "1 while the rollout engine runs here (this coordinator holds the leader lease), "
            "else 0.",
        )
        active.add_metric([], 1.0 if self._engine.active else 0.0)
        yield active
        takeovers = CounterMetricFamily(
            f"{PREFIX}_rollout_engine_takeovers",
            "Times the rollout engine here took the rollouts over from the store (a new "
            "tenure of the leader lease), since start.",
        )
        takeovers.add_metric([], float(self._engine.takeovers))
        yield takeovers


@dataclass(frozen=True, slots=True)
class RolloutDeps:
    """What the rollout engine is given: the model catalog, the assignment layer and its
    selector type, where to register its report hook, and its clock."""

    catalog: CatalogView
    assignments: AssignmentsView
    selector_factory: SelectorFactory
    add_report_hook: Callable[[ReportHook], object]
    clock: Callable[[], float] = time.time


def install_rollouts(app: web.Application, deps: RolloutDeps) -> RolloutEngine:
    """Create the engine on ``app`` (``app[ROLLOUTS_KEY]``); call before the app starts."""
    if ROLLOUTS_KEY in app:
        raise RuntimeError("this app has a rollout engine already")
    config = app[CONFIG_KEY]
    audit_log = app[AUDIT_KEY]

    async def audit(action: str, rollout_id: str, detail: str) -> None:
        await audit_log.append(action=action, outcome="ok", actor_id="coordinator",
                               actor_name="rollouts", target=f"rollout_id={rollout_id}",
                               peer="coordinator", detail=detail)  # fmt: skip

    engine = RolloutEngine(
        app[STORE_KEY],
        catalog=deps.catalog,
        assignments=deps.assignments,
        selector_factory=deps.selector_factory,
        registry=app[REGISTRY_KEY],
        clock=deps.clock,
        audit=audit,
        leadership=app.get(CLUSTER_KEY),
    )
    app[ROLLOUTS_KEY] = engine
    deps.add_report_hook(engine.on_report)
    app[METRICS_KEY].registry.register(RolloutMetrics(engine))
    period_s = config.report_interval_ms / 1000.0

    async def tick() -> None:
        try:
            await engine.tick()
        except NotLeaderError as exc:  # stopped at once; loads again once it leads
            logger.warning("rollouts: %s", exc)

    async def run(app: web.Application) -> AsyncIterator[None]:
        # After the app's store opened and the membership's first step (their cleanup
        # contexts come first): a leader resumes the rollouts at once.
        await engine.load()
        async with periodic_task("rollouts", period_s, tick):
            yield

    app.cleanup_ctx.append(run)
    return engine
