"""The route table: every HTTP route of the coordinator, its handler and the role it needs.

One place, imported by the app's wiring and by nothing that handles a request: handlers
live in one module per resource (``agents``, ``join_tokens``, ``keys``, ``admin_tokens``,
``audit``, ``rollouts``, ``models``, ``dashboard``, ``route_lookup``, ``health``,
``openapi``); the ``authorize`` middleware (``coordinator.api.authz``) reads the roles from
the app (``ROUTE_ROLES_KEY``), set from ``route_roles()`` here. To add an admin route, add
one ``AdminRoute`` line to ``ADMIN_ROUTES``; a public app route goes into ``ROUTES`` and
``ROUTE_ROLES``. A route missing from the table is refused (fail closed; a test
enumerates the router so that none is missing).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from coordinator.access.admin_tokens import Role
from coordinator.api.admin_tokens import (
    list_admin_tokens,
    mint_admin_token,
    revoke_admin_token,
    whoami,
)
from coordinator.api.agents import (
    drain_agent,
    get_agent,
    list_agents,
    load_model_on_agent,
    remove_agent,
    resume_agent,
    revoke_agent,
    set_agent,
    unload_model_on_agent,
)
from coordinator.api.audit import audit_log, request_records
from coordinator.api.authz import ADMIN_PREFIX, AdminRoute
from coordinator.api.dashboard import (
    DASHBOARD_ROUTE_ROLES,
    DASHBOARD_ROUTES,
    agent_series,
    fleet_events,
    fleet_series,
)
from coordinator.api.health import healthz, metrics
from coordinator.api.join_tokens import create_token, list_tokens, revoke_token
from coordinator.api.keys import list_keys, mint_key, revoke_key, show_key, update_key
from coordinator.api.models import (
    BLOB_ROUTE,
    delete_model,
    deploy_model,
    deprecate_model,
    get_blob,
    list_models,
    missing_blobs,
    publish_model,
    show_model,
    upload_blob,
)
from coordinator.api.openapi import openapi, openapi_document
from coordinator.api.rollouts import (
    abort_rollout,
    list_rollouts,
    pause_rollout,
    resume_rollout,
    show_rollout,
    start_rollout,
)
from coordinator.api.route_lookup import route

ADMIN_ROUTES: list[AdminRoute] = [
    AdminRoute("GET", "/whoami", whoami, Role.VIEWER, "The caller's token name and role"),
    AdminRoute("POST", "/keys", mint_key, Role.ADMIN, "Mint an API key (the secret shown once)"),
    AdminRoute("GET", "/keys", list_keys, Role.VIEWER, "List API keys (no secrets)"),
    AdminRoute("GET", "/keys/{key_id}", show_key, Role.VIEWER,
               "One API key, with each agent's share of its rate limits"),
    AdminRoute("PATCH", "/keys/{key_id}", update_key, Role.ADMIN,
               "Change an API key's keep-alive cap and pin right (pushed at once)"),
    AdminRoute("DELETE", "/keys/{key_id}", revoke_key, Role.ADMIN,
               "Revoke an API key (pushed to every connected agent at once)"),
    AdminRoute("POST", "/tokens", create_token, Role.ADMIN, "Create a join token (shown once)"),
    AdminRoute("GET", "/tokens", list_tokens, Role.VIEWER, "List join tokens (no secrets)"),
    AdminRoute("DELETE", "/tokens/{token_id}", revoke_token, Role.ADMIN, "Revoke a join token"),
    AdminRoute("POST", "/agents/{agent_id}/drain", drain_agent, Role.OPERATOR, "Drain an agent"),
    AdminRoute("POST", "/agents/{agent_id}/models/{model}/load", load_model_on_agent,
               Role.OPERATOR, "Load a model's weights on an agent now (it loads on demand)"),
    AdminRoute("POST", "/agents/{agent_id}/models/{model}/unload", unload_model_on_agent,
               Role.OPERATOR, "Unload a model's weights on an agent (it stays served)"),
    AdminRoute("POST", "/agents/{agent_id}/resume", resume_agent, Role.OPERATOR,
               "Resume a drained agent"),
    AdminRoute("PATCH", "/agents/{agent_id}", set_agent, Role.ADMIN,
               "Fix an agent's site, location or URL (it reconnects with them)"),
    AdminRoute("POST", "/agents/{agent_id}/revoke", revoke_agent, Role.ADMIN,
               "Revoke an agent: end its session, refuse its certificate and credential"),
    AdminRoute("DELETE", "/agents/{agent_id}", remove_agent, Role.ADMIN,
               "Remove a (revoked) agent's record"),
    AdminRoute("POST", "/admin-tokens", mint_admin_token, Role.ADMIN,
               "Mint an admin token with a role (shown once)"),
    AdminRoute("GET", "/admin-tokens", list_admin_tokens, Role.ADMIN, "List admin tokens"),
    AdminRoute("DELETE", "/admin-tokens/{token_id}", revoke_admin_token, Role.ADMIN,
               "Revoke an admin token"),
    AdminRoute("GET", "/audit", audit_log, Role.VIEWER, "The audit log (json or jsonl)"),
    AdminRoute("GET", "/request-records", request_records, Role.VIEWER,
               "Per-request records sent by agents"),
    AdminRoute("GET", "/models", list_models, Role.VIEWER,
               "The model catalog: every published version, the rules, the signing key"),
    AdminRoute("POST", "/models", publish_model, Role.OPERATOR,
               "Publish a version (its files uploaded first); the manifest is signed"),
    AdminRoute("POST", "/model-blobs/missing", missing_blobs, Role.OPERATOR,
               "Which of these sha256 the blob store lacks"),
    AdminRoute("PUT", "/model-blobs/sha256/{sha256}", upload_blob, Role.OPERATOR,
               "Upload one file (kept only if its bytes hash to the sha256)"),
    AdminRoute("GET", "/models/{name}/{version}", show_model, Role.VIEWER,
               "One version: files, signed manifest, agents desiring and loading it"),
    AdminRoute("POST", "/models/{name}/{version}/deprecate", deprecate_model, Role.OPERATOR,
               "Mark a version deprecated (or not)"),
    AdminRoute("DELETE", "/models/{name}/{version}", delete_model, Role.OPERATOR,
               "Delete a version (refused while any agent desires or loads it)"),
    AdminRoute("POST", "/models/{name}/{version}/deploy", deploy_model, Role.OPERATOR,
               "Every agent the selector matches (empty: all) runs this version"),
    AdminRoute("POST", "/rollouts", start_rollout, Role.OPERATOR,
               "Start a model rollout (canary, waves, soak, gates)"),
    AdminRoute("GET", "/rollouts", list_rollouts, Role.VIEWER, "List model rollouts"),
    AdminRoute("GET", "/rollouts/{rollout_id}", show_rollout, Role.VIEWER,
               "One rollout: plan, state, step stats and its gate now"),
    AdminRoute("POST", "/rollouts/{rollout_id}/pause", pause_rollout, Role.OPERATOR,
               "Pause a rollout (no step moves; the soak clock stops)"),
    AdminRoute("POST", "/rollouts/{rollout_id}/resume", resume_rollout, Role.OPERATOR,
               "Resume a paused rollout"),
    AdminRoute("POST", "/rollouts/{rollout_id}/abort", abort_rollout, Role.OPERATOR,
               "Abort a rollout (moved agents go back unless rollback is false)"),
    AdminRoute("GET", "/fleet/series", fleet_series, Role.VIEWER,
               "The fleet's last hour at 10 s resolution (merged TTFT histograms)"),
    AdminRoute("GET", "/agents/{agent_id}/series", agent_series, Role.VIEWER,
               "One agent's last hour at 10 s resolution (tokens/s, failures, queue, TTFT)"),
    AdminRoute("GET", "/fleet/events", fleet_events, Role.VIEWER,
               "Live fleet events (server-sent events: changed agents, series points)"),
]  # fmt: skip


def route_roles() -> dict[tuple[str, str], Role | None]:
    """(method, full canonical path) -> the role needed (None: public), for every route."""
    table: dict[tuple[str, str], Role | None] = dict(ROUTE_ROLES) | DASHBOARD_ROUTE_ROLES
    # Blobs: viewer tokens, or agents with their own credential (AGENT_ROUTES).
    table[("GET", BLOB_ROUTE)] = Role.VIEWER
    for admin_route in ADMIN_ROUTES:
        table[(admin_route.method, ADMIN_PREFIX + admin_route.path)] = admin_route.role
    return table


def api_document() -> dict[str, Any]:
    """The OpenAPI document of this table (served at ``/openapi.json``)."""
    summaries = {(r.method, ADMIN_PREFIX + r.path): r.summary for r in ADMIN_ROUTES}
    return openapi_document(route_roles(), summaries)


def create_admin_app() -> web.Application:
    """The admin routes; mount with ``add_subapp(ADMIN_PREFIX, ...)`` on an app that has
    the ``authorize`` middleware and ``ROUTE_ROLES_KEY``."""
    admin = web.Application()
    admin.add_routes([admin_route.route_def() for admin_route in ADMIN_ROUTES])
    return admin


def add_routes(app: web.Application) -> None:
    """Every route of the table onto the coordinator's main app (the admin API as a
    sub-app under ``ADMIN_PREFIX``)."""
    app.add_routes(ROUTES)
    app.router.add_get(BLOB_ROUTE, get_blob)
    app.add_routes(DASHBOARD_ROUTES)
    app.add_subapp(ADMIN_PREFIX, create_admin_app())


ROUTES = [
    web.get("/v1/agents", list_agents),
    web.get("/v1/agents/{agent_id}", get_agent),
    web.get("/v1/route", route),
    web.get("/healthz", healthz),
    web.get("/metrics", metrics),
    web.get("/openapi.json", openapi),
]


# The role each route of the main app needs (None: public); the admin API's routes
# declare theirs in ADMIN_ROUTES above. Together: route_roles().
ROUTE_ROLES: dict[tuple[str, str], Role | None] = {
    ("GET", "/v1/agents"): Role.VIEWER,
    ("GET", "/v1/agents/{agent_id}"): Role.VIEWER,
    ("GET", "/metrics"): Role.VIEWER,
    # What a client needs to pick an agent; no load internals (see route_json).
    ("GET", "/v1/route"): None,
    ("GET", "/healthz"): None,
    ("GET", "/openapi.json"): None,
}
