"""Route scoring: which agents a client should use for a model, best first.

``RouteScorer.rank`` filters candidate agents, then scores each one as a weighted
sum of parts, every part in [0, 1] (higher is better):

``proximity``
    1.0 for an agent at the client's site. Otherwise, when the client measured the
    round-trip time to the agent, ``1 / (1 + rtt / rtt_scale_ms)``; else, when both
    locations are known, ``0.8 / (1 + distance / distance_scale_km)`` (great-circle
    distance; 0.8 keeps any other site below the client's own). An agent whose place
    is unknown is scored as if it were at the median distance of the candidates whose
    place is known: neutral, neither near nor far, so the other terms decide (an
    unknown place is not 0°N 0°E). With no distance to compare (the client's place
    unknown, or no candidate placed), 0.4.
``queue``
    The agent's load (running + waiting sequences, from its load report) min-max
    normalized across the candidates, as llm-d's queue scorer does: the least loaded
    scores 1, the most loaded 0; all equal scores 1.
``kv``
    ``1 - kv_cache_used_fraction``, as llm-d's KV-cache utilization scorer does.
``wait``
    ``1 / (1 + predicted_wait_ms / 1000)``; predicted wait = waiting sequences x
    expected tokens per request / the agent's recent tokens per second (1 s per
    waiting sequence when it has no rate yet). Running sequences share the batch
    with a new request rather than delay its start, so they count in ``queue`` only.

A suspect agent (missed reports) or an unconfirmed one (known before a coordinator
restart, not reconnected yet) keeps its parts but its score is halved, so it is used
only after every live one. Excluded, never returned: down, unhealthy or draining
agents (drained by an operator, or saying so in their load reports), agents without
the model (or the pinned version), saturated ones (waiting sequences or KV use at the
configured limits), ones the client excluded, and ones whose predicted wait is over
the client's ``max_wait_ms``.

Default weights (config ``route_weight_*``) and why:

- proximity 0.45: at the edge the network dominates what a user feels (a WAN round
  trip costs more than most queueing on a lightly loaded box) and a same-site agent
  keeps prompts on the site's network.
- wait 0.25: predicted wait is the most direct load signal for time to first token.
- queue 0.2: queue depth is always reported and robust when tokens/s is noisy (it is
  llm-d's default scorer).
- kv 0.1: KV-cache pressure foretells preemption and slower batches, but is secondary.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from coordinator.fleet.records import AgentRecord, Liveness
from edgefleet.contract import Location, OverflowTarget

EARTH_RADIUS_KM = 6371.0088
SAME_SITE = 1.0
OTHER_SITE_MAX = 0.8
UNKNOWN_PROXIMITY = 0.4
SUSPECT_FACTOR = 0.5
# Liveness states scored with SUSPECT_FACTOR (reported under "<liveness>_factor").
_DEMOTED = frozenset({Liveness.SUSPECT, Liveness.UNCONFIRMED})
# Assumed service time per queued request when an agent has not measured a rate yet.
UNKNOWN_RATE_WAIT_MS = 1000.0


@dataclass(frozen=True, slots=True)
class RouteWeights:
    proximity: float = 0.45
    queue: float = 0.2
    kv: float = 0.1
    wait: float = 0.25

    def __post_init__(self) -> None:
        if min(self.proximity, self.queue, self.kv, self.wait) < 0:
            raise ValueError("route weights must be >= 0")
        if self.total <= 0:
            raise ValueError("at least one route weight must be > 0")

    @property
    def total(self) -> float:
        return self.proximity + self.queue + self.kv + self.wait


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    weights: RouteWeights = field(default_factory=RouteWeights)
    # Distance (km) / client RTT (ms) at which the proximity part halves.
    distance_scale_km: float = 300.0
    rtt_scale_ms: float = 20.0
    # Tokens a typical request generates (for predicted wait).
    expected_tokens: int = 128
    # At or above either, an agent is saturated: waiting sequences, KV cache fraction.
    saturation_queue_depth: int = 64
    saturation_kv_fraction: float = 0.98
    # Default number of agents returned.
    limit: int = 8


@dataclass(frozen=True, slots=True)
class RouteQuery:
    model: str
    # Pinned model version; None means any version.
    version: str | None = None
    location: Location | None = None
    # The client's site ("" when unknown).
    site: str = ""
    # Longest acceptable predicted wait; 0 = no limit.
    max_wait_ms: int = 0
    exclude: frozenset[str] = frozenset()
    # Round-trip times the client measured, by agent id (ms).
    client_rtt_ms: Mapping[str, float] = field(default_factory=dict)
    # Most agents to return; 0 = the policy's limit.
    limit: int = 0


@dataclass(frozen=True, slots=True)
class RankedAgent:
    agent_id: str
    http_url: str
    site: str
    # Higher is better, in [0, 1].
    score: float
    # The terms the score is made of, by name.
    score_parts: Mapping[str, float] = field(default_factory=dict)
    liveness: Liveness = Liveness.LIVE
    # Great-circle distance from the client; None when a location is unknown.
    distance_km: float | None = None
    predicted_wait_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class RouteDecision:
    agents: tuple[RankedAgent, ...]
    # Why the ranking looks like this, for humans.
    reason: str
    # Where to go when no agent fits; None when none is configured or agents fit.
    overflow: OverflowTarget | None = None
    # How many candidates were left out, by reason ("down", "saturated", ...).
    excluded: Mapping[str, int] = field(default_factory=dict)


def great_circle_km(a: Location, b: Location) -> float:
    """Haversine distance between two points."""
    lat1, lat2 = math.radians(a.lat), math.radians(b.lat)
    dlat = lat2 - lat1
    dlon = math.radians(b.lon - a.lon)
    h = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


@dataclass(slots=True)
class _Candidate:
    record: AgentRecord
    # Running + waiting sequences.
    load: int
    kv: float
    wait_ms: float
    proximity: float = 0.0
    distance_km: float | None = None
    # The queue and wait terms of the score (each 0..1, higher is better).
    queue: float = 0.0
    wait: float = 0.0
    score: float = 0.0


class RouteScorer:
    """Filters and scores agents for one query (pure: no I/O, no clock).

    Every candidate is scored as plain floats; the answer's ``RankedAgent`` objects
    (with their parts) are built only for the ``limit`` best.
    """

    def __init__(self, policy: RoutePolicy | None = None) -> None:
        self.policy = policy or RoutePolicy()

    def rank(self, records: Iterable[AgentRecord], query: RouteQuery) -> RouteDecision:
        policy = self.policy
        excluded: dict[str, int] = {}
        candidates: list[_Candidate] = []
        for record in records:
            why = self._exclusion(record, query)
            if why is None:
                report = record.last_report
                waiting = 0 if report is None else report.waiting_sequences
                load = 0 if report is None else report.running_sequences + waiting
                kv = 0.0 if report is None else report.kv_cache_used_fraction
                if waiting >= policy.saturation_queue_depth or kv >= policy.saturation_kv_fraction:
                    why = "saturated"
                else:
                    wait_ms = self._predicted_wait_ms(record, waiting)
                    if query.max_wait_ms and wait_ms > query.max_wait_ms:
                        why = "over_max_wait"
                    else:
                        candidates.append(_Candidate(record, load, kv, wait_ms))
            if why is not None:
                excluded[why] = excluded.get(why, 0) + 1

        limit = query.limit or policy.limit
        ranked = self._score(candidates, query, limit)
        wanted = query.model if query.version is None else f"{query.model}@{query.version}"
        left_out = ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
        if not ranked:
            reason = f"no edge agent can take {wanted} now"
            return RouteDecision(
                agents=(), reason=reason + (f" ({left_out})" if left_out else ""), excluded=excluded
            )
        reason = f"{len(candidates)} agent(s) can take {wanted}; ranked by proximity and load"
        if left_out:
            reason += f"; left out: {left_out}"
        return RouteDecision(agents=tuple(ranked), reason=reason, excluded=excluded)

    def _exclusion(self, record: AgentRecord, query: RouteQuery) -> str | None:
        if record.liveness is Liveness.DOWN:
            return "down"
        if record.unhealthy_reason:
            return "unhealthy"
        if record.draining or (record.last_report is not None and record.last_report.draining):
            return "draining"
        if record.agent_id in query.exclude:
            return "excluded_by_client"
        if not record.hello.http_url:
            return "no_http_url"
        if not record.serves(query.model, query.version):
            return "model_not_loaded"
        return None

    def _predicted_wait_ms(self, record: AgentRecord, waiting: int) -> float:
        if waiting == 0:
            return 0.0
        report = record.last_report
        rate = 0.0 if report is None else report.tokens_per_second
        if rate <= 0:
            return waiting * UNKNOWN_RATE_WAIT_MS
        return waiting * self.policy.expected_tokens / rate * 1000.0

    def _distance_proximity(self, distance_km: float) -> float:
        return OTHER_SITE_MAX / (1.0 + distance_km / self.policy.distance_scale_km)

    def _score(
        self, candidates: list[_Candidate], query: RouteQuery, limit: int
    ) -> list[RankedAgent]:
        """The ``limit`` best candidates, best first (ties by agent id)."""
        if not candidates:
            return []
        policy, weights = self.policy, self.policy.weights
        w_proximity, w_queue = weights.proximity / weights.total, weights.queue / weights.total
        w_kv, w_wait = weights.kv / weights.total, weights.wait / weights.total
        lowest = min(c.load for c in candidates)
        spread = max(c.load for c in candidates) - lowest
        client, site, rtts = query.location, query.site, query.client_rtt_ms
        unplaced: list[_Candidate] = []
        distances: list[float] = []
        for c in candidates:
            hello = c.record.hello
            if client is not None and hello.location is not None:
                c.distance_km = great_circle_km(client, hello.location)
                distances.append(c.distance_km)
            rtt = rtts.get(hello.agent_id) if rtts else None
            if rtt is not None:
                c.proximity = 1.0 / (1.0 + max(rtt, 0.0) / policy.rtt_scale_ms)
            elif site and hello.site == site:
                c.proximity = SAME_SITE
            elif c.distance_km is not None:
                c.proximity = self._distance_proximity(c.distance_km)
            else:
                unplaced.append(c)
            c.queue = 1.0 if spread == 0 else (lowest + spread - c.load) / spread
            c.wait = 1.0 / (1.0 + c.wait_ms / 1000.0)
        # An unknown place counts as the median known distance: neutral, not far.
        neutral = (
            self._distance_proximity(statistics.median(distances))
            if distances
            else UNKNOWN_PROXIMITY
        )
        for c in unplaced:
            c.proximity = neutral
        for c in candidates:
            c.score = (
                w_proximity * c.proximity
                + w_queue * c.queue
                + w_kv * (1.0 - c.kv)
                + w_wait * c.wait
            )
            if c.record.liveness in _DEMOTED:
                c.score *= SUSPECT_FACTOR
        best = heapq.nsmallest(limit, candidates, key=lambda c: (-c.score, c.record.agent_id))
        ranked: list[RankedAgent] = []
        for c in best:
            hello = c.record.hello
            parts = {"proximity": c.proximity, "queue": c.queue, "kv": 1.0 - c.kv, "wait": c.wait}
            if c.record.liveness in _DEMOTED:
                parts[f"{c.record.liveness.value}_factor"] = SUSPECT_FACTOR
            ranked.append(
                RankedAgent(
                    agent_id=hello.agent_id,
                    http_url=hello.http_url,
                    site=hello.site,
                    score=c.score,
                    score_parts=parts,
                    liveness=c.record.liveness,
                    distance_km=c.distance_km,
                    predicted_wait_ms=c.wait_ms,
                )
            )
        return ranked
