"""Prometheus metrics of one agent, all named ``edgefleet_agent_*``.

Each app owns its registry, so tests can build fresh apps side by side.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_TIME_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgefleet_agent_requests",
            "HTTP API requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_latency = Histogram(
            "edgefleet_agent_request_latency_seconds",
            "End-to-end latency of API requests",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "edgefleet_agent_time_to_first_token_seconds",
            "Time from request arrival to the first generated token",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "edgefleet_agent_time_per_output_token_seconds",
            "Time between generated tokens after the first",
            ["model"],
            buckets=_TOKEN_TIME_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "edgefleet_agent_prompt_tokens", "Prompt tokens processed", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "edgefleet_agent_generation_tokens", "Tokens generated", ["model"], registry=r
        )
        self.running = Gauge(
            "edgefleet_agent_running_sequences", "Sequences being generated", registry=r
        )
        self.waiting = Gauge(
            "edgefleet_agent_waiting_sequences", "Sequences waiting for the engine", registry=r
        )
