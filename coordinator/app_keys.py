"""Typed keys for what the coordinator's web.Application holds."""

from __future__ import annotations

from aiohttp import web

from coordinator.admin_tokens import AdminTokens, Role
from coordinator.agent_lifecycle import AgentLifecycle
from coordinator.api_keys import ApiKeys, KeyDistributor
from coordinator.audit import AuditLog
from coordinator.config import CoordinatorConfig
from coordinator.fleet_store import FleetStore
from coordinator.grpc_service import GrpcServer
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_assignments import BlobBaseUrl, ModelAssignments
from coordinator.model_catalog import ModelCatalog
from coordinator.registry import FleetRegistry
from coordinator.report_hooks import ReportHooks
from coordinator.request_records import RequestRecordStore
from coordinator.rollouts import RolloutEngine
from coordinator.route_service import Router
from coordinator.tokens import JoinTokens

CONFIG_KEY = web.AppKey("config", CoordinatorConfig)
REGISTRY_KEY = web.AppKey("registry", FleetRegistry)
METRICS_KEY = web.AppKey("metrics", CoordinatorMetrics)
GRPC_SERVER_KEY = web.AppKey("grpc_server", GrpcServer)
STORE_KEY = web.AppKey("store", FleetStore)
TOKENS_KEY = web.AppKey("tokens", JoinTokens)
ROUTER_KEY = web.AppKey("router", Router)
ADMIN_TOKENS_KEY = web.AppKey("admin_tokens", AdminTokens)
AUDIT_KEY = web.AppKey("audit", AuditLog)
RECORDS_KEY = web.AppKey("request_records", RequestRecordStore)
ROUTE_ROLES_KEY: web.AppKey[dict[tuple[str, str], Role | None]] = web.AppKey("route_roles")
LIFECYCLE_KEY = web.AppKey("lifecycle", AgentLifecycle)
API_KEYS_KEY = web.AppKey("api_keys", ApiKeys)
KEY_DISTRIBUTOR_KEY = web.AppKey("key_distributor", KeyDistributor)
MODEL_CATALOG_KEY = web.AppKey("model_catalog", ModelCatalog)
MODEL_ASSIGNMENTS_KEY = web.AppKey("model_assignments", ModelAssignments)
REPORT_HOOKS_KEY = web.AppKey("report_hooks", ReportHooks)
BLOB_BASE_URL_KEY = web.AppKey("blob_base_url", BlobBaseUrl)
ROLLOUTS_KEY = web.AppKey("rollouts", RolloutEngine)
