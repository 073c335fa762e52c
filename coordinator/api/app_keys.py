"""Typed keys for what the coordinator's web.Application holds."""

from __future__ import annotations

from aiohttp import web

from coordinator.access.admin_tokens import AdminTokens, Role
from coordinator.access.api_keys import ApiKeys, KeyDistributor
from coordinator.access.audit import AuditLog
from coordinator.catalog.assignments import BlobBaseUrl, ModelAssignments
from coordinator.catalog.catalog import ModelCatalog
from coordinator.catalog.replication import BlobReplicator
from coordinator.cluster.changes import ChangeFeed
from coordinator.cluster.live_view import LiveView
from coordinator.cluster.membership import ClusterMembership
from coordinator.config import CoordinatorConfig
from coordinator.fleet.lifecycle import AgentLifecycle
from coordinator.fleet.metrics import CoordinatorMetrics
from coordinator.fleet.registry import FleetRegistry
from coordinator.fleet.report_hooks import ReportHooks
from coordinator.fleet.request_records import RequestRecordStore
from coordinator.identity.join_tokens import JoinTokens
from coordinator.rollouts.engine import RolloutEngine
from coordinator.routing.service import Router
from coordinator.routing.warmth import WarmthPolicy
from coordinator.rpc.service import GrpcServer
from coordinator.store.health import StoreHealth
from coordinator.store.interface import FleetStore

CONFIG_KEY = web.AppKey("config", CoordinatorConfig)
REGISTRY_KEY = web.AppKey("registry", FleetRegistry)
METRICS_KEY = web.AppKey("metrics", CoordinatorMetrics)
GRPC_SERVER_KEY = web.AppKey("grpc_server", GrpcServer)
STORE_KEY = web.AppKey("store", FleetStore)
STORE_HEALTH_KEY = web.AppKey("store_health", StoreHealth)
TOKENS_KEY = web.AppKey("tokens", JoinTokens)
ROUTER_KEY = web.AppKey("router", Router)
# Set only while warm_by_demand is on (coordinator/routing/warmth.py).
WARMTH_KEY = web.AppKey("warmth", WarmthPolicy)
ADMIN_TOKENS_KEY = web.AppKey("admin_tokens", AdminTokens)
AUDIT_KEY = web.AppKey("audit", AuditLog)
RECORDS_KEY = web.AppKey("request_records", RequestRecordStore)
ROUTE_ROLES_KEY: web.AppKey[dict[tuple[str, str], Role | None]] = web.AppKey("route_roles")
# GET /openapi.json's body: the document built from the route table, as JSON bytes.
OPENAPI_KEY: web.AppKey[bytes] = web.AppKey("openapi_json")
LIFECYCLE_KEY = web.AppKey("lifecycle", AgentLifecycle)
API_KEYS_KEY = web.AppKey("api_keys", ApiKeys)
KEY_DISTRIBUTOR_KEY = web.AppKey("key_distributor", KeyDistributor)
MODEL_CATALOG_KEY = web.AppKey("model_catalog", ModelCatalog)
MODEL_ASSIGNMENTS_KEY = web.AppKey("model_assignments", ModelAssignments)
REPORT_HOOKS_KEY = web.AppKey("report_hooks", ReportHooks)
BLOB_BASE_URL_KEY = web.AppKey("blob_base_url", BlobBaseUrl)
ROLLOUTS_KEY = web.AppKey("rollouts", RolloutEngine)
CLUSTER_KEY = web.AppKey("cluster", ClusterMembership)
CHANGES_KEY = web.AppKey("changes", ChangeFeed)
LIVE_VIEW_KEY = web.AppKey("live_view", LiveView)
BLOB_REPLICATOR_KEY = web.AppKey("blob_replicator", BlobReplicator)
