"""Prometheus metrics of the coordinator, all named ``edgefleet_coordinator_*``.

Each app gets its own CollectorRegistry, so several coordinators (or test
apps) can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from coordinator.registry import FleetRegistry

PREFIX = "edgefleet_coordinator"


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
        self.known_agents.set_function(lambda: float(len(fleet.agents())))
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
        self.load_reports = Counter(
            f"{PREFIX}_load_reports",
            "Load reports received from agents.",
            registry=self.registry,
        )
        self.route_requests = Counter(
            f"{PREFIX}_route_requests",
            "Route RPCs answered.",
            registry=self.registry,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests served, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The text exposition format for GET /metrics."""
        return generate_latest(self.registry)
