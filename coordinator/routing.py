"""A first, minimal route ranking: connected agents serving the model, least loaded first.

Location, prefix affinity and overflow policy come later, behind the same call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from coordinator.fleet import AgentRecord, AgentStatus


@dataclass(frozen=True, slots=True)
class RouteQuery:
    model: str
    # Pinned model version; None means any version.
    version: str | None = None


@dataclass(frozen=True, slots=True)
class RankedAgent:
    agent_id: str
    http_url: str
    site: str
    # Higher is better, in (0, 1].
    score: float
    # The terms the score is made of, by name.
    score_parts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    agents: tuple[RankedAgent, ...]
    # Why the ranking looks like this, for humans.
    reason: str


def rank_agents(records: Iterable[AgentRecord], query: RouteQuery) -> RouteDecision:
    candidates: list[RankedAgent] = []
    for record in records:
        if record.status is not AgentStatus.CONNECTED or not record.hello.http_url:
            continue
        if not any(
            m.name == query.model and (query.version is None or m.version == query.version)
            for m in record.hello.models
        ):
            continue
        report = record.last_report
        backlog = 0 if report is None else report.queue_depth + report.waiting_sequences
        queue_score = 1.0 / (1.0 + backlog)
        candidates.append(
            RankedAgent(
                agent_id=record.agent_id,
                http_url=record.hello.http_url,
                site=record.hello.site,
                score=queue_score,
                score_parts={"queue": queue_score},
            )
        )
    candidates.sort(key=lambda a: (-a.score, a.agent_id))
    wanted = query.model if query.version is None else f"{query.model}@{query.version}"
    if not candidates:
        return RouteDecision(agents=(), reason=f"no connected agent serves {wanted}")
    return RouteDecision(
        agents=tuple(candidates),
        reason=f"{len(candidates)} connected agent(s) serve {wanted}; ranked by queue backlog",
    )
