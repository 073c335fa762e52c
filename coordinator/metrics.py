"""Prometheus metrics of the coordinator, all named ``edgefleet_coordinator_*``.

Each app gets its own CollectorRegistry, so several coordinators (or test
apps) can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from coordinator.registry import FleetRegistry

PREFIX = "edgefleet_coordinator"
# Fine below 5 ms (the lookup target) so a p99 is resolved to a quarter millisecond.
ROUTE_BUCKETS = (
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.00175,
    0.002, 0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


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
        self.gc_pause_seconds = Histogram(
            f"{PREFIX}_gc_pause_seconds",
            "Garbage-collector pauses of the coordinator process, by generation.",
            ["generation"],
            buckets=GC_BUCKETS,
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

    def exposition(self) -> bytes:
        """The text exposition format for GET /metrics."""
        return generate_latest(self.registry)
