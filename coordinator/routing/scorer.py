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
    An agent that serves the model but does not hold it in memory now (it loads models
    on demand: its load report's ``cold_models``) adds the load's expected seconds, so a
    warm agent ranks above an equal cold one, and a site peer with the model loaded
    can beat a local load.

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

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from coordinator.fleet.load_table import EXCLUDED, ROUTABLE, SATURATED, LoadTable
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
    # Only agents that enforce content safety (they name moderation heads in their load
    # report): the client's API key blocks a moderation category.
    moderation: bool = False


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
    """Haversine distance between two points (``RouteScorer._score`` inlines it)."""
    lat1, lat2 = math.radians(a.lat), math.radians(b.lat)
    dlat = lat2 - lat1
    dlon = math.radians(b.lon - a.lon)
    h = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def cold_load_ms(cold_models: tuple[tuple[str, float], ...], model: str) -> float:
    """The expected load time (ms) of ``model`` on an agent whose report lists it cold."""
    for name, seconds in cold_models:
        if name == model:
            return seconds * 1000.0
    return 0.0


def predicted_wait_ms(waiting: int, rate: float, expected_tokens: int) -> float:
    """The module doc's predicted wait: ``waiting`` sequences at ``rate`` tokens/s."""
    if not waiting:
        return 0.0
    if rate <= 0:
        return waiting * UNKNOWN_RATE_WAIT_MS
    return waiting * expected_tokens / rate * 1000.0


# An agent that passed the filters, with what its score uses: its record, its load
# (running + waiting sequences), KV-cache fraction and predicted wait (ms).
_Candidate = tuple[AgentRecord, int, float, float]


class RouteScorer:
    """Filters and scores agents for one query (pure: no I/O, no clock).

    Every candidate is scored as plain floats in tuples; the answer's ``RankedAgent``
    objects (with their parts) are built only for the ``limit`` best. A lookup scores
    dozens of candidates: the per-candidate code is kept to plain local arithmetic (no
    objects made but a tuple, no calls but math's).
    """

    def __init__(self, policy: RoutePolicy | None = None) -> None:
        self.policy = policy or RoutePolicy()

    def rank(self, records: Iterable[AgentRecord], query: RouteQuery) -> RouteDecision:
        policy = self.policy
        excluded: dict[str, int] = {}
        candidates: list[_Candidate] = []
        add = candidates.append
        why: str
        model, version, exclude, max_wait_ms = (
            query.model, query.version, query.exclude, query.max_wait_ms,
        )  # fmt: skip
        saturation_queue, saturation_kv = (
            policy.saturation_queue_depth, policy.saturation_kv_fraction,
        )  # fmt: skip
        down = Liveness.DOWN
        expected_tokens = policy.expected_tokens
        for record in records:
            # excluded (the first reason that applies), saturated, or a candidate
            report = record.last_report
            hello = record.hello
            if record.liveness is down:
                why = "down"
            elif report is not None and report.unhealthy_reason:
                why = "unhealthy"
            elif record.draining or (report is not None and report.draining):
                why = "draining"
            elif exclude and hello.agent_id in exclude:
                why = "excluded_by_client"
            elif not hello.http_url:
                why = "no_http_url"
            else:
                # record.serves(model, version), without a call per candidate
                for m in hello.models if report is None or not report.inventory else record.served:
                    if m.name == model and (version is None or m.version == version):
                        break
                else:
                    excluded["model_not_loaded"] = excluded.get("model_not_loaded", 0) + 1
                    continue
                if report is None:
                    waiting, load, kv = 0, 0, 0.0
                else:
                    waiting = report.waiting_sequences
                    load = report.running_sequences + waiting
                    kv = report.kv_cache_used_fraction
                if waiting >= saturation_queue or kv >= saturation_kv:
                    why = "saturated"
                else:
                    wait_ms = 0.0
                    if waiting:
                        rate = 0.0 if report is None else report.tokens_per_second
                        wait_ms = predicted_wait_ms(waiting, rate, expected_tokens)
                    if report is not None and report.cold_models:
                        wait_ms += cold_load_ms(report.cold_models, model)
                    if max_wait_ms and wait_ms > max_wait_ms:
                        why = "over_max_wait"
                    else:
                        add((record, load, kv, wait_ms))
                        continue
            excluded[why] = excluded.get(why, 0) + 1

        ranked = self._score(candidates, query, query.limit or policy.limit)
        return _decision(ranked, len(candidates), excluded, query)

    def derive(self, waiting: int, load: int, kv: float, rate: float) -> tuple[int, float, float]:
        """What this policy makes of one load report, for the load table (``Derive``):
        saturated or not, the predicted wait, and the score's KV and wait terms."""
        policy = self.policy
        if waiting >= policy.saturation_queue_depth or kv >= policy.saturation_kv_fraction:
            return SATURATED, 0.0, 0.0
        wait_ms = predicted_wait_ms(waiting, rate, policy.expected_tokens)
        weights = policy.weights
        rest = weights.kv / weights.total * (1.0 - kv) + weights.wait / weights.total * (
            1.0 / (1.0 + wait_ms / 1000.0)
        )
        return ROUTABLE, wait_ms, rest

    def rank_rows(
        self, table: LoadTable, agent_ids: Iterable[str], query: RouteQuery
    ) -> RouteDecision | None:
        """``rank(records of agent_ids, query)``, read from the load table's columns: the
        same decision (the same agents and scores, bit for bit, the same counts and
        reason), at a fraction of the cost. None when the query asks for what only
        ``rank`` does (a pinned version, excluded agents, measured round trips, or a
        client place with candidates of unknown place), or when the table is not derived
        by this scorer's policy (``LoadTable.derive_with``): then call ``rank``.

        The filters and scores are computed in numpy over every candidate; the few that
        can be among the ``limit`` best (those within a hair of the cut: the sums are
        grouped differently, and numpy's sine may differ from math's in the last bit)
        are then scored again by ``_score``, in Python, against the loads of the whole
        set, so the order and the numbers returned are ``rank``'s own."""
        if (
            table.derived_for is not self.policy
            or query.version is not None
            or query.exclude
            or query.client_rtt_ms
        ):
            return None
        rows = table.rows_of(agent_ids)
        if table.cold:  # a candidate that would load the model first: rank adds its load
            cold = [r for r, names in table.cold.items() if query.model in names]
            if cold and np.isin(np.array(cold, np.intp), rows).any():
                return None
        client = query.location
        policy = self.policy
        code = table.code[rows]
        excluded: dict[str, int] = {}
        for at, count in enumerate(np.bincount(code, minlength=len(EXCLUDED)).tolist()):
            if at != ROUTABLE and count:
                excluded[EXCLUDED[at]] = count
        fit = code == ROUTABLE
        if query.max_wait_ms:
            over = fit & (table.wait_ms[rows] > query.max_wait_ms)
            if over.any():
                excluded["over_max_wait"] = int(np.count_nonzero(over))
                fit &= ~over
        rows = rows[fit]
        n = len(rows)
        if not n:
            return _decision([], 0, excluded, query)
        weights = policy.weights
        load = table.load[rows]
        lowest = load.min()
        spread = load.max() - lowest
        score = table.rest[rows]
        w_queue = weights.queue / weights.total
        score += w_queue if spread == 0 else w_queue * ((lowest + spread - load) / spread)
        records = table.records
        neutral: float | None = None
        if client is None:
            proximity = np.full(n, UNKNOWN_PROXIMITY)
        else:
            lat1 = math.radians(client.lat)
            dlat = table.lat[rows] - lat1
            dlon = np.radians(table.lon[rows] - client.lon)
            h = np.sin(dlat / 2) ** 2 + math.cos(lat1) * table.cos_lat[rows] * np.sin(dlon / 2) ** 2
            distance_km = 2 * EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))
            proximity = OTHER_SITE_MAX / (1.0 + distance_km / policy.distance_scale_km)
            placed = table.placed[rows]
            if not placed.all():
                # an unknown place counts as the median known distance, taken exactly as
                # _score takes it (in Python, over every placed candidate)
                neutral = UNKNOWN_PROXIMITY
                if placed.any():
                    median = statistics.median(
                        great_circle_km(client, records[row].hello.location)
                        for row in rows[placed].tolist()
                    )
                    neutral = self._distance_proximity(median)
                proximity[~placed] = neutral
        if query.site:
            proximity[table.site[rows] == table.site_code(query.site)] = SAME_SITE
        score += weights.proximity / weights.total * proximity
        score *= table.factor[rows]
        limit = query.limit or policy.limit
        near = rows
        if n > limit:
            cut = -np.partition(-score, limit - 1)[limit - 1]
            near = rows[score >= cut - _HAIR]
        kv, wait_ms = table.kv, table.wait_ms
        best: list[_Candidate] = [
            (records[row], int(load), float(kv[row]), float(wait_ms[row]))
            for row, load in zip(near.tolist(), table.load[near].tolist(), strict=True)
        ]
        ranked = self._score(best, query, limit, loads=(int(lowest), int(spread)), neutral=neutral)
        return _decision(ranked, n, excluded, query)

    def _distance_proximity(self, distance_km: float) -> float:
        return OTHER_SITE_MAX / (1.0 + distance_km / self.policy.distance_scale_km)

    def _score(
        self,
        candidates: list[_Candidate],
        query: RouteQuery,
        limit: int,
        loads: tuple[int, int] | None = None,
        neutral: float | None = None,
    ) -> list[RankedAgent]:
        """The ``limit`` best candidates, best first (ties by agent id). When
        ``candidates`` are the best of a larger set (``rank_rows``), that set's ``loads``
        (the lowest load and the spread to normalize by) and ``neutral`` proximity (for
        an unknown place); by default, those of ``candidates``."""
        if not candidates:
            return []
        policy, weights = self.policy, self.policy.weights
        w_proximity, w_queue = weights.proximity / weights.total, weights.queue / weights.total
        w_kv, w_wait = weights.kv / weights.total, weights.wait / weights.total
        if loads is None:
            every = [c[1] for c in candidates]
            lowest = min(every)
            spread = max(every) - lowest
        else:
            lowest, spread = loads
        client, site, rtts = query.location, query.site, query.client_rtt_ms
        rtt_scale_ms, distance_scale_km = policy.rtt_scale_ms, policy.distance_scale_km
        radians, sin, cos, asin, sqrt = math.radians, math.sin, math.cos, math.asin, math.sqrt
        demoted = _DEMOTED
        # great_circle_km, with the client's terms computed once (the same arithmetic)
        lat1 = cos1 = client_lon = 0.0
        if client is not None:
            lat1 = radians(client.lat)
            cos1 = cos(lat1)
            client_lon = client.lon
        diameter_km = 2 * EARTH_RADIUS_KM
        distances: list[float] = []
        # (record, kv, wait_ms, distance_km, proximity (None: place unknown), queue, wait)
        rows: list[tuple[AgentRecord, float, float, float | None, float | None, float, float]] = []
        # (-score, agent id, row): sorted, best first and ties by agent id
        keyed: list[tuple[float, str, int]] = []
        unplaced = False
        for record, load, kv, wait_ms in candidates:
            hello = record.hello
            where = hello.location
            distance_km: float | None = None
            if client is not None and where is not None:
                lat2 = radians(where.lat)
                dlat = lat2 - lat1
                dlon = radians(where.lon - client_lon)
                h = sin(dlat / 2) ** 2 + cos1 * cos(lat2) * sin(dlon / 2) ** 2
                distance_km = diameter_km * asin(min(1.0, sqrt(h)))
                distances.append(distance_km)
            rtt = rtts.get(hello.agent_id) if rtts else None
            proximity: float | None
            if rtt is not None:
                proximity = 1.0 / (1.0 + max(rtt, 0.0) / rtt_scale_ms)
            elif site and hello.site == site:
                proximity = SAME_SITE
            elif distance_km is not None:
                proximity = OTHER_SITE_MAX / (1.0 + distance_km / distance_scale_km)
            else:
                proximity = None  # neutral, once every known distance is in
                unplaced = True
            queue = 1.0 if spread == 0 else (lowest + spread - load) / spread
            wait = 1.0 / (1.0 + wait_ms / 1000.0)
            if proximity is not None:
                score = (
                    w_proximity * proximity + w_queue * queue + w_kv * (1.0 - kv) + w_wait * wait
                )
                if record.liveness in demoted:
                    score *= SUSPECT_FACTOR
                keyed.append((-score, hello.agent_id, len(rows)))
            rows.append((record, kv, wait_ms, distance_km, proximity, queue, wait))
        # An unknown place counts as the median known distance: neutral, not far.
        if neutral is None:
            neutral = UNKNOWN_PROXIMITY
            if unplaced and distances:
                neutral = self._distance_proximity(statistics.median(distances))
        if unplaced:
            for i, (record, kv, _, _, proximity, queue, wait) in enumerate(rows):
                if proximity is None:
                    score = (
                        w_proximity * neutral + w_queue * queue + w_kv * (1.0 - kv) + w_wait * wait
                    )
                    if record.liveness in demoted:
                        score *= SUSPECT_FACTOR
                    keyed.append((-score, record.hello.agent_id, i))
        keyed.sort()  # best first, ties by agent id (then by place in the list)
        ranked: list[RankedAgent] = []
        for negative, _, i in keyed[:limit]:
            record, kv, wait_ms, distance_km, proximity, queue, wait = rows[i]
            hello = record.hello
            parts = {
                "proximity": neutral if proximity is None else proximity,
                "queue": queue,
                "kv": 1.0 - kv,
                "wait": wait,
            }
            if record.liveness in demoted:
                parts[f"{record.liveness.value}_factor"] = SUSPECT_FACTOR
            ranked.append(
                RankedAgent(
                    agent_id=hello.agent_id,
                    http_url=hello.http_url,
                    site=hello.site,
                    score=-negative,
                    score_parts=parts,
                    liveness=record.liveness,
                    distance_km=distance_km,
                    predicted_wait_ms=wait_ms,
                )
            )
        return ranked


# Scores this close to the cut of the ``limit`` best are scored again in Python
# (``rank_rows``): far above the last-bit differences of numpy's and math's sine.
_HAIR = 1e-9


def _decision(
    ranked: list[RankedAgent], candidates: int, excluded: dict[str, int], query: RouteQuery
) -> RouteDecision:
    wanted = query.model if query.version is None else f"{query.model}@{query.version}"
    left_out = ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
    if not ranked:
        reason = f"no edge agent can take {wanted} now"
        return RouteDecision(
            agents=(), reason=reason + (f" ({left_out})" if left_out else ""), excluded=excluded
        )
    reason = f"{candidates} agent(s) can take {wanted}; ranked by proximity and load"
    if left_out:
        reason += f"; left out: {left_out}"
    return RouteDecision(agents=tuple(ranked), reason=reason, excluded=excluded)
