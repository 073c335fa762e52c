"""The JSON views of the coordinator's records, shared by the HTTP handlers, the dashboard's
event stream and the CLI."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from coordinator.fleet.records import AgentRecord, AgentStatus
from coordinator.store.interface import ApiKeyRecord, JoinToken, StoredAgent
from edgefleet.contract import LoadReport, Location
from edgefleet.key_policy import key_policy_to_json


def stored_agent_json(agent: StoredAgent | None, agent_id: str) -> dict[str, Any]:
    """What the operator fixed for an agent, and its enrollment state."""
    if agent is None:
        return {"object": "agent_record", "agent_id": agent_id, "removed": True}
    return {
        "object": "agent_record",
        "agent_id": agent.agent_id,
        "enrolled": agent.enrolled,
        "token_id": agent.token_id,
        "site": agent.site,
        "location": location_json(agent.location),
        "http_url": agent.http_url,
        "cert_serial": agent.cert_serial,
        "cert_not_after": iso_time(agent.cert_not_after),
        "revoked": agent.revoked,
        "revoked_at": iso_time(agent.revoked_at),
        "removed": False,
    }


# A connected agent whose last message is older than this many report intervals
# is flagged "stale" (its stream may be half-dead).
STALE_AFTER_INTERVALS = 3


def agent_json(record: AgentRecord, now: datetime, report_interval_ms: int) -> dict[str, Any]:
    """The JSON view of one agent in GET /v1/agents."""
    hello = record.hello
    stale_after = timedelta(milliseconds=STALE_AFTER_INTERVALS * report_interval_ms)
    report = record.last_report
    return {
        "object": "agent",
        "agent_id": hello.agent_id,
        "site": hello.site,
        "location": None
        if hello.location is None
        else {"lat": hello.location.lat, "lon": hello.location.lon},
        "http_url": hello.http_url,
        "agent_version": hello.agent_version,
        "status": record.status.value,
        # the coordinator its session is on (this one, or another: the shared live view)
        "coordinator": record.owner or None,
        "stale": record.status is AgentStatus.CONNECTED and now - record.last_seen > stale_after,
        "liveness": record.liveness.value,
        "draining": record.draining,
        "enrolled": record.enrolled,
        "session_id": record.session_id,
        "connected_since": iso_time(record.connected_since),
        "last_seen": iso_time(record.last_seen),
        "hardware": {
            "cpu_count": hello.hardware.cpu_count,
            "memory_bytes": hello.hardware.memory_bytes,
            "execution_providers": list(hello.hardware.execution_providers),
        },
        "models": [asdict(m) for m in hello.models],
        "load": None if report is None else load_json(report),
        "healthy": not record.unhealthy_reason,
        "unhealthy_reason": record.unhealthy_reason or None,
        "contract_minor": hello.contract_minor,
        "desired_state": {
            "version": record.desired.version,
            # The generation of each section the coordinator set, and the agent applied.
            "generations": record.desired.generations()._asdict(),
            "applied": None if report is None else report.applied._asdict(),
        },
        "bye_reason": record.bye_reason,
    }


def load_json(report: LoadReport) -> dict[str, Any]:
    """A load report as JSON: its figures, what it applied, and the model inventory
    (per-interval model stats are the rollouts' to aggregate, not shown here)."""
    view = report._asdict()
    view["applied"] = report.applied._asdict()
    view["inventory"] = [
        {**item._asdict(), "self_check": None if item.self_check is None
         else item.self_check._asdict()}
        for item in report.inventory
    ]  # fmt: skip
    view.pop("model_stats", None)
    return view


def location_json(location: Location | None) -> dict[str, float] | None:
    return None if location is None else {"lat": location.lat, "lon": location.lon}


def iso_time(value: datetime | None) -> str | None:
    """ISO 8601 UTC text, e.g. '2026-01-02T03:04:05.678Z'."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def token_json(token: JoinToken, now: datetime) -> dict[str, Any]:
    return {
        "object": "join_token",
        "token_id": token.token_id,
        "created_at": iso_time(token.created_at),
        "expires_at": iso_time(token.expires_at),
        "max_uses": token.max_uses,
        "uses": token.uses,
        "site": token.site,
        "note": token.note,
        "state": token.state(now),
        "location": location_json(token.location),
        "http_url": token.http_url,
    }


def api_key_json(key: ApiKeyRecord, now: datetime) -> dict[str, Any]:
    """An API key as the admin API and CLI show it (never the secret nor its digest)."""
    return {
        "object": "api_key",
        "key_id": key.key_id,
        "name": key.name,
        "created_at": iso_time(key.created_at),
        "expires_at": iso_time(key.expires_at),
        "revoked_at": iso_time(key.revoked_at),
        "state": key.state(now),
        "models": list(key.models),
        "allow_cloud": key.allow_cloud,
        "max_priority": key.max_priority,
        "max_tokens_per_request": key.max_tokens_per_request,
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        "max_keep_alive_s": key.max_keep_alive_s,
        "may_pin_models": key.may_pin_models,
        "policy": key_policy_to_json(key.policy),
        "usage": {
            "requests": key.requests,
            "prompt_tokens": key.prompt_tokens,
            "completion_tokens": key.completion_tokens,
            "rejected": key.rejected,
        },
    }
