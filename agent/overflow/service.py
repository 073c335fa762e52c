"""The agent's overflow service: targets from the coordinator, the forwarder, the hook
the API calls when the local engine refuses, and the usage book.

Cost: computed once per forwarded request, in its record (:func:`overflow_record`, which
the per-request record of agent/request_log.py carries); the metrics and the load
reports' ``overflow_usage`` are sums of those records (:meth:`OverflowBook.add`).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from agent.overflow.breaker import BreakerSettings
from agent.overflow.forwarder import Forwarder, ForwardSettings, OverflowRequest
from agent.overflow.targets import TargetSet
from agent.redaction import Redactor
from edgefleet.contract import DesiredState, OverflowUsage

log = logging.getLogger(__name__)


def leg_cost(leg: dict[str, Any]) -> float:
    return (
        float(
            leg["prompt_tokens"] * leg["prompt_price_per_1k"]
            + leg["completion_tokens"] * leg["completion_price_per_1k"]
        )
        / 1000.0
    )


def overflow_record(req: OverflowRequest) -> dict[str, Any]:
    """The record fields of a forwarded request: who served it, each target's part with
    its cost, and the total. The one place cost is computed."""
    legs = []
    for leg in req.legs:
        entry = {
            "target": leg.target,
            "kind": leg.kind,
            "prompt_tokens": leg.prompt_tokens,
            "completion_tokens": leg.completion_tokens,
            "failed": not leg.ok,
            "prompt_price_per_1k": leg.prompt_price_per_1k,
            "completion_price_per_1k": leg.completion_price_per_1k,
        }
        entry["cost"] = leg_cost(entry)
        legs.append(entry)
    return {
        "served_by": req.served_by,
        "overflow_reason": req.reason,
        "overflow": legs,
        "cost": sum(leg["cost"] for leg in legs),
    }


class OverflowBook:
    """Overflow usage by target, summed from the records; taken by each load report."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._usage: dict[str, list[float]] = {}
        self._series: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self.served = Counter(
            "edgefleet_agent_served_requests",
            "Generation requests by who served them (this agent, or an overflow target)",
            ["served_by", "kind"],
            registry=registry,
        )
        self.requests = Counter(
            "edgefleet_agent_overflow_requests",
            "Requests sent to each overflow target, by outcome",
            ["target", "outcome"],
            registry=registry,
        )
        self.tokens = Counter(
            "edgefleet_agent_overflow_tokens",
            "Tokens used at each overflow target",
            ["target", "type"],
            registry=registry,
        )
        self.cost = Counter(
            "edgefleet_agent_overflow_cost",
            "Cost at each overflow target, from its prices per 1k tokens",
            ["target"],
            registry=registry,
        )
        self.refused = Counter(
            "edgefleet_agent_overflow_refused_requests",
            "Requests the agent could not take and could not forward, by why",
            ["reason"],
            registry=registry,
        )

    def add(self, record: dict[str, Any]) -> None:
        for leg in record.get("overflow") or ():
            target = leg["target"]
            row = self._usage.setdefault(target, [0, 0, 0, 0, 0.0])
            row[0] += 1
            row[1] += 1 if leg["failed"] else 0
            row[2] += leg["prompt_tokens"]
            row[3] += leg["completion_tokens"]
            row[4] += leg["cost"]
            ok, failed, prompt, completion, cost = self._children(target)
            (failed if leg["failed"] else ok).inc()
            prompt.inc(leg["prompt_tokens"])
            completion.inc(leg["completion_tokens"])
            cost.inc(leg["cost"])

    def _children(self, target: str) -> tuple[Any, Any, Any, Any, Any]:
        """A target's labelled series, looked up once (``labels()`` on every request was
        a visible part of the overflow path's cost)."""
        children = self._series.get(target)
        if children is None:
            if len(self._series) > 1024:  # targets come and go: never unbounded
                self._series.clear()
            children = self._series[target] = (
                self.requests.labels(target, "ok"),
                self.requests.labels(target, "failed"),
                self.tokens.labels(target, "prompt"),
                self.tokens.labels(target, "completion"),
                self.cost.labels(target),
            )
        return children

    def take(self) -> tuple[OverflowUsage, ...]:
        """What was used since the previous call (for one load report)."""
        usage, self._usage = self._usage, {}
        return tuple(
            OverflowUsage(name, int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]))
            for name, r in sorted(usage.items())
        )


class OverflowService:
    def __init__(
        self,
        *,
        redactor: Redactor,
        registry: CollectorRegistry | None = None,
        site: str = "",
        policy_allows_cloud: bool = False,
        forward_reasons: tuple[str, ...] = (
            "queue_full",
            "predicted_wait",
            "queue_timeout",
            "model_not_loaded",
        ),
        settings: ForwardSettings | None = None,
        breaker: BreakerSettings | None = None,
    ) -> None:
        self.agent_id = ""
        self.targets = TargetSet(breaker)
        self.policy_allows_cloud = policy_allows_cloud
        self.forward_reasons = frozenset(forward_reasons)
        self.book = OverflowBook(registry)
        self.forwarder = Forwarder(
            self.targets, redactor, settings, site=site, self_id=lambda: self.agent_id
        )

    def __call__(self, desired: DesiredState) -> None:
        """The session's ``on_desired_state``: use the coordinator's overflow targets."""
        section = desired.overflow_targets
        if section is None or section.generation == self.targets.generation:
            return
        self.targets.update(section)
        log.info(
            "overflow targets: generation %d: %s",
            section.generation,
            ", ".join(f"{t.name} ({t.kind.value})" for t in section.targets) or "none",
        )

    async def close(self) -> None:
        await self.forwarder.close()
