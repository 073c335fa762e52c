"""Conversion between edgefleet.v1 wire messages and the internal dataclasses.

Validation of incoming messages happens here and raises ProtocolError.
"""

from __future__ import annotations

import math
from datetime import UTC
from urllib.parse import urlsplit

from coordinator.errors import ProtocolError
from coordinator.fleet import (
    AgentHello,
    DesiredState,
    Hardware,
    LoadedModel,
    LoadReport,
    Location,
    OverflowKind,
    OverflowTarget,
    valid_agent_id,
)
from coordinator.route_scorer import RouteDecision, RouteQuery
from edgefleet.v1 import fleet_pb2 as pb

_OVERFLOW_KIND_TO_PB = {
    OverflowKind.PEER: pb.OVERFLOW_KIND_PEER,
    OverflowKind.GPU_POOL: pb.OVERFLOW_KIND_GPU_POOL,
    OverflowKind.HOSTED_PROVIDER: pb.OVERFLOW_KIND_HOSTED_PROVIDER,
}


def hello_from_pb(message: pb.Hello) -> AgentHello:
    """Validate a Hello and convert it; raises ProtocolError naming the bad field."""
    if not valid_agent_id(message.agent_id):
        raise ProtocolError(
            f"Hello.agent_id {message.agent_id!r} is invalid: 1-128 characters of "
            "letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
        )
    if message.http_url:
        parts = urlsplit(message.http_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ProtocolError(
                f"Hello.http_url {message.http_url!r} is not an absolute http(s) URL"
            )
    location = None
    if message.HasField("location"):
        loc = message.location
        location = location_checked(loc.lat, loc.lon, "Hello.location")
    models = []
    for index, model in enumerate(message.models):
        if not model.name:
            raise ProtocolError(f"Hello.models[{index}].name is empty")
        models.append(
            LoadedModel(
                name=model.name, version=model.version, task=model.task, variant=model.variant
            )
        )
    hw = message.hardware
    return AgentHello(
        agent_id=message.agent_id,
        site=message.site,
        http_url=message.http_url,
        agent_version=message.agent_version,
        location=location,
        hardware=Hardware(
            cpu_count=hw.cpu_count,
            memory_bytes=hw.memory_bytes,
            accelerators=tuple(hw.accelerators),
            execution_providers=tuple(hw.execution_providers),
        ),
        models=tuple(models),
        token=message.token,
    )


def load_report_from_pb(message: pb.LoadReport) -> LoadReport:
    fraction = message.kv_cache_used_fraction
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ProtocolError(f"LoadReport.kv_cache_used_fraction {fraction} is outside [0, 1]")
    if not (math.isfinite(message.tokens_per_second) and message.tokens_per_second >= 0.0):
        raise ProtocolError(
            f"LoadReport.tokens_per_second {message.tokens_per_second} is not a rate"
        )
    timestamp = None
    if message.HasField("timestamp"):
        timestamp = message.timestamp.ToDatetime(tzinfo=UTC)
    return LoadReport(
        timestamp=timestamp,
        queue_depth=message.queue_depth,
        running_sequences=message.running_sequences,
        waiting_sequences=message.waiting_sequences,
        tokens_per_second=message.tokens_per_second,
        kv_cache_used_fraction=fraction,
        kv_cache_used_tokens=message.kv_cache_used_tokens,
        free_memory_bytes=message.free_memory_bytes,
        requests_total=message.requests_total,
        requests_failed_total=message.requests_failed_total,
        overflow_requests_total=message.overflow_requests_total,
        draining=message.draining,
    )


def welcome_to_pb(session_id: str, report_interval_ms: int) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(
        welcome=pb.Welcome(session_id=session_id, report_interval_ms=report_interval_ms)
    )


def overflow_target_to_pb(target: OverflowTarget) -> pb.OverflowTarget:
    return pb.OverflowTarget(
        name=target.name,
        kind=_OVERFLOW_KIND_TO_PB[target.kind],
        url=target.url,
        models=list(target.models),
    )


def desired_state_to_pb(state: DesiredState) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(
        desired_state=pb.DesiredState(
            version=state.version,
            models=[
                pb.ModelTarget(
                    name=m.name, version=m.version, artifact_url=m.artifact_url, sha256=m.sha256
                )
                for m in state.models
            ],
            overflow_targets=[overflow_target_to_pb(t) for t in state.overflow_targets],
            config=dict(state.config),
        )
    )


_COMMAND_TO_PB = {
    "drain": pb.Command.KIND_DRAIN,
    "reload": pb.Command.KIND_RELOAD,
    "resume": pb.Command.KIND_RESUME,
}


def command_to_pb(kind: str, reason: str) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(command=pb.Command(kind=_COMMAND_TO_PB[kind], reason=reason))


def location_checked(lat: float, lon: float, where: str) -> Location:
    if not (math.isfinite(lat) and -90.0 <= lat <= 90.0):
        raise ProtocolError(f"{where}.lat {lat} is outside [-90, 90]")
    if not (math.isfinite(lon) and -180.0 <= lon <= 180.0):
        raise ProtocolError(f"{where}.lon {lon} is outside [-180, 180]")
    return Location(lat=lat, lon=lon)


def route_query_from_pb(message: pb.RouteRequest) -> RouteQuery:
    if not message.model:
        raise ProtocolError("RouteRequest.model is empty")
    location = None
    if message.HasField("client_location"):
        loc = message.client_location
        location = location_checked(loc.lat, loc.lon, "RouteRequest.client_location")
    for agent_id, rtt in message.client_rtt_ms.items():
        if not (math.isfinite(rtt) and rtt >= 0):
            raise ProtocolError(f"RouteRequest.client_rtt_ms[{agent_id!r}] {rtt} is not a time")
    return RouteQuery(
        model=message.model,
        version=message.version if message.HasField("version") else None,
        location=location,
        site=message.site,
        max_wait_ms=message.max_wait_ms,
        exclude=frozenset(message.exclude_agent_ids),
        client_rtt_ms=dict(message.client_rtt_ms),
        limit=message.limit,
    )


def route_response_to_pb(decision: RouteDecision) -> pb.RouteResponse:
    response = pb.RouteResponse(reason=decision.reason)
    for a in decision.agents:
        ranked = response.agents.add(
            agent_id=a.agent_id,
            http_url=a.http_url,
            site=a.site,
            score=a.score,
            score_parts=dict(a.score_parts),
            liveness=a.liveness.value,
            predicted_wait_ms=a.predicted_wait_ms,
        )
        if a.distance_km is not None:
            ranked.distance_km = a.distance_km
    if decision.overflow is not None:
        response.overflow.CopyFrom(overflow_target_to_pb(decision.overflow))
    return response
