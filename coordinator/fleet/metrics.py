"""Prometheus metrics of the coordinator, all named ``edgefleet_coordinator_*``.

Each app gets its own CollectorRegistry, so several coordinators (or test
apps) can live in one process.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.fleet.records import AgentRecord, Liveness
from coordinator.fleet.registry import FleetRegistry
from edgefleet.contract import OverflowUsage

PREFIX = "edgefleet_coordinator"
# Fine below 5 ms (the lookup target) so a p99 is resolved to a quarter millisecond.
ROUTE_BUCKETS = (
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175,
    0.002, 0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
MAX_TARGET_LABELS = 100
#: A session's opening, Hello to Welcome: milliseconds alone, seconds in a reconnect storm.
SESSION_OPEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Event-loop lag (coordinator.loop_lag): from an idle loop's millisecond to a stuck one,
# fine enough between 10 ms and 1 s that the longest stall of a window is read closely.
LOOP_LAG_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


def display_status(record: AgentRecord) -> str:
    """The dashboard's status of an agent: draining, live, suspect or down (an agent
    not confirmed since a restart counts as suspect: routed after every live one)."""
    if record.liveness is Liveness.DOWN:
        return "down"
    if record.draining or (record.last_report is not None and record.last_report.draining):
        return "draining"
    if record.liveness is Liveness.LIVE:
        return "live"
    return "suspect"


class _AgentsByStatus(Collector):
    """edgefleet_coordinator_agents{status,site}: computed at scrape time."""

    def __init__(self, fleet: FleetRegistry) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_agents",
            "Known agents by dashboard status (live, suspect, down, draining) and site.",
            labels=["status", "site"],
        )
        tally = Tally((display_status(r), r.hello.site) for r in self._fleet.agents())
        for status in ("live", "suspect", "down", "draining"):  # every status, even at 0
            if not any(s == status for s, _ in tally):
                family.add_metric([status, ""], 0.0)
        for (status, site), count in sorted(tally.items()):
            family.add_metric([status, site], float(count))
        yield family


class CoordinatorMetrics:
    """The coordinator's counters and gauges."""

    def __init__(self, fleet: FleetRegistry) -> None:
        self.registry = CollectorRegistry()
        self.connected_agents = Gauge(
            f"{PREFIX}_connected_agents",
            "Agents with an open control session.",
            registry=self.registry,
        )
        self.connected_agents.set_function(lambda: float(fleet.connected_count()))
        self.known_agents = Gauge(
            f"{PREFIX}_known_agents",
            "Agents the registry knows, connected or not.",
            registry=self.registry,
        )
        self.known_agents.set_function(lambda: float(fleet.known_count()))
        self.sessions = Counter(
            f"{PREFIX}_sessions",
            "Control sessions accepted (Hello answered with Welcome).",
            registry=self.registry,
        )
        self.sessions_superseded = Counter(
            f"{PREFIX}_sessions_superseded",
            "Sessions ended here because the agent's session moved to another coordinator "
            "(a stale session: coordinator/store/ownership.py).",
            registry=self.registry,
        )
        self.session_open_seconds = Histogram(
            f"{PREFIX}_session_open_seconds",
            "From an agent's Hello to its Welcome, by step: authenticate (its credentials "
            "and revocations, from the database), claim (this coordinator recorded as its "
            "owner), generations (fresh section generations, with other coordinators "
            "alive), total. The agent sends no report before its Welcome.",
            ["step"],
            buckets=SESSION_OPEN_BUCKETS,
            registry=self.registry,
        )
        self.sessions_rejected = Counter(
            f"{PREFIX}_sessions_rejected",
            "Control sessions refused, by reason.",
            ["reason"],
            registry=self.registry,
        )
        # v1.3: overflow use reported by agents (LoadReport.overflow_usage), by target
        self.overflow_requests = Counter(
            f"{PREFIX}_overflow_requests",
            "Requests agents sent to each overflow target, by outcome",
            ["target", "outcome"],
            registry=self.registry,
        )
        self.overflow_tokens = Counter(
            f"{PREFIX}_overflow_tokens",
            "Tokens used at each overflow target, as agents reported them",
            ["target", "type"],
            registry=self.registry,
        )
        self.overflow_cost = Counter(
            f"{PREFIX}_overflow_cost",
            "Cost at each overflow target (its prices per 1k tokens), as agents reported it",
            ["target"],
            registry=self.registry,
        )
        self.load_reports = Counter(
            f"{PREFIX}_load_reports",
            "Load reports received from agents.",
            registry=self.registry,
        )
        self.route_requests = Counter(
            f"{PREFIX}_route_requests",
            "Route lookups answered (gRPC or HTTP).",
            registry=self.registry,
        )
        self.route_seconds = Histogram(
            f"{PREFIX}_route_seconds",
            "Time to answer a route lookup (gRPC or HTTP), scoring included.",
            buckets=ROUTE_BUCKETS,
            registry=self.registry,
        )
        # issue 26: models kept warm where their demand is (coordinator/routing/warmth.py)
        self.warm_loads = Counter(
            f"{PREFIX}_warm_loads",
            "LOAD_MODEL commands the warm-by-demand policy decided on, by result: sent; "
            "no_session (the agent's session was gone); no_room (no agent at the site had "
            "the model's size free in its memory budget; once per back-off); over_cap (past "
            "warm_max_commands_per_cycle, tried next run).",
            ["result"],
            registry=self.registry,
        )
        self.warm_tracked_pairs = Gauge(
            f"{PREFIX}_warm_tracked_pairs",
            "(site, model) pairs whose route lookups are counted for warm-by-demand (at "
            "most warm_max_pairs).",
            registry=self.registry,
        )
        self.gc_pause_seconds = Histogram(
            f"{PREFIX}_gc_pause_seconds",
            "Garbage-collector pauses of the coordinator process, by generation.",
            ["generation"],
            buckets=GC_BUCKETS,
            registry=self.registry,
        )
        self.event_loop_lag_seconds = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 10 ms: how long agent sessions "
            "and route lookups waited behind whatever held the loop.",
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.event_loop_info = Gauge(
            f"{PREFIX}_event_loop_info",
            "The event loop the coordinator runs on (uvloop or asyncio): 1 for the one in use.",
            ["loop"],
            registry=self.registry,
        )
        self.grpc_threads_lowered = Gauge(
            f"{PREFIX}_grpc_threads_lowered",
            "gRPC's own I/O threads running at niceness grpc_thread_nice, behind the event "
            "loop (0 where not Linux or grpc_thread_nice is 0).",
            registry=self.registry,
        )
        self.enrollments = Counter(
            f"{PREFIX}_enrollments",
            "Enroll calls, by result (ok or the refusal reason).",
            ["result"],
            registry=self.registry,
        )
        self.liveness_changes = Counter(
            f"{PREFIX}_liveness_changes",
            "Agents that became suspect or down, by new state.",
            ["liveness"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests served, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_records = Counter(
            f"{PREFIX}_request_records",
            "Per-request records from agents, by outcome: stored; invalid (refused as "
            "malformed); lost_at_agent (the agent's spool was full, reported in the batch); "
            "pruned (the oldest, removed here when the table reached its cap).",
            ["outcome"],
            registry=self.registry,
        )
        # Coordinator egress for model sync (what site-local distribution saves).
        self.blob_bytes_sent = Counter(
            f"{PREFIX}_blob_bytes_sent",
            "Model blob bytes sent from the coordinator's blob store, by reader kind.",
            ["reader"],
            registry=self.registry,
        )
        self.blob_bytes_received = Counter(
            f"{PREFIX}_blob_bytes_received",
            "Model blob bytes uploaded and kept (publish).",
            registry=self.registry,
        )

        self.registry.register(_AgentsByStatus(fleet))
        self._targets: set[str] = set()

    def record_overflow(self, usage: Iterable[OverflowUsage]) -> None:
        """An agent's overflow use since its last report (LoadReport.overflow_usage)."""
        for u in usage:
            target = self.target_label(u.target or "unknown")
            self.overflow_requests.labels(target, "ok").inc(u.requests - u.failed)
            self.overflow_requests.labels(target, "failed").inc(u.failed)
            self.overflow_tokens.labels(target, "prompt").inc(u.prompt_tokens)
            self.overflow_tokens.labels(target, "completion").inc(u.completion_tokens)
            self.overflow_cost.labels(target).inc(u.cost)

    def target_label(self, target: str) -> str:
        """Agents name the target: at most MAX_TARGET_LABELS distinct labels, then "other"."""
        if target in self._targets:
            return target
        if len(self._targets) >= MAX_TARGET_LABELS or len(target) > 128:
            return "other"
        self._targets.add(target)
        return target

    def exposition(self) -> bytes:
        """The text exposition format for GET /metrics."""
        return generate_latest(self.registry)
