"""The routing service: a client's question in, a ranked answer out.

Resolves the client's site (given, or from its IP via ``site_networks``), asks the
fleet index for candidates, scores them (``coordinator.routing.scorer``) and names the
overflow target when no agent fits. When no agent at the client's site can take the
request (all down, draining, saturated...), the rest of the fleet is asked before
overflow: a site is a preference, not a boundary. A query for an API key whose policy blocks
a moderation category (``RouteQuery.moderation``) gets only agents that enforce content
safety (they name their moderation heads in their load reports). When the site has fewer than
``MIN_LIVE_AT_SITE`` live agents (one agent per site is the common edge topology), the
``SITE_FALLBACKS`` nearest live agents beyond it are added after the site's live ones, so a
client always has somewhere to fail over to when its site's agent dies; the site's suspect
agents (missed reports, session gone) come after them. Every lookup, over gRPC or HTTP, is
timed and counted here, and counted as demand for its model at the client's site (or, when
the site is not known, at the site of the agent answered first) when ``warm_by_demand`` is
on (``coordinator.routing.warmth``).
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.config import CoordinatorConfig
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.records import AgentRecord, Liveness
from coordinator.fleet.registry import FleetRegistry
from coordinator.routing.overflow import OverflowPolicy, overflow_policy_for
from coordinator.routing.scorer import (
    SUSPECT_FACTOR,
    RouteDecision,
    RoutePolicy,
    RouteQuery,
    RouteScorer,
    RouteWeights,
)
from coordinator.routing.site_networks import parse_site_networks, site_of
from coordinator.routing.warmth import DemandTracker
from edgefleet.contract import Location

# Fewer live agents than this at the client's site: fallbacks beyond it are added.
MIN_LIVE_AT_SITE = 2
# How many live agents beyond the site are added then.
SITE_FALLBACKS = 2
# RouteDecision.excluded: agents left out because they cannot enforce the key's
# moderation policy (RouteQuery.moderation).
NO_CONTENT_SAFETY = "no_content_safety"


def policy_from_config(config: CoordinatorConfig) -> RoutePolicy:
    return RoutePolicy(
        weights=RouteWeights(
            proximity=config.route_weight_proximity,
            queue=config.route_weight_queue,
            kv=config.route_weight_kv,
            wait=config.route_weight_wait,
        ),
        distance_scale_km=config.route_distance_scale_km,
        rtt_scale_ms=config.route_rtt_scale_ms,
        expected_tokens=config.route_expected_tokens,
        saturation_queue_depth=config.route_saturation_queue_depth,
        saturation_kv_fraction=config.route_saturation_kv_fraction,
        limit=config.route_limit,
    )


class Router:
    def __init__(
        self,
        registry: FleetRegistry,
        scorer: RouteScorer,
        overflow: OverflowPolicy,
        metrics: CoordinatorMetrics,
        *,
        site_networks: str = "",
        candidate_pool: int = 64,
        demand: DemandTracker | None = None,
    ) -> None:
        self._registry = registry
        self._scorer = scorer
        self._overflow = overflow
        self._metrics = metrics
        self._networks = parse_site_networks(site_networks)
        self._pool = candidate_pool
        # answered lookups per (site, model), for keeping models warm; None: not counted
        self.demand = demand
        # the load table's columns derived by this scorer's policy: rank_rows' fast path
        registry.load_table.derive_with(scorer.policy, scorer.derive, SUSPECT_FACTOR)

    @classmethod
    def from_config(
        cls, registry: FleetRegistry, config: CoordinatorConfig, metrics: CoordinatorMetrics
    ) -> Router:
        return cls(
            registry,
            RouteScorer(policy_from_config(config)),
            overflow_policy_for(config),
            metrics,
            site_networks=config.site_networks,
            candidate_pool=config.route_candidate_pool,
            demand=DemandTracker(config.warm_max_pairs) if config.warm_by_demand else None,
        )

    def route(self, query: RouteQuery, *, client_ip: str = "") -> RouteDecision:
        with self._metrics.route_seconds.time():
            if not query.site and client_ip and self._networks:
                query = replace(query, site=site_of(client_ip, self._networks))
            decision = self._route(query)
            if self.demand is not None:
                self._count_demand(self.demand, query, decision)
        self._metrics.route_requests.inc()
        return decision

    def _count_demand(
        self, demand: DemandTracker, query: RouteQuery, decision: RouteDecision
    ) -> None:
        """One lookup for the model at the client's site, else at its first answer's; only
        at a site some agent is at, for a model some agent serves (a made-up site or
        model never takes a tracked pair's place)."""
        site = query.site or (decision.agents[0].site if decision.agents else "")
        index = self._registry.index
        if site and index.at_site(site) and index.serving(query.model):
            demand.record(site, query.model)

    def _candidates(
        self, query: RouteQuery, site: str, location: Location | None
    ) -> tuple[set[str], int]:
        """The index's candidates; for a query that needs content safety, only agents
        that name moderation heads in their last report (an agent without, or from before
        the field, refuses such a key's requests with 503), and how many were left out."""
        ids = self._registry.index.candidates(
            query.model, site=site, location=location, pool=self._pool
        )
        if not query.moderation or not ids:
            return ids, 0
        enforcing = {
            r.agent_id
            for r in self._registry.find(ids)
            if r.last_report is not None and r.last_report.moderation_heads
        }
        return enforcing, len(ids) - len(enforcing)

    def _route(self, query: RouteQuery) -> RouteDecision:
        ids, unsafe = self._candidates(query, query.site, query.location)
        decision = self._rank(ids, query)
        if unsafe:
            decision = replace(
                decision,
                excluded={**decision.excluded, NO_CONTENT_SAFETY: unsafe},
                reason=f"{decision.reason}; {unsafe} agent(s) left out: they cannot enforce "
                "this API key's moderation policy (no moderation heads)",
            )
        if not decision.agents and query.site:
            decision = self._beyond_site(query, ids, decision)
        elif query.site:
            decision = self._with_fallbacks(query, ids, decision)
        if decision.agents:
            return decision
        target = self._overflow.target_for(query.model)
        if target is None:
            return replace(decision, reason=decision.reason + "; no overflow target configured")
        return replace(
            decision, overflow=target, reason=decision.reason + f"; overflow to {target.name}"
        )

    def _rank(self, ids: set[str], query: RouteQuery) -> RouteDecision:
        """The scorer's decision over ``ids``: from the load table's columns when the
        query allows (``RouteScorer.rank_rows``), else from the records."""
        decision = self._scorer.rank_rows(self._registry.load_table, ids, query)
        if decision is None:
            decision = self._scorer.rank(self._registry.find(ids), query)
        return decision

    def _with_fallbacks(
        self, query: RouteQuery, tried: set[str], decision: RouteDecision
    ) -> RouteDecision:
        """The site's answer, with the nearest live agents beyond it when the site has fewer
        than ``MIN_LIVE_AT_SITE`` live ones: site live, then fallbacks, then site suspect."""
        live = [a for a in decision.agents if a.liveness is Liveness.LIVE]
        if len(live) >= MIN_LIVE_AT_SITE:
            return decision
        # "nearest": to the client when it said where it is, else to its site's agents
        location = query.location or _place_of(self._registry.find(tried))
        others, _ = self._candidates(query, "", location)
        others -= tried
        if not others:
            return decision
        elsewhere = self._rank(others, replace(query, site="", location=location, limit=0))
        fallbacks = [a for a in elsewhere.agents if a.liveness is Liveness.LIVE]
        fallbacks = fallbacks[:SITE_FALLBACKS]
        if not fallbacks:
            return decision
        demoted = [a for a in decision.agents if a.liveness is not Liveness.LIVE]
        limit = query.limit or self._scorer.policy.limit
        agents = (live + fallbacks + demoted)[:limit]
        note = (
            f"{len(live)} live agent(s) at site {query.site!r}: added the nearest live beyond "
            f"it ({', '.join(a.agent_id for a in fallbacks)})"
        )
        if demoted:
            note += f", before the site's {len(demoted)} not confirmed live"
        return replace(decision, agents=tuple(agents), reason=f"{decision.reason}; {note}")

    def _beyond_site(
        self, query: RouteQuery, tried: set[str], at_site: RouteDecision
    ) -> RouteDecision:
        """No candidate at the client's site fits: rank the rest of the fleet instead."""
        others, _ = self._candidates(query, "", query.location)
        others -= tried
        if not others:
            return at_site
        elsewhere = self._rank(others, query)
        left_out = ", ".join(f"{n} {why}" for why, n in sorted(at_site.excluded.items()))
        note = f"no agent at site {query.site!r} can take {query.model} now"
        note += f" ({left_out})" if left_out else ""
        excluded = dict(at_site.excluded)
        for why, n in elsewhere.excluded.items():
            excluded[why] = excluded.get(why, 0) + n
        return replace(
            elsewhere,
            reason=f"{note}; fell back to the rest of the fleet: {elsewhere.reason}",
            excluded=excluded,
        )


def _place_of(records: list[AgentRecord]) -> Location | None:
    """The mean place of the agents with a known one (a site's agents stand close together)."""
    places = [r.hello.location for r in records if r.hello.location is not None]
    if not places:
        return None
    return Location(
        lat=sum(p.lat for p in places) / len(places), lon=sum(p.lon for p in places) / len(places)
    )
