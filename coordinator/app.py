"""Assembles one coordinator: store, CA, fleet registry, router, gRPC server and HTTP API."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

from aiohttp import web

from coordinator.access.admin_tokens import AdminTokens
from coordinator.access.api_keys import ApiKeys, KeyDistributor
from coordinator.access.audit import AuditLog
from coordinator.api.app_keys import (
    ADMIN_TOKENS_KEY,
    API_KEYS_KEY,
    AUDIT_KEY,
    BLOB_BASE_URL_KEY,
    BLOB_REPLICATOR_KEY,
    CHANGES_KEY,
    CLUSTER_KEY,
    CONFIG_KEY,
    GRPC_SERVER_KEY,
    KEY_DISTRIBUTOR_KEY,
    LIFECYCLE_KEY,
    LIVE_VIEW_KEY,
    METRICS_KEY,
    MODEL_ASSIGNMENTS_KEY,
    MODEL_CATALOG_KEY,
    OPENAPI_KEY,
    RECORDS_KEY,
    REGISTRY_KEY,
    REPORT_HOOKS_KEY,
    ROUTE_ROLES_KEY,
    ROUTER_KEY,
    STORE_HEALTH_KEY,
    STORE_KEY,
    TOKENS_KEY,
    WARMTH_KEY,
)
from coordinator.api.authz import authorize
from coordinator.api.common import count_requests, openai_errors
from coordinator.api.dashboard import SESSIONS_KEY, DashboardSessions
from coordinator.api.events import EVENTS_KEY, FleetEvents, end_event_streams, events_flusher
from coordinator.api.routes import add_routes, api_document, route_roles
from coordinator.background import periodic_task, running_task
from coordinator.catalog.assignments import BlobBaseUrl, ModelAssignments, Selector
from coordinator.catalog.catalog import ModelCatalog
from coordinator.catalog.replication import BlobReplicator, Peer, PeerCredential
from coordinator.cluster.changes import KIND_AGENT, KIND_API_KEYS, KIND_MODELS, ChangeFeed
from coordinator.cluster.live_view import LiveView
from coordinator.cluster.membership import ClusterMembership, default_coordinator_id
from coordinator.config import CoordinatorConfig
from coordinator.errors import StoreError
from coordinator.fleet.lifecycle import AgentLifecycle
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.records import AgentRecord
from coordinator.fleet.registry import FleetRegistry, LiveFleetRegistry
from coordinator.fleet.report_hooks import ReportHooks
from coordinator.fleet.request_records import RequestRecordStore
from coordinator.fleet.series import FleetSeries
from coordinator.identity.ca import CertificateAuthority
from coordinator.identity.enrollment import EnrollmentService
from coordinator.identity.join_tokens import JoinTokens
from coordinator.identity.peer_rate_limit import PeerRateLimiter
from coordinator.identity.session_auth import SessionAuthenticator
from coordinator.rollouts.wiring import RolloutDeps, install_rollouts
from coordinator.routing.overflow import (
    OVERFLOW_DISTRIBUTOR_KEY,
    OverflowDistributor,
    targets_file_for,
)
from coordinator.routing.service import Router
from coordinator.routing.warmth import (
    WarmLoad,
    WarmthPolicy,
    WarmthSettings,
    registry_agents_at,
)
from coordinator.rpc.convert import LoadLimits
from coordinator.rpc.service import CoordinatorServicer, GrpcServer
from coordinator.store.changes import Change
from coordinator.store.health import PROBE_PERIOD_S, StoreHealth
from coordinator.store.interface import FleetStore
from coordinator.store.sqlite import SQLiteFleetStore

logger = logging.getLogger(__name__)


@functools.cache
def _openapi_json() -> bytes:
    """The route table's OpenAPI document, serialized once per process."""
    return json.dumps(api_document()).encode()


def create_app(
    config: CoordinatorConfig,
    *,
    store: FleetStore | None = None,
    rollouts: RolloutDeps | None = None,
) -> web.Application:
    """Build the coordinator's web.Application.

    Loads or creates the CA and the model-signing key. Starting the app (AppRunner.setup
    / a test server) opens the store (SQLite in ``config.data_dir``, or PostgreSQL at
    ``config.store_url``, unless one is given), loads what the services keep in memory
    from it (the agents on record, the model
    catalog and assignments, the API keys, active rollouts), then starts the gRPC
    server, the liveness sweep and the periodic save of the agents' live state; cleaning
    it up ends agent sessions, stops the gRPC server, writes what is queued and the live
    state a last time and closes the store. ``rollouts``: the model rollout engine's collaborators
    (tests pass stand-ins); by default this app's catalog and assignment layer.
    """
    data = config.data_path
    fleet_store: FleetStore = config.store_location().open_store() if store is None else store
    ca = CertificateAuthority.load_or_create(data / "ca")
    coordinator_id = config.coordinator_id or default_coordinator_id(data)
    live_registry = LiveFleetRegistry(
        fleet_store,
        report_interval_ms=config.report_interval_ms,
        suspect_after_reports=config.suspect_after_reports,
        down_after_reports=config.down_after_reports,
        restart_grace_s=config.restart_grace_s,
        max_agents=config.max_agents,
        stale_unenrolled_after_s=config.stale_unenrolled_after_s,
        coordinator_id=coordinator_id,
    )
    registry: FleetRegistry = live_registry
    tokens = JoinTokens(fleet_store)
    admin_tokens = AdminTokens(fleet_store, bootstrap_token=config.bootstrap_admin_token())
    records = RequestRecordStore(fleet_store, max_rows=config.request_records_max_rows)
    metrics = CoordinatorMetrics(registry)
    audit = AuditLog(fleet_store)
    store_health = _store_health(fleet_store, config)
    live_registry.writes.watched_by(store_health)
    records.watched_by(store_health)
    audit.kept.watched_by(store_health)
    store_health.register_metrics(metrics.registry)
    events = FleetEvents(FleetSeries(), _finder(registry), config.report_interval_ms)
    router = Router.from_config(registry, config, metrics)
    api_keys = ApiKeys(fleet_store)
    # The model catalog (signing key in data_dir: an unreadable one stops the start) and
    # which versions each agent should run.
    catalog = ModelCatalog.in_directory(fleet_store, data)
    blob_base_url = BlobBaseUrl(config)
    assignments = ModelAssignments(fleet_store, catalog, registry, blob_base_url=blob_base_url)
    report_hooks = ReportHooks()
    report_hooks.add(assignments.on_report)
    report_hooks.add(events.on_report)  # the dashboard's series and rows
    distributor = KeyDistributor(
        api_keys,
        set_section=registry.set_section,
        current_section=lambda agent_id: registry.desired_state(agent_id).keys,
    )
    servicer = CoordinatorServicer(
        registry,
        metrics,
        router=router,
        enrollment=EnrollmentService(
            fleet_store,
            tokens,
            ca,
            cert_days=config.agent_cert_days,
            grace=timedelta(days=config.agent_cert_grace_days),
        ),
        authenticator=SessionAuthenticator(
            fleet_store,
            require_enrollment=config.enrollment_required,
            require_mtls=config.tls_enabled,
            check_url_host=config.check_agent_url_host,
        ),
        report_interval_ms=config.report_interval_ms,
        hello_timeout_s=config.hello_timeout_s,
        records=records,
        load_limits=LoadLimits(
            tokens_per_second=config.max_agent_tokens_per_second,
            sequences=config.max_agent_sequences,
        ),
        keys=distributor,
        enroll_limiter=PeerRateLimiter(config.enroll_rate_per_minute / 60.0, config.enroll_burst),
        models=assignments,
        report_hooks=report_hooks,
        model_signing_key=catalog.public_key,
    )
    assignments.bind(servicer.set_section, servicer.connected_agent_ids)
    distributor.bind(servicer.set_keys_section, servicer.connected_agent_ids)
    overflow = OverflowDistributor(
        targets_file_for(config),
        registry.agents,
        servicer.set_section,
        saturation_queue_depth=config.route_saturation_queue_depth,
        spread_s=config.report_interval_ms / 1000.0 / 2,  # the rest of it between ticks
    )
    # authorize is inside openai_errors: a crash in a check is still an error body.
    app = web.Application(middlewares=[count_requests, openai_errors, authorize])
    app[CONFIG_KEY] = config
    app[REGISTRY_KEY] = registry
    app[METRICS_KEY] = metrics
    app[STORE_KEY] = fleet_store
    app[TOKENS_KEY] = tokens
    app[ROUTER_KEY] = router
    app[ADMIN_TOKENS_KEY] = admin_tokens
    app[AUDIT_KEY] = audit
    app[STORE_HEALTH_KEY] = store_health
    app[RECORDS_KEY] = records
    app[ROUTE_ROLES_KEY] = route_roles()
    app[OPENAPI_KEY] = _openapi_json()
    app[API_KEYS_KEY] = api_keys
    app[KEY_DISTRIBUTOR_KEY] = distributor
    app[OVERFLOW_DISTRIBUTOR_KEY] = overflow
    app[GRPC_SERVER_KEY] = GrpcServer(config, servicer, ca)
    app[MODEL_CATALOG_KEY] = catalog
    app[MODEL_ASSIGNMENTS_KEY] = assignments
    app[REPORT_HOOKS_KEY] = report_hooks
    app[BLOB_BASE_URL_KEY] = blob_base_url
    app[EVENTS_KEY] = events
    warmth = _warmth_policy(config, router, registry, servicer, metrics)
    if warmth is not None:
        app[WARMTH_KEY] = warmth
    grpc_server = app[GRPC_SERVER_KEY]
    cluster = ClusterMembership(
        fleet_store,
        coordinator_id,
        lease_s=config.leader_lease_s,
        addresses=lambda: (
            grpc_server.dial_address if grpc_server.port is not None else "",
            blob_base_url.http_url(),
        ),
    )
    cluster.register_metrics(metrics.registry)
    app[CLUSTER_KEY] = cluster
    distributor.share_fleet_wide(fleet_store, cluster.coordinator_id)
    servicer.bind_coordinators(cluster.grpc_addresses)  # Welcome.coordinators
    changes = ChangeFeed(fleet_store, cluster.incarnation)
    changes.register_metrics(metrics.registry)
    app[CHANGES_KEY] = changes
    # The other coordinators' agents, routed here too (coordinator/cluster/live_view.py).
    live_view = LiveView(
        fleet_store,
        live_registry,
        cluster,
        period_s=live_view_period_s(config),
        on_change=lambda record: events.on_change(record.agent_id),
    )
    live_view.register_metrics(metrics.registry)
    app[LIVE_VIEW_KEY] = live_view
    lifecycle = AgentLifecycle(
        fleet_store, registry, servicer, changes=changes, on_change=events.on_change
    )
    app[LIFECYCLE_KEY] = lifecycle

    async def reload_keys(change: Change) -> None:
        await distributor.refresh(force=True)

    changes.on(KIND_API_KEYS, reload_keys)
    changes.on(KIND_AGENT, lifecycle.apply_change)

    async def claimed(agent_id: str, epoch: int) -> None:
        if len(cluster.alive()) > 1:  # a coordinator alone holds no stale session elsewhere
            await lifecycle.publish(agent_id, f"claimed {cluster.coordinator_id} {epoch}")

    servicer.bind_ownership(fleet_store, cluster.coordinator_id, claimed)

    # A database other coordinators may share (now, or before this one started: an agent
    # may come from one since gone): each session starts on generations reserved after it
    # opened. SQLite has one coordinator, whose blocks are always the newest.
    shared_store = "postgres" in type(fleet_store).__name__.lower()

    async def fresh_generations(agent_id: str) -> None:
        if shared_store or len(cluster.alive()) > 1:
            await live_registry.fresh_generations(agent_id)

    servicer.bind_fresh_generations(fresh_generations)
    catalog.bind_changes(functools.partial(changes.publish, KIND_MODELS))
    assignments.bind_changes(functools.partial(changes.publish, KIND_MODELS))
    replicator = BlobReplicator(
        catalog,
        fleet_store,
        cluster.coordinator_id,
        lambda: [Peer(m.coordinator_id, m.http_address) for m in cluster.alive() if m.http_address],
        PeerCredential.from_signer(catalog.signer, cluster.coordinator_id),
        ssl_context=functools.partial(_peer_ssl_context, data / "ca" / "ca.pem"),
    )
    replicator.register_metrics(metrics.registry)
    app[BLOB_REPLICATOR_KEY] = replicator

    async def models_changed(change: Change) -> None:
        before = catalog.versions()
        await assignments.apply_change(change)
        await replicator.on_change(change, before)

    changes.on(KIND_MODELS, models_changed)
    app[SESSIONS_KEY] = DashboardSessions(
        fleet_store, admin_tokens, ttl_s=config.dashboard_session_ttl_s
    )
    add_routes(app)
    # First: the store opens (and the services load from it) before anything serves, and
    # closes after everything else stopped.
    loads: list[Callable[[], Awaitable[None]]] = []
    if store is None:  # the configured store: once open, data_dir says where it is

        async def remember_backend() -> None:
            config.store_location().remember_backend()

        loads.append(remember_backend)
    app.cleanup_ctx.append(
        _store(
            fleet_store,
            *loads,
            live_registry.load,
            catalog.load,
            assignments.load,
            records.load,
            distributor.load,
        )
    )
    # Between the store and the gRPC server: the last save runs once sessions ended.
    app.cleanup_ctx.append(_store_probe)
    app.cleanup_ctx.append(_membership)
    app.cleanup_ctx.append(_last_state_saver)
    app.cleanup_ctx.append(_grpc_server)
    app.cleanup_ctx.append(_liveness_sweep)
    app.cleanup_ctx.append(_key_distribution)
    app.cleanup_ctx.append(_change_feed)
    app.cleanup_ctx.append(_live_view)
    app.cleanup_ctx.append(_blob_replication)
    app.cleanup_ctx.append(_ownership_check)
    app.cleanup_ctx.append(_leader_jobs)
    app.cleanup_ctx.append(_overflow_distribution)
    app.cleanup_ctx.append(_warm_by_demand)
    if rollouts is None:
        rollouts = RolloutDeps(catalog, assignments, Selector, report_hooks.add)
    # rollout gates count the other coordinators' agents too (their stats in the view)
    live_view.on_stats(install_rollouts(app, rollouts).on_report)
    app.cleanup_ctx.append(events_flusher)
    app.on_shutdown.append(end_event_streams)
    return app


def _finder(registry: FleetRegistry) -> Callable[[str], AgentRecord | None]:
    def find(agent_id: str) -> AgentRecord | None:
        found = registry.find((agent_id,))
        return found[0] if found else None

    return find


def _store_health(store: FleetStore, config: CoordinatorConfig) -> StoreHealth:
    database = getattr(store, "name", "") or str(getattr(store, "path", ""))
    postgres = "postgres" in type(store).__name__.lower()
    return StoreHealth(
        store,
        "postgresql" if postgres else "sqlite",
        database,
        probe_timeout_s=min(PROBE_PERIOD_S, config.store_statement_timeout_s),
    )


async def _store_probe(app: web.Application) -> AsyncIterator[None]:
    """A cheap round trip to the database every PROBE_PERIOD_S (``/healthz``, metrics)."""
    health = app[STORE_HEALTH_KEY]
    await health.probe()
    async with periodic_task("fleet database probe", PROBE_PERIOD_S, health.probe):
        yield


async def _membership(app: web.Application) -> AsyncIterator[None]:
    """Heartbeat through the database and hold (or wait for) the leader lease, every
    coordinator_heartbeat_s; at a clean stop, give the lease up and sign off. Under the
    lease run the rollout engine (coordinator/rollouts/engine.py) and ``_leader_jobs``."""
    cluster = app[CLUSTER_KEY]
    await cluster.step()
    try:
        async with periodic_task(
            "coordinator membership", app[CONFIG_KEY].coordinator_heartbeat_s, cluster.step
        ):
            yield
    finally:
        await cluster.stop()


#: How often the leader prunes the change feed's old rows and the request records past
#: their cap (seconds).
CHANGE_PRUNE_PERIOD_S = 600.0


async def _leader_jobs(app: web.Application) -> AsyncIterator[None]:
    """The fleet-wide housekeeping, run by the leader only (issue 24): pruning the change
    feed's old rows and the request records past their cap (the other coordinators write
    records but never prune them), and forgetting never-enrolled agents long gone
    (``_liveness_sweep``). Every coordinator still sweeps the liveness of its own agents'
    sessions, and the rollout engine runs under the same lease (its writes fenced)."""
    cluster, feed, records = app[CLUSTER_KEY], app[CHANGES_KEY], app[RECORDS_KEY]
    records.prunes = lambda: cluster.is_leader

    async def prune() -> None:
        if not cluster.is_leader:
            return
        await feed.prune()
        try:
            await records.prune_if_over()
        except StoreError as exc:  # tried again next period
            logger.warning("request records: could not prune: %s", exc)

    async with periodic_task("leader pruning", CHANGE_PRUNE_PERIOD_S, prune):
        yield


async def _ownership_check(app: web.Application) -> AsyncIterator[None]:
    """Every report interval: end the sessions here whose agents another coordinator owns
    now (coordinator/store/ownership.py), for when the change feed's notice was lost. Not
    on SQLite: one coordinator per database, so no other can own its agents (the check
    read every live agent's owner row every interval, for nothing)."""
    if isinstance(app[STORE_KEY], SQLiteFleetStore):
        yield
        return
    servicer = app[GRPC_SERVER_KEY].servicer

    async def check() -> None:
        try:
            await servicer.check_ownership()
        except StoreError as exc:
            logger.warning("could not check which agents this coordinator still owns: %s", exc)

    async with periodic_task(
        "session ownership check", app[CONFIG_KEY].report_interval_ms / 1000.0, check
    ):
        yield


async def _change_feed(app: web.Application) -> AsyncIterator[None]:
    """Apply what other coordinators on the database changed (coordinator/cluster/
    changes.py), from the newest change on record at start (the leader prunes old
    changes: ``_leader_jobs``)."""
    feed = app[CHANGES_KEY]
    try:
        await feed.start()
    except StoreError as exc:  # the database is out: read from the start of what is kept
        logger.warning("change feed: could not read the newest change: %s", exc)
    async with running_task("change feed", feed.run()):
        yield


#: How often a coordinator checks that it holds every blob of every listed version
#: (what a failed fetch left out is fetched again; seconds).
BLOB_CHECK_PERIOD_S = 60.0


def _peer_ssl_context(fleet_ca: Path) -> ssl.SSLContext:
    """Peer coordinators' HTTPS certificates are the fleet CA's (shared by all of them)."""
    context = ssl.create_default_context()
    if fleet_ca.is_file():
        context.load_verify_locations(cafile=str(fleet_ca))
    return context


async def _blob_replication(app: web.Application) -> AsyncIterator[None]:
    """Fetch from peer coordinators the blobs of listed versions this one lacks: at start
    (in the background: nothing waits for it), then every BLOB_CHECK_PERIOD_S (a version
    a change-feed fetch could not complete), and record what it holds
    (coordinator/catalog/replication.py)."""
    replicator = app[BLOB_REPLICATOR_KEY]
    replicator.start_background(replicator.sync_all, "replicate model blobs")

    async def check() -> None:
        await replicator.sync_all()

    try:
        async with periodic_task("model blob check", BLOB_CHECK_PERIOD_S, check):
            yield
    finally:
        await replicator.close()


def live_view_period_s(config: CoordinatorConfig) -> float:
    """How often the shared live view is read: half a report interval, 0.5 s at most (a
    report reaches the other coordinators' route answers within a report interval, the
    owner's save, and this)."""
    return max(0.05, min(0.5, config.report_interval_ms / 1000.0 / 2))


async def _live_view(app: web.Application) -> AsyncIterator[None]:
    """Read the other coordinators' agents' live state (nothing while this coordinator is
    alone on its database)."""
    view = app[LIVE_VIEW_KEY]
    async with running_task("live view", view.run()):
        yield


# How long a stopping coordinator waits for the database to take its kept writes.
SHUTDOWN_WRITE_WAIT_S = 10.0


def _store(
    store: FleetStore, *loads: Callable[[], Awaitable[None]]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Open the store and load the services from it; close it at the end."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await store.open()
        try:
            for load in loads:
                await load()
            yield
        finally:
            await store.close()

    return lifecycle


# The agents' live state is saved every this many report intervals (and at shutdown);
# every report interval while other coordinators are alive (their shared live view).
SAVE_EVERY_REPORTS = 5
# Agents per store transaction when saving it (a few ms each at most).
SAVE_BATCH = 250


async def _last_state_saver(app: web.Application) -> AsyncIterator[None]:
    """Save what changed in the agents' live state periodically, in small batches that
    let the event loop serve in between, and once more at shutdown."""
    registry, cluster = app[REGISTRY_KEY], app[CLUSTER_KEY]
    period_s = app[CONFIG_KEY].report_interval_ms / 1000.0
    ticks = 0

    async def save() -> None:
        nonlocal ticks
        ticks += 1
        if ticks % SAVE_EVERY_REPORTS and len(cluster.alive()) <= 1:
            return  # alone: only a restart reads it
        try:
            await registry.save_last_states(SAVE_BATCH)
        except StoreError as exc:  # retried next period: what failed is still unsaved
            logger.warning("could not save the agents' live state: %s", exc)

    try:
        async with periodic_task("last-state saver", period_s, save):
            yield
    finally:
        # sessions opened and ended until now, request records, audit entries kept
        # (together: a database away costs SHUTDOWN_WRITE_WAIT_S once, not three times)
        health = app[STORE_HEALTH_KEY]
        flushed = await asyncio.gather(
            registry.flush(SHUTDOWN_WRITE_WAIT_S),
            app[RECORDS_KEY].flush(SHUTDOWN_WRITE_WAIT_S),
            app[AUDIT_KEY].kept.flush(SHUTDOWN_WRITE_WAIT_S),
        )
        if not all(flushed):
            logger.error(
                "stopping with %d kept writes still waiting for the fleet database, now lost "
                "(request records among them stay in the agents' spools, sent again); the "
                "agents' live state is not saved either", health.pending_writes(),
            )  # fmt: skip
        else:
            try:
                saved = await registry.save_last_states(SAVE_BATCH)
            except StoreError as exc:
                logger.error("could not save the agents' live state at shutdown: %s", exc)
            else:
                logger.info("saved the live state of %d agents", saved)


async def _grpc_server(app: web.Application) -> AsyncIterator[None]:
    server = app[GRPC_SERVER_KEY]
    await server.start()
    try:
        yield
    finally:
        await server.stop()


async def _liveness_sweep(app: web.Application) -> AsyncIterator[None]:
    """Re-evaluate liveness a few times per report interval: on every coordinator (each
    sweeps its own view of the agents); forgetting never-enrolled agents long gone (a
    database delete) is the leader's only."""
    registry, metrics = app[REGISTRY_KEY], app[METRICS_KEY]
    period_s = app[CONFIG_KEY].report_interval_ms / 1000.0 / 4
    cluster = app[CLUSTER_KEY]

    async def sweep() -> None:
        for record in registry.sweep(forget_stale=cluster.is_leader):
            metrics.liveness_changes.labels(liveness=record.liveness.value).inc()
            app[EVENTS_KEY].on_change(record.agent_id)

    async with periodic_task("liveness sweep", period_s, sweep):
        yield


async def _overflow_distribution(app: web.Application) -> AsyncIterator[None]:
    """About every report interval: each connected agent gets its overflow targets (peers
    at its site with room, pools, providers) when they changed. A large fleet's tick is
    paced over half an interval (OverflowDistributor's ``spread_s``) and half an interval
    passes between ticks; a fleet of one slice ticks every half interval."""
    distributor = app[OVERFLOW_DISTRIBUTOR_KEY]
    period_s = app[CONFIG_KEY].report_interval_ms / 1000.0 / 2

    async def tick() -> None:
        await distributor.tick()

    async with periodic_task("overflow targets", period_s, tick):
        yield


def _warmth_policy(
    config: CoordinatorConfig,
    router: Router,
    registry: FleetRegistry,
    servicer: CoordinatorServicer,
    metrics: CoordinatorMetrics,
) -> WarmthPolicy | None:
    """The warm-by-demand policy over the router's demand (None when it is off)."""
    tracker = router.demand
    if tracker is None:
        return None
    metrics.warm_tracked_pairs.set_function(lambda: float(len(tracker)))

    def counted(load: WarmLoad) -> None:
        metrics.warm_loads.labels(load.result).inc()
        if load.result == "sent":
            logger.info("kept warm: LOAD_MODEL %s to %s (site %s: %d lookups recently, %d "
                        "around this time yesterday)", load.model, load.agent_id, load.site,
                        load.recent, load.yesterday)  # fmt: skip

    return WarmthPolicy(
        tracker,
        registry_agents_at(registry),
        servicer.send_command,
        WarmthSettings.from_config(config),
        on_result=counted,
    )


async def _warm_by_demand(app: web.Application) -> AsyncIterator[None]:
    """Every ``warm_interval_s``: LOAD_MODEL to an agent of this coordinator at a site
    where its model has demand and no agent holds it in memory (coordinator/routing/
    warmth.py); nothing when ``warm_by_demand`` is off."""
    policy = app.get(WARMTH_KEY)
    if policy is None:
        yield
        return

    async def step() -> None:
        await policy.cycle_in_slices()

    async with periodic_task("warm by demand", app[CONFIG_KEY].warm_interval_s, step):
        yield


async def _key_distribution(app: web.Application) -> AsyncIterator[None]:
    """Every report interval: API key expiries, database changes and rebalanced shares
    reach the connected agents; per-key usage is saved (and once more at shutdown)."""
    distributor = app[KEY_DISTRIBUTOR_KEY]
    period_s = app[CONFIG_KEY].report_interval_ms / 1000.0

    async def tick() -> None:
        try:
            await distributor.tick(period_s)
        except StoreError as exc:  # retried next period
            logger.warning("could not refresh API keys: %s", exc)

    try:
        async with periodic_task("API key distribution", period_s, tick):
            yield
    finally:
        try:
            await distributor.save_usage()
        except StoreError as exc:
            logger.error("could not save API key usage at shutdown: %s", exc)
