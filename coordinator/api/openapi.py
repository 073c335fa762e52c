"""The coordinator's OpenAPI 3.1 document: every HTTP route, the admin API included.

Served at ``GET /openapi.json`` (``openapi`` below; the app's wiring builds the document
once from the route table, ``coordinator.api.routes.api_document``). Each route names the
role it needs (``x-role``, from the route table's roles: a test checks they agree) and,
when guarded, the bearer security scheme. A test enumerates the router and fails for a
route missing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from coordinator.access.admin_tokens import Role
from coordinator.access.api_keys import MAX_KEEP_ALIVE_S, MAX_TOKENS_PER_REQUEST
from coordinator.api.app_keys import OPENAPI_KEY
from models.moderation_spec import CATEGORIES

_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_NUM = {"type": ["number", "null"]}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": _NULLABLE_STR,
                "code": _NULLABLE_STR,
            },
        }
    },
}
_OBJ = {"type": "object"}


def _list_of(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
        },
    }


_SCHEMAS: dict[str, Any] = {
    "Error": _ERROR,
    "ModelCommand": {
        "type": "object",
        "required": ["agent_id", "model", "command", "command_sent"],
        "properties": {
            "agent_id": {"type": "string"},
            "model": {"type": "string"},
            "command": {"type": "string", "enum": ["load_model", "unload_model"]},
            "command_sent": {"type": "boolean"},
        },
    },
    "Agent": {
        "type": "object",
        "required": [
            "object",
            "agent_id",
            "site",
            "http_url",
            "status",
            "liveness",
            "draining",
            "enrolled",
            "models",
            "load",
            "healthy",
        ],
        "properties": {
            "object": {"const": "agent"},
            "agent_id": {"type": "string"},
            "site": {"type": "string"},
            "location": {"type": ["object", "null"]},
            "http_url": {"type": "string"},
            "status": {"type": "string"},
            "coordinator": _NULLABLE_STR,
            "liveness": {"type": "string"},
            "draining": {"type": "boolean"},
            "enrolled": {"type": "boolean"},
            "models": {"type": "array", "items": _OBJ},
            "load": {"type": ["object", "null"]},
            "healthy": {"type": "boolean"},
            "command_sent": {"type": "boolean"},
        },
    },
    "Route": {
        "type": "object",
        "required": ["object", "model", "version", "agents", "overflow", "excluded", "reason"],
        "properties": {
            "object": {"const": "route"},
            "model": {"type": "string"},
            "version": _NULLABLE_STR,
            "agents": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["agent_id", "http_url", "site", "score", "liveness"],
                    "properties": {
                        "agent_id": {"type": "string"},
                        "http_url": {"type": "string"},
                        "site": {"type": "string"},
                        "score": {"type": "number"},
                        "liveness": {"type": "string"},
                        "distance_km": _NULLABLE_NUM,
                        "predicted_wait_ms": _NULLABLE_NUM,
                    },
                    "additionalProperties": False,
                },
            },
            "overflow": {"type": ["object", "null"]},
            "excluded": {"type": "object", "additionalProperties": {"type": "integer"}},
            "reason": {"type": "string"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "connected_agents", "store"],
        "properties": {
            "status": {
                "enum": ["ok", "degraded"],
                "description": "degraded while the fleet database is away or slow",
            },
            "store": {
                "type": "object",
                "description": "The fleet database's health (coordinator/store/health.py)",
                "required": ["status", "backend"],
                "properties": {
                    "status": {"enum": ["ok", "degraded"]},
                    "backend": {"enum": ["sqlite", "postgresql"]},
                    "database": {"type": "string"},
                    "latency_ms": {"type": ["number", "null"]},
                    "last_error": _NULLABLE_STR,
                    "last_error_at": _NULLABLE_STR,
                    "last_ok_at": _NULLABLE_STR,
                    "down_since": _NULLABLE_STR,
                    "outages": {"type": "integer"},
                    "pending_writes": {"type": "integer"},
                    "dropped_writes": {"type": "integer"},
                    "deferred_writes": {"type": "integer"},
                },
            },
            "grpc": _NULLABLE_STR,
            "connected_agents": {"type": "integer"},
            "tls": {"type": "boolean"},
            "enroll": _NULLABLE_STR,
            "coordinator": {
                "type": "object",
                "description": "This coordinator among those sharing the fleet database "
                "(coordinator/cluster/membership.py)",
                "required": ["id", "members_alive", "is_leader", "leader", "lease_epoch"],
                "properties": {
                    "id": {"type": "string"},
                    "members_alive": {"type": "integer"},
                    "is_leader": {"type": "boolean"},
                    "leader": _NULLABLE_STR,
                    "lease_epoch": {"type": "integer"},
                    "duplicate_id": {"type": "boolean"},
                },
            },
        },
    },
    "JoinToken": {
        "type": "object",
        "required": ["object", "token_id"],
        "properties": {
            "object": {"const": "join_token"},
            "token_id": {"type": "string"},
            "token": {"type": "string", "description": "Only when created (shown once)"},
            "created_at": _NULLABLE_STR,
            "expires_at": _NULLABLE_STR,
            "max_uses": {"type": "integer"},
            "uses": {"type": "integer"},
            "site": {"type": "string"},
            "note": {"type": "string"},
            "state": {"type": "string"},
        },
    },
    "NewJoinToken": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "expires_in_s": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 10 * 365 * 86_400,
            },
            "max_uses": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
            "site": {"type": "string", "maxLength": 256},
            "note": {"type": "string", "maxLength": 1024},
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
            "http_url": {"type": "string", "maxLength": 2048},
        },
    },
    "ApiKey": {
        "type": "object",
        "required": ["object", "key_id", "state"],
        "properties": {
            "object": {"const": "api_key"},
            "key_id": {"type": "string"},
            "secret": {"type": "string", "description": "Only when minted (shown once)"},
            "name": {"type": "string"},
            "created_at": _NULLABLE_STR,
            "expires_at": _NULLABLE_STR,
            "revoked_at": _NULLABLE_STR,
            "state": {"type": "string"},
            "models": {"type": "array", "items": {"type": "string"}},
            "allow_cloud": {"type": "boolean"},
            "max_priority": {"enum": ["high", "normal", "low"]},
            "max_tokens_per_request": {"type": "integer"},
            "requests_per_minute": {"type": "number"},
            "tokens_per_minute": {"type": "number"},
            "max_keep_alive_s": {"type": "number"},
            "may_pin_models": {"type": "boolean"},
            "policy": {"$ref": "#/components/schemas/KeyPolicy"},
            "usage": {"type": "object"},
            "moderation_flags": {
                "type": "integer",
                "description": "Requests with this key that content safety flagged or "
                "blocked: the totals the agents last reported (since each agent started; "
                "list and show only)",
            },
            "agent_shares": {"type": "object"},
            "agents_updated": {"type": "integer"},
        },
    },
    "NewApiKey": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "maxLength": 256},
            "models": {"type": "array", "items": {"type": "string"}},
            "allow_cloud": {"type": "boolean"},
            "max_priority": {"enum": ["high", "normal", "low"]},
            "max_tokens_per_request": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_TOKENS_PER_REQUEST,
            },
            "requests_per_minute": {"type": "number", "minimum": 0},
            "tokens_per_minute": {"type": "number", "minimum": 0},
            "expires_in_s": {"type": ["integer", "null"], "minimum": 1, "maximum": 315_360_000},
            "max_keep_alive_s": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_KEEP_ALIVE_S,
                "description": "Longest keep_alive a request with this key may ask for, "
                "seconds (0: the agent's own cap, residency.max_request_keep_alive_s, which "
                "bounds this one too)",
            },
            "may_pin_models": {
                "type": "boolean",
                "description": "Requests with this key may pin a model (keep_alive < 0: "
                "loaded until an operator unloads it or the agent restarts)",
            },
            "policy": {"$ref": "#/components/schemas/KeyPolicy"},
        },
    },
    "KeyPolicy": {
        "type": "object",
        "additionalProperties": False,
        "description": "What agents do for the key's requests beyond its scopes (absent: "
        "block sexual/minors, flag the rest, buffered streams)",
        "properties": {
            "moderation": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "input": {"$ref": "#/components/schemas/ModerationRules"},
                    "output": {"$ref": "#/components/schemas/ModerationRules"},
                    "stream_mode": {"enum": ["buffered", "unbuffered"]},
                },
            },
        },
    },
    "ModerationRules": {
        "type": "object",
        "description": "Category (OpenAI's moderation names, prompt_injection) to an action, "
        "or to {action, threshold}; a category left out keeps its default; sexual/minors "
        "cannot be off",
        "propertyNames": {"enum": list(CATEGORIES)},
        "additionalProperties": {
            "oneOf": [
                {"enum": ["block", "flag", "off"]},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["action"],
                    "properties": {
                        "action": {"enum": ["block", "flag", "off"]},
                        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                },
            ]
        },
    },
    "ApiKeyChange": {
        "type": "object",
        "additionalProperties": False,
        "description": "What can change on a minted key; absent fields stay as they are",
        "properties": {
            "max_keep_alive_s": {"type": "number", "minimum": 0, "maximum": MAX_KEEP_ALIVE_S},
            "may_pin_models": {"type": "boolean"},
            "policy": {"$ref": "#/components/schemas/KeyPolicy"},
        },
    },
    "AgentFixed": {
        "type": "object",
        "additionalProperties": False,
        "description": "What the operator fixes for an agent; unset fields stay as they are",
        "properties": {
            "site": {"type": "string", "maxLength": 256},
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
            "http_url": {"type": "string", "maxLength": 2048},
        },
    },
    "AgentRecord": {
        "type": "object",
        "required": ["object", "agent_id", "removed"],
        "properties": {
            "object": {"const": "agent_record"},
            "agent_id": {"type": "string"},
            "enrolled": {"type": "boolean"},
            "token_id": _NULLABLE_STR,
            "site": {"type": "string"},
            "location": {
                "type": ["object", "null"],
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            },
            "http_url": {"type": "string"},
            "cert_serial": _NULLABLE_STR,
            "cert_not_after": _NULLABLE_STR,
            "revoked": {"type": "boolean"},
            "revoked_at": _NULLABLE_STR,
            "removed": {"type": "boolean"},
            "session_ended": {"type": "boolean"},
        },
    },
    "AdminToken": {
        "type": "object",
        "required": ["object", "token_id", "name", "role", "state"],
        "properties": {
            "object": {"const": "admin_token"},
            "token_id": {"type": "string"},
            "name": {"type": "string"},
            "role": {"enum": ["viewer", "operator", "admin"]},
            "created_at": {"type": "string"},
            "created_by": {"type": "string"},
            "revoked_at": _NULLABLE_STR,
            "state": {"enum": ["active", "revoked"]},
            "token": {"type": "string", "description": "Only when minted (shown once)"},
        },
    },
    "NewAdminToken": {
        "type": "object",
        "required": ["role", "name"],
        "properties": {
            "role": {"enum": ["viewer", "operator", "admin"]},
            "name": {"type": "string", "minLength": 1, "maxLength": 64},
        },
    },
    "FleetSeries": {
        "type": "object",
        "description": "The fleet's last hour at 10 s resolution; TTFT percentiles from "
        "merged histogram buckets.",
        "properties": {
            "step_s": {"type": "integer"},
            "points": {"type": "array", "items": {"$ref": "#/components/schemas/FleetPoint"}},
            "current": {"$ref": "#/components/schemas/FleetPoint"},
        },
    },
    "AgentSeries": {
        "type": "object",
        "description": "One agent's last hour at 10 s resolution, from its own load reports.",
        "properties": {
            "agent_id": {"type": "string"},
            "step_s": {"type": "integer"},
            "points": {"type": "array", "items": {"$ref": "#/components/schemas/AgentPoint"}},
            "current": {"oneOf": [{"$ref": "#/components/schemas/AgentPoint"}, {"type": "null"}]},
        },
    },
    "AgentPoint": {
        "type": "object",
        "description": "One 10 s step of an agent (rates per second over the step); every "
        "figure null in a step without a report, TTFT null without an observation.",
        "required": ["t"],
        "properties": {
            "t": {"type": "number", "description": "the step's start, POSIX seconds"},
            "requests_per_s": _NULLABLE_NUM,
            "failed_per_s": _NULLABLE_NUM,
            "tokens_per_s": {**_NULLABLE_NUM, "description": "completion tokens per second"},
            "queue": {**_NULLABLE_NUM, "description": "waiting sequences, the most reported"},
            "ttft_p50_s": _NULLABLE_NUM,
            "ttft_p99_s": _NULLABLE_NUM,
        },
    },
    "FleetPoint": {
        "type": "object",
        "description": "One 10 s bucket of fleet totals (rates per second over the bucket).",
        "required": ["t", "reports", "requests_per_s", "tokens_per_s", "ttft_observations"],
        "properties": {
            "t": {"type": "number", "description": "the bucket's start, POSIX seconds"},
            "reports": {"type": "integer"},
            "requests_per_s": {"type": "number"},
            "failed_per_s": {"type": "number"},
            "tokens_per_s": {"type": "number"},
            "prompt_tokens_per_s": {"type": "number"},
            "rejections_per_s": {"type": "number"},
            "ttft_observations": {"type": "integer"},
            "ttft_p50_s": _NULLABLE_NUM,
            "ttft_p99_s": _NULLABLE_NUM,
            "ttft_mean_s": _NULLABLE_NUM,
            "overflow_per_s": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "overflowed requests/s by target",
            },
            "overflow_cost": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "overflow cost in the bucket by target",
            },
            "redactions": {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "description": "values redacted in the bucket by type",
            },
            "redactions_per_s": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    },
    "DashboardSignIn": {
        "type": "object",
        "required": ["token"],
        "properties": {"token": {"type": "string", "description": "an admin token"}},
    },
    "DashboardSession": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "role": {"type": "string"},
            "expires_in_s": {"type": "integer"},
            "signed_out": {"type": "boolean"},
        },
    },
    "Caller": {
        "type": "object",
        "required": ["object", "token_id", "name", "role"],
        "properties": {
            "object": {"const": "caller"},
            "token_id": {"type": "string"},
            "name": {"type": "string"},
            "role": {"enum": ["viewer", "operator", "admin"]},
        },
    },
    "AuditEntry": {
        "type": "object",
        "required": ["object", "seq", "at", "actor_id", "action", "peer", "outcome", "status"],
        "properties": {
            "object": {"const": "audit_entry"},
            "seq": {"type": "integer"},
            "at": {"type": "string"},
            "actor_id": {"type": "string"},
            "actor_name": {"type": "string"},
            "role": {"type": "string"},
            "action": {"type": "string"},
            "target": {"type": "string"},
            "peer": {"type": "string"},
            "outcome": {"enum": ["ok", "failed", "refused"]},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
    },
    "RequestRecord": {
        "type": "object",
        "required": ["object", "agent_id", "seq"],
        "properties": {
            "object": {"const": "request_record"},
            "agent_id": {"type": "string"},
            "seq": {"type": "integer"},
            "key_id": _NULLABLE_STR,
            "model": {"type": "string"},
            "version": {"type": "string"},
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "latency_ms": {"type": "number"},
            "ttft_ms": _NULLABLE_NUM,
            "served_by": {"type": "string"},
            "status": {"type": "integer"},
            "dropped": {"type": "integer"},
        },
    },
}
_MODEL_VERSION_PROPS = {
    "object": {"const": "model_version"},
    "name": {"type": "string"},
    "version": {"type": "string"},
    "ref": {"type": "string", "description": "name@version"},
    "task": {"type": "string"},
    "sha256": {"type": "string", "description": "of the signed manifest"},
    "size_bytes": {"type": "integer"},
    "gate_passed": {"type": "boolean"},
    "deprecated": {"type": "boolean"},
    "published_at": {"type": "string", "format": "date-time"},
}
_SCHEMAS |= {
    "ModelVersion": {
        "type": "object",
        "required": list(_MODEL_VERSION_PROPS),
        "properties": _MODEL_VERSION_PROPS | {
            "files": {"type": "array", "items": _OBJ},
            "manifest_b64": {"type": "string", "contentEncoding": "base64"},
            "signature_b64": {"type": "string", "contentEncoding": "base64"},
            "desired_by": {},
            "loaded_on": {},
            "held_by": {"description": "the live coordinators holding every file: how many "
                        "(list, publish) or their ids (show)"},
            "held_by_wanted": {"type": "integer", "description": "publish: how many were "
                               "waited for (2, or every coordinator alive when fewer)"},
            "created": {"type": "boolean"},
            "warnings": {"type": "array", "items": {"type": "string"}},
        },
    },
    "NewModelVersion": {
        "type": "object",
        "required": ["manifest_b64"],
        "properties": {
            "manifest_b64": {"type": "string", "contentEncoding": "base64",
                             "description": "the models build's manifest.json bytes"},
            "name": {"type": "string", "description": "override the manifest's name"},
            "version": {"type": "string", "description": "override the manifest's version"},
        },
    },
    "Selector": {
        "type": "object",
        "properties": {
            "sites": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "array", "items": {"type": "string"}},
            "agent_ids": {"type": "array", "items": {"type": "string"}},
        },
    },
    "DeployRequest": {
        "type": "object",
        "properties": {
            "sites": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "array", "items": {"type": "string"}},
            "agent_ids": {"type": "array", "items": {"type": "string"}},
            "residency": {
                "type": "string", "enum": ["on_demand", "pinned", "store_only"],
                "description": "how the agents hold the weights: loaded by the first request "
                "and unloaded when idle (on_demand), loaded once verified and never unloaded "
                "(pinned), or kept on disk but not served (store_only); absent: as the rule "
                "this one replaces, else on_demand",
            },
        },
    },
    "ModelRule": {"type": "object", "required": ["object", "name", "version", "selector"],
                  "properties": {"object": {"const": "model_rule"},
                                 "residency": {"type": "string",
                                               "enum": ["on_demand", "pinned",
                                                        "store_only"]}}},
    "Deprecation": {"type": "object", "properties": {"deprecated": {"type": "boolean"}}},
    "BlobCheckRequest": {"type": "object", "required": ["sha256"],
                         "properties": {"sha256": {"type": "array",
                                                   "items": {"type": "string"}}}},
    "BlobCheck": {"type": "object", "required": ["missing"],
                  "properties": {"missing": {"type": "array", "items": {"type": "string"}}}},
    "Blob": {"type": "object", "required": ["sha256", "size", "stored"],
             "properties": {"sha256": {"type": "string"}, "size": {"type": "integer"},
                            "stored": {"type": "boolean"}}},
    "DeletedModelVersion": {"type": "object", "required": ["deleted"],
                            "properties": {"deleted": {"type": "boolean"},
                                           "blobs_removed": {"type": "integer"}}},
}  # fmt: skip
_ROLLOUT_POLICY_PROPERTIES: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1, "maxLength": 128},
    "version": {"type": "string", "minLength": 1, "maxLength": 128},
    "from_version": {"type": "string", "maxLength": 128},
    "selector": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            k: {"type": "array", "items": {"type": "string"}, "maxItems": 1000}
            for k in ("sites", "labels", "agent_ids")
        },
    },
    "canary_count": {"type": "integer", "minimum": 1},
    "canary_percent": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
    "waves": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 20},
    "soak_s": {"type": "number", "minimum": 0},
    "min_requests": {"type": "integer", "minimum": 0},
    "max_error_rate": {"type": "number", "minimum": 0, "maximum": 1},
    "max_ttft_p99_ratio": {"type": "number", "minimum": 1},
    "min_baseline_requests": {"type": "integer", "minimum": 1},
    "require_self_check": {"type": "boolean"},
    "step_timeout_s": {"type": "number", "minimum": 0},
}
_ROLLOUT_SUMMARY_PROPERTIES: dict[str, Any] = {
    "object": {"const": "rollout"},
    "rollout_id": {"type": "string"},
    "model": {"type": "string"},
    "version": {"type": "string"},
    "previous_version": {"type": "string"},
    "state": {"enum": ["running", "paused", "completed", "rolled_back", "aborted"]},
    "step": {"type": "integer"},
    "steps": {"type": "integer"},
    "step_name": {"type": "string"},
    "moved": {"type": "integer"},
    "agents": {"type": "integer"},
    "created_at": {"type": "number"},
    "updated_at": {"type": "number"},
    "finished_at": _NULLABLE_NUM,
    "created_by": {"type": "string"},
    "detail": {"type": "string"},
}
_SCHEMAS |= {
    "RolloutPolicy": {
        "type": "object",
        "required": ["model", "version"],
        "additionalProperties": False,
        "properties": _ROLLOUT_POLICY_PROPERTIES,
    },
    "RolloutAbort": {
        "type": "object",
        "properties": {"rollback": {"type": "boolean"}, "reason": {"type": "string"}},
    },
    "RolloutSummary": {
        "type": "object",
        "required": list(_ROLLOUT_SUMMARY_PROPERTIES),
        "properties": _ROLLOUT_SUMMARY_PROPERTIES,
    },
    "Rollout": {
        "type": "object",
        "required": [*_ROLLOUT_SUMMARY_PROPERTIES, "policy", "plan", "step_stats", "history"],
        "properties": _ROLLOUT_SUMMARY_PROPERTIES
        | {
            "policy": _OBJ,
            "plan": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
            "prior": _OBJ,
            "step_started_at": _NULLABLE_NUM,
            "paused_at": _NULLABLE_NUM,
            "step_stats": _OBJ,
            "baseline": _OBJ,
            "last_gate": {"type": ["object", "null"]},
            "gate": {"type": ["object", "null"]},
            "history": {"type": "array", "items": _OBJ},
        },
    },
}
for _name in ("Agent", "JoinToken", "AdminToken", "AuditEntry", "RequestRecord", "ApiKey",
              "ModelVersion", "RolloutSummary"):  # fmt: skip
    _SCHEMAS[f"{_name}List"] = _list_of(_name)
# /v1/agents is paginated (coordinator.api.agents.list_agents)
_SCHEMAS["AgentList"]["required"] += ["first_id", "last_id", "has_more"]
_SCHEMAS["AgentList"]["properties"] |= {
    "first_id": _NULLABLE_STR,
    "last_id": _NULLABLE_STR,
    "has_more": {"type": "boolean"},
}


def _q(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


def _p(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": 256}}  # fmt: skip


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


# (method, full path) -> (summary, parameters, request body schema, status, response)
# response: a schema name, or a content dict for non-JSON answers.
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
# One server-sent event (the stream is a sequence of them): data is JSON text.
_EVENTS = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "properties": {
                "event": {"enum": ["ready", "agents", "point"]},
                "data": {"type": "string"},
                "retry": {"type": "integer"},
                "id": {"type": "string"},
            },
        }
    }
}
_STATIC = {
    "text/html": {"schema": {"type": "string"}},
    "text/javascript": {"schema": {"type": "string"}},
    "text/css": {"schema": {"type": "string"}},
    "application/json": {"schema": {"type": "object"}},
}
_OPERATIONS: dict[tuple[str, str], tuple[list[Any], str | None, str, Any]] = {
    ("GET", "/v1/agents"): (
        [
            _q(
                "limit",
                {"type": "number", "minimum": 1, "maximum": 1000},
                "agents per page (default 500)",
            ),
            _q("after", {"type": "string"}, "the last agent id of the previous page"),
        ],
        None,
        "200",
        "AgentList",
    ),
    ("GET", "/v1/agents/{agent_id}"): ([_p("agent_id")], None, "200", "Agent"),
    ("GET", "/v1/route"): (
        [
            {
                "name": "model",
                "in": "query",
                "required": True,
                "schema": {"type": "string", "minLength": 1},
            },
            _q("version", {"type": "string"}),
            _q("lat", {"type": "number", "minimum": -90, "maximum": 90}),
            _q("lon", {"type": "number", "minimum": -180, "maximum": 180}),
            _q("site", {"type": "string"}),
            _q("max_wait_ms", {"type": "number", "minimum": 0, "maximum": 3_600_000}),
            _q("limit", {"type": "number", "minimum": 0, "maximum": 1000}),
            _q("exclude", {"type": "string"}, "comma-separated agent ids"),
            _q("rtt", {"type": "string"}, "AGENT_ID:MS, comma-separated"),
            _q("client_ip", {"type": "string"}),
        ],
        None,
        "200",
        "Route",
    ),
    ("GET", "/healthz"): ([], None, "200", "Health"),
    ("GET", "/metrics"): ([], None, "200", _TEXT),
    ("GET", "/openapi.json"): ([], None, "200", {"application/json": {"schema": _OBJ}}),
    ("GET", "/v1/admin/whoami"): ([], None, "200", "Caller"),
    ("POST", "/v1/admin/keys"): ([], "NewApiKey", "201", "ApiKey"),
    ("GET", "/v1/admin/keys"): ([], None, "200", "ApiKeyList"),
    ("GET", "/v1/admin/keys/{key_id}"): ([_p("key_id")], None, "200", "ApiKey"),
    ("PATCH", "/v1/admin/keys/{key_id}"): ([_p("key_id")], "ApiKeyChange", "200", "ApiKey"),
    ("DELETE", "/v1/admin/keys/{key_id}"): ([_p("key_id")], None, "200", "ApiKey"),
    ("POST", "/v1/admin/tokens"): ([], "NewJoinToken", "201", "JoinToken"),
    ("GET", "/v1/admin/tokens"): ([], None, "200", "JoinTokenList"),
    ("DELETE", "/v1/admin/tokens/{token_id}"): (
        [_p("token_id"), _q("agents", {"enum": ["true", "false"]}, "revoke its agents too")],
        None,
        "200",
        "JoinToken",
    ),
    ("POST", "/v1/admin/agents/{agent_id}/drain"): ([_p("agent_id")], None, "200", "Agent"),
    ("POST", "/v1/admin/agents/{agent_id}/models/{model}/load"): (
        [_p("agent_id"), _p("model")],
        None,
        "202",
        "ModelCommand",
    ),
    ("POST", "/v1/admin/agents/{agent_id}/models/{model}/unload"): (
        [_p("agent_id"), _p("model")],
        None,
        "202",
        "ModelCommand",
    ),
    ("POST", "/v1/admin/agents/{agent_id}/resume"): ([_p("agent_id")], None, "200", "Agent"),
    ("PATCH", "/v1/admin/agents/{agent_id}"): (
        [_p("agent_id")],
        "AgentFixed",
        "200",
        "AgentRecord",
    ),
    ("POST", "/v1/admin/agents/{agent_id}/revoke"): (
        [_p("agent_id")],
        None,
        "200",
        "AgentRecord",
    ),
    ("DELETE", "/v1/admin/agents/{agent_id}"): ([_p("agent_id")], None, "200", "AgentRecord"),
    ("POST", "/v1/admin/admin-tokens"): ([], "NewAdminToken", "201", "AdminToken"),
    ("GET", "/v1/admin/admin-tokens"): ([], None, "200", "AdminTokenList"),
    ("DELETE", "/v1/admin/admin-tokens/{token_id}"): ([_p("token_id")], None, "200", "AdminToken"),
    ("GET", "/v1/admin/audit"): (
        [
            _q("format", {"enum": ["json", "jsonl"]}),
            _q("since", {"type": "string", "format": "date-time"}),
            _q("after_seq", {"type": "integer", "minimum": 0}),
            _q("limit", {"type": "integer", "minimum": 0, "maximum": 100_000}),
        ],
        None,
        "200",
        {**_json("AuditEntryList"), "application/jsonl": {"schema": {"type": "string"}}},
    ),
    ("GET", "/v1/blobs/sha256/{sha256}"): (
        [
            _p("sha256"),
            {
                "name": "Range",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "one range: bytes=a-b, bytes=a- or bytes=-n (206; 416 outside)",
            },
            {
                "name": "If-None-Match",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": 'the strong ETag "<sha256>" (304)',
            },
            {
                "name": "Edgefleet-Agent",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "an agent id: then the bearer token is that agent's credential",
            },
        ],
        None,
        "200",
        {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    ),
    ("GET", "/v1/admin/models"): (
        [_q("name", {"type": "string"}, "only this model's versions")],
        None,
        "200",
        "ModelVersionList",
    ),
    ("POST", "/v1/admin/models"): ([], "NewModelVersion", "201", "ModelVersion"),
    ("POST", "/v1/admin/model-blobs/missing"): ([], "BlobCheckRequest", "200", "BlobCheck"),
    ("PUT", "/v1/admin/model-blobs/sha256/{sha256}"): (
        [_p("sha256")],
        None,
        "201",
        "Blob",
    ),
    ("GET", "/v1/admin/models/{name}/{version}"): (
        [_p("name"), _p("version")],
        None,
        "200",
        "ModelVersion",
    ),
    ("POST", "/v1/admin/models/{name}/{version}/deprecate"): (
        [_p("name"), _p("version")],
        "Deprecation",
        "200",
        "ModelVersion",
    ),
    ("DELETE", "/v1/admin/models/{name}/{version}"): (
        [_p("name"), _p("version")],
        None,
        "200",
        "DeletedModelVersion",
    ),
    ("POST", "/v1/admin/models/{name}/{version}/deploy"): (
        [_p("name"), _p("version")],
        "DeployRequest",
        "200",
        "ModelRule",
    ),
    ("GET", "/v1/admin/request-records"): (
        [
            _q("agent_id", {"type": "string"}),
            _q("after_seq", {"type": "integer", "minimum": 0}),
            _q("limit", {"type": "integer", "minimum": 0, "maximum": 10_000}),
        ],
        None,
        "200",
        "RequestRecordList",
    ),
    ("POST", "/v1/admin/rollouts"): ([], "RolloutPolicy", "201", "Rollout"),
    ("GET", "/v1/admin/rollouts"): (
        [
            _q("state", {"type": "string"}, "comma-separated states (default: all)"),
            _q("limit", {"type": "integer", "minimum": 0, "maximum": 1000}),
        ],
        None,
        "200",
        "RolloutSummaryList",
    ),
    ("GET", "/v1/admin/rollouts/{rollout_id}"): ([_p("rollout_id")], None, "200", "Rollout"),
    ("POST", "/v1/admin/rollouts/{rollout_id}/pause"): (
        [_p("rollout_id")],
        None,
        "200",
        "RolloutSummary",
    ),
    ("POST", "/v1/admin/rollouts/{rollout_id}/resume"): (
        [_p("rollout_id")],
        None,
        "200",
        "RolloutSummary",
    ),
    ("POST", "/v1/admin/rollouts/{rollout_id}/abort"): (
        [_p("rollout_id")],
        "RolloutAbort",
        "200",
        "RolloutSummary",
    ),
    ("GET", "/v1/admin/fleet/series"): ([], None, "200", "FleetSeries"),
    ("GET", "/v1/admin/fleet/events"): ([], None, "200", _EVENTS),
    ("GET", "/v1/admin/agents/{agent_id}/series"): ([_p("agent_id")], None, "200", "AgentSeries"),
    ("GET", "/dashboard/"): ([], None, "200", {"text/html": {"schema": {"type": "string"}}}),
    ("GET", "/dashboard/{name}"): ([_p("name")], None, "200", _STATIC),
    ("GET", "/dashboard/vendor/{name}"): ([_p("name")], None, "200", _STATIC),
    ("POST", "/v1/dashboard/session"): ([], "DashboardSignIn", "201", "DashboardSession"),
    ("DELETE", "/v1/dashboard/session"): ([], None, "200", "DashboardSession"),
}


_SUMMARIES = {
    ("GET", "/dashboard/"): "The operator dashboard's page (public; its data needs a session)",
    ("GET", "/dashboard/{name}"): "The dashboard's static files: script and style (public)",
    ("GET", "/dashboard/vendor/{name}"): "The dashboard's vendored libraries and world atlas "
    "(public; their licences and hashes in the source tree)",
    ("POST", "/v1/dashboard/session"): "Sign in to the dashboard with an admin token: "
    "answers an HttpOnly, SameSite=Strict session cookie (public)",
    ("DELETE", "/v1/dashboard/session"): "Sign out of the dashboard (public)",
    ("GET", "/v1/agents"): "The fleet: every agent the coordinator knows",
    ("GET", "/v1/agents/{agent_id}"): "One agent",
    ("GET", "/v1/route"): "Which agents a client should use for a model (public). A client "
    "may present its API key (Authorization: Bearer ef-...): a key whose policy blocks a "
    "moderation category then gets only agents that enforce content safety (the others are "
    "counted in excluded as no_content_safety); a key this coordinator does not know is "
    "looked up as if none was given",
    ("GET", "/healthz"): "Health of the coordinator (public)",
    ("GET", "/metrics"): "Prometheus metrics (text format)",
    ("GET", "/openapi.json"): "This document (public)",
    ("GET", "/v1/blobs/sha256/{sha256}"): "A model file by sha256 (Range, strong ETag); "
    "viewer token or an agent's own credential",
}


# Answers beyond the common ones (400, 404, 405, 401/403, 413), by route: rollouts in
# another state; the dashboard's sign-in (a wrong token, another origin, too many tries,
# too many live sign-ins).
_EXTRA_RESPONSES: dict[tuple[str, str], dict[str, str]] = {
    (method, path): {
        "409": "The rollout or the model is in another state (one rollout per model)",
    }
    for method, path in _OPERATIONS
    if path.startswith("/v1/admin/rollouts") and method == "POST"
} | {
    ("POST", "/v1/dashboard/session"): {
        "401": "Not a valid admin token",
        "403": "Sent from another origin",
        "429": "Too many sign-in attempts",
        "503": "The database keeps the most live sign-ins",
    },
    ("DELETE", "/v1/dashboard/session"): {"403": "Sent from another origin"},
}


def documented_routes() -> set[tuple[str, str]]:
    return set(_OPERATIONS)


def openapi_document(
    roles: Mapping[tuple[str, str], Role | None], summaries: Mapping[tuple[str, str], str]
) -> dict[str, Any]:
    """The document for a route table: the role of each route (None: public) and the
    admin routes' summaries (the public routes' are above)."""
    summaries = {**_SUMMARIES, **summaries}
    paths: dict[str, Any] = {}
    for (method, path), (params, body, status, response) in _OPERATIONS.items():
        role = roles.get((method, path))
        content = _json(response) if isinstance(response, str) else response
        responses: dict[str, Any] = {
            status: {"description": "Success", "content": content},
            "400": {"description": "Invalid parameter", "content": _json("Error")},
            "404": {"description": "No such agent, token or route", "content": _json("Error")},
            "405": {"description": "Method not allowed", "content": _json("Error")},
        }
        operation: dict[str, Any] = {
            "summary": summaries.get((method, path), ""),
            "operationId": f"{method.lower()}_{path.strip('/').replace('/', '_')}"
            .replace("{", "").replace("}", "").replace("-", "_").replace(".", "_"),
            "parameters": params,
            "responses": responses,
            "x-role": None if role is None else role.label,
        }  # fmt: skip
        if role is not None:
            operation["security"] = [{"bearer": []}]
            responses["401"] = {"description": "No or unknown token", "content": _json("Error")}
            responses["403"] = {"description": "Role too low", "content": _json("Error")}
            responses["503"] = {
                "description": "The fleet database is unavailable (code store_unavailable; "
                "Retry-After says when to try again)",
                "content": _json("Error"),
            }
        if body is not None:
            operation["requestBody"] = {"required": False, "content": _json(body)}
            responses["413"] = {"description": "Body over the limit", "content": _json("Error")}
        for code, description in _EXTRA_RESPONSES.get((method, path), {}).items():
            responses[code] = {"description": description, "content": _json("Error")}
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "edgefleet coordinator",
            "version": "1",
            "description": "Fleet view, route lookup and the admin API. Guarded routes need "
            "Authorization: Bearer <admin token>; x-role names the least role.",
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document the app was built with (serialized once)."""
    return web.Response(body=request.config_dict[OPENAPI_KEY], content_type="application/json")
