"""Validation of what agents and clients send, and conversion of the coordinator's answers.

Messages from outside (Hello, LoadReport, RouteRequest) are checked here and raise
ProtocolError naming the bad field; well-formed ones are converted to the shared
contract types by ``edgefleet.contract_pb``, the one conversion both processes use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from coordinator.errors import ProtocolError
from coordinator.fleet.records import valid_agent_id
from coordinator.routing.scorer import RouteDecision, RouteQuery
from edgefleet import contract_pb
from edgefleet.contract import (
    CONTRACT_MINOR,
    Command,
    CommandKind,
    DesiredState,
    Hello,
    LoadReport,
    Location,
    Welcome,
    contract_minor_accepted,
)
from edgefleet.v1 import fleet_pb2 as pb

# Bounds on what one Hello may carry: each agent's record (and the fleet database) stays
# small however many agents say Hello.
MAX_HELLO_BYTES = 8192  # the whole Hello, serialized (a usual one is under 1 KB)
MAX_HELLO_MODELS = 64
MAX_EXECUTION_PROVIDERS = 16
MAX_SITE_CHARS = 128
MAX_URL_CHARS = 512
MAX_VERSION_CHARS = 128  # agent_version and model versions
MAX_MODEL_FIELD_CHARS = 128  # model name, task, variant
MAX_PROVIDER_CHARS = 64
MAX_OVERFLOW_USAGE = 256  # overflow targets in one LoadReport (v1.3)


class UnsupportedContractError(ProtocolError):
    """The agent speaks a minor contract version this coordinator does not accept."""


def hello_from_pb(message: pb.Hello) -> Hello:
    """Validate a Hello and convert it; raises ProtocolError naming the bad field.

    Raises UnsupportedContractError when ``contract_minor`` is more than one minor version
    away from ours (agents from before contract versions, minor 0, among them: they sent
    0°N 0°E for "no place", which no accepted agent does, so 0, 0 is a real place).
    """
    minor = message.contract_minor
    if not contract_minor_accepted(minor):
        raise UnsupportedContractError(
            f"Hello.contract_minor {minor}: the agent speaks contract v1.{minor}, this "
            f"coordinator speaks v1.{CONTRACT_MINOR} and accepts v1.{max(CONTRACT_MINOR - 1, 0)}"
            f" to v1.{CONTRACT_MINOR + 1}; upgrade the "
            + ("coordinator" if minor > CONTRACT_MINOR else "agent")
        )
    if not valid_agent_id(message.agent_id):
        raise ProtocolError(
            f"Hello.agent_id {message.agent_id!r} is invalid: 1-128 characters of "
            "letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
        )
    check_hello_sizes(message)
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
    for index, model in enumerate(message.models):
        if not model.name:
            raise ProtocolError(f"Hello.models[{index}].name is empty")
    return replace(contract_pb.hello_from_pb(message), location=location)


def _check_length(value: str, limit: int, where: str) -> None:
    if len(value) > limit:
        raise ProtocolError(f"{where} is {len(value)} characters; at most {limit} are accepted")


def check_hello_sizes(message: pb.Hello) -> None:
    """Caps on a Hello's strings and lists; raises ProtocolError naming the field."""
    _check_length(message.site, MAX_SITE_CHARS, "Hello.site")
    _check_length(message.http_url, MAX_URL_CHARS, "Hello.http_url")
    _check_length(message.agent_version, MAX_VERSION_CHARS, "Hello.agent_version")
    if len(message.models) > MAX_HELLO_MODELS:
        raise ProtocolError(
            f"Hello.models has {len(message.models)} entries; at most {MAX_HELLO_MODELS}"
        )
    for index, model in enumerate(message.models):
        where = f"Hello.models[{index}]"
        _check_length(model.name, MAX_MODEL_FIELD_CHARS, f"{where}.name")
        _check_length(model.version, MAX_VERSION_CHARS, f"{where}.version")
        _check_length(model.task, MAX_MODEL_FIELD_CHARS, f"{where}.task")
        _check_length(model.variant, MAX_MODEL_FIELD_CHARS, f"{where}.variant")
    providers = message.hardware.execution_providers
    if len(providers) > MAX_EXECUTION_PROVIDERS:
        raise ProtocolError(
            f"Hello.hardware.execution_providers has {len(providers)} entries; at most "
            f"{MAX_EXECUTION_PROVIDERS}"
        )
    for index, provider in enumerate(providers):
        _check_length(provider, MAX_PROVIDER_CHARS, f"Hello.hardware.execution_providers[{index}]")
    size = message.ByteSize()
    if size > MAX_HELLO_BYTES:
        raise ProtocolError(f"Hello is {size} bytes; at most {MAX_HELLO_BYTES} are accepted")


# A LoadReport's model inventory and per-version stats (v1.3): entries and sizes at most.
MAX_INVENTORY = 256
MAX_INVENTORY_ERROR_CHARS = 2000
MAX_HISTOGRAM_BUCKETS = 64


def check_model_reports(message: pb.LoadReport) -> None:
    """Caps on a LoadReport's inventory and model stats; raises ProtocolError."""
    inventory, model_stats = message.inventory, message.model_stats
    if not inventory and not model_stats:
        return  # most reports: nothing to check
    for field_name, entries in (("inventory", inventory), ("model_stats", model_stats)):
        if len(entries) > MAX_INVENTORY:
            raise ProtocolError(
                f"LoadReport.{field_name} has {len(entries)} entries; at most {MAX_INVENTORY}"
            )
        for index, entry in enumerate(entries):
            where = f"LoadReport.{field_name}[{index}]"
            if not entry.name:
                raise ProtocolError(f"{where}.name is empty")
            _check_length(entry.name, MAX_MODEL_FIELD_CHARS, f"{where}.name")
            _check_length(entry.version, MAX_VERSION_CHARS, f"{where}.version")
    for index, item in enumerate(message.inventory):
        where = f"LoadReport.inventory[{index}]"
        _check_length(item.last_error, MAX_INVENTORY_ERROR_CHARS, f"{where}.last_error")
        if item.HasField("self_check"):
            _check_length(item.self_check.detail, MAX_INVENTORY_ERROR_CHARS,
                          f"{where}.self_check.detail")  # fmt: skip
    for index, stats in enumerate(message.model_stats):
        histogram = stats.ttft_seconds
        where = f"LoadReport.model_stats[{index}].ttft_seconds"
        if len(histogram.upper_bounds) > MAX_HISTOGRAM_BUCKETS:
            raise ProtocolError(f"{where} has more than {MAX_HISTOGRAM_BUCKETS} buckets")
        if histogram.counts and len(histogram.counts) != len(histogram.upper_bounds) + 1:
            raise ProtocolError(f"{where}: len(counts) must be len(upper_bounds) + 1")
        if not all(math.isfinite(b) for b in histogram.upper_bounds) or list(
            histogram.upper_bounds
        ) != sorted(histogram.upper_bounds):
            raise ProtocolError(f"{where}.upper_bounds must be finite and ascending")


@dataclass(frozen=True, slots=True)
class LoadLimits:
    """Plausible ceilings for what an agent says about its load.

    A report above them is clamped, not refused (a real agent may burst), so that an
    agent claiming 1e300 tokens/s or a billion sequences is ranked like the fastest
    plausible agent, never above every honest one. Defaults: 100,000 tokens/s (a large
    GPU box), 10,000 running or waiting sequences, 2**40 KV-cache tokens, 2**50 bytes of
    free memory (1 PiB); coordinator config: max_agent_tokens_per_second,
    max_agent_sequences.
    """

    tokens_per_second: float = 100_000.0
    sequences: int = 10_000
    kv_cache_tokens: int = 2**40
    memory_bytes: int = 2**50


DEFAULT_LOAD_LIMITS = LoadLimits()


# An entity type name in LoadReport.redactions (EMAIL, US_SSN, ...; newer agents may add some).
_REDACTION_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,31}")


# A "category:action" in LoadReport.moderation_flags (OpenAI's names, prompt_injection;
# newer agents may add categories).
_FLAG_NAME = re.compile(r"[a-z][a-z_/-]{0,47}:(block|flag)")
# API keys in LoadReport.moderation_flags_by_key (the agent keeps at most 1,024, plus "").
MAX_FLAGGED_KEYS = 1025


# The outcomes in LoadReport.semantic_cache_lookups (agent/semantic_cache.py's Outcome).
SEMANTIC_CACHE_OUTCOMES = frozenset({"hit", "miss", "refused", "ineligible"})


def _check_moderation(message: pb.LoadReport) -> None:
    _check_length(message.moderation_heads, MAX_MODEL_FIELD_CHARS, "LoadReport.moderation_heads")
    flags = message.moderation_flags
    if flags and (len(flags) > 64 or any(not _FLAG_NAME.fullmatch(name) for name in flags)):
        raise ProtocolError(
            "LoadReport.moderation_flags holds more than 64 entries or one that is not "
            "category:block or category:flag"
        )
    by_key = message.moderation_flags_by_key
    if by_key and (len(by_key) > MAX_FLAGGED_KEYS or any(len(k) > 64 for k in by_key)):
        raise ProtocolError(
            f"LoadReport.moderation_flags_by_key holds more than {MAX_FLAGGED_KEYS} keys or a "
            "key id longer than 64 characters"
        )


def load_report_from_pb(
    message: pb.LoadReport, limits: LoadLimits = DEFAULT_LOAD_LIMITS
) -> LoadReport:
    """Validate a LoadReport and convert it, clamping its figures to ``limits``; raises
    ProtocolError naming the bad field."""
    fraction = message.kv_cache_used_fraction
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ProtocolError(f"LoadReport.kv_cache_used_fraction {fraction} is outside [0, 1]")
    if not (math.isfinite(message.tokens_per_second) and message.tokens_per_second >= 0.0):
        raise ProtocolError(
            f"LoadReport.tokens_per_second {message.tokens_per_second} is not a rate"
        )
    if len(message.unhealthy_reason) > 1000:
        raise ProtocolError("LoadReport.unhealthy_reason is longer than 1000 characters")
    check_model_reports(message)
    redactions = message.redactions
    if redactions and (
        len(redactions) > 32 or any(not _REDACTION_TYPE.fullmatch(name) for name in redactions)
    ):
        raise ProtocolError(
            "LoadReport.redactions holds more than 32 types or a type name that is not 1-32 "
            "upper-case letters, digits and underscores"
        )
    _check_moderation(message)
    lookups = message.semantic_cache_lookups
    if lookups and not set(lookups) <= SEMANTIC_CACHE_OUTCOMES:
        raise ProtocolError(
            "LoadReport.semantic_cache_lookups holds an outcome that is not one of "
            + ", ".join(sorted(SEMANTIC_CACHE_OUTCOMES))
        )
    overflow_usage = message.overflow_usage
    if len(overflow_usage) > MAX_OVERFLOW_USAGE:
        raise ProtocolError(
            f"LoadReport.overflow_usage has {len(overflow_usage)} entries; at most "
            f"{MAX_OVERFLOW_USAGE}"
        )
    for index, usage in enumerate(overflow_usage):
        where = f"LoadReport.overflow_usage[{index}]"
        _check_length(usage.target, MAX_MODEL_FIELD_CHARS, f"{where}.target")
        if usage.failed > usage.requests:
            raise ProtocolError(f"{where}.failed is more than its requests")
        if not (math.isfinite(usage.cost) and usage.cost >= 0.0):
            raise ProtocolError(f"{where}.cost {usage.cost} is not a cost")
    report = contract_pb.load_report_from_pb(message)
    if (
        report.tokens_per_second <= limits.tokens_per_second
        and report.running_sequences <= limits.sequences
        and report.waiting_sequences <= limits.sequences
        and report.kv_cache_used_tokens <= limits.kv_cache_tokens
        and report.free_memory_bytes <= limits.memory_bytes
    ):
        return report  # nothing to clamp (every honest report)
    return report._replace(
        tokens_per_second=min(report.tokens_per_second, limits.tokens_per_second),
        running_sequences=min(report.running_sequences, limits.sequences),
        waiting_sequences=min(report.waiting_sequences, limits.sequences),
        kv_cache_used_tokens=min(report.kv_cache_used_tokens, limits.kv_cache_tokens),
        free_memory_bytes=min(report.free_memory_bytes, limits.memory_bytes),
    )


def welcome_to_pb(
    session_id: str,
    report_interval_ms: int,
    model_signing_key: bytes = b"",
    *,
    coordinators: Sequence[str] = (),
) -> pb.CoordinatorMessage:
    welcome = Welcome(
        session_id=session_id,
        report_interval_ms=report_interval_ms,
        model_signing_key=model_signing_key,
        coordinators=tuple(coordinators),
    )
    return pb.CoordinatorMessage(welcome=contract_pb.welcome_to_pb(welcome))


def desired_state_to_pb(state: DesiredState) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(desired_state=contract_pb.desired_state_to_pb(state))


def command_to_pb(kind: CommandKind, reason: str, model: str = "") -> pb.CoordinatorMessage:
    command = Command(kind=kind, reason=reason, model=model)
    return pb.CoordinatorMessage(command=contract_pb.command_to_pb(command))


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
    name, at, pinned = message.model.partition("@")
    version = message.version if message.HasField("version") else None
    if at:
        if not name or not pinned or (version is not None and version != pinned):
            raise ProtocolError(
                f"RouteRequest.model {message.model[:80]!r} must be name or name@version "
                "(agreeing with RouteRequest.version)"
            )
        version = pinned
    return RouteQuery(
        model=name,
        version=version,
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
        response.overflow.CopyFrom(contract_pb.overflow_target_to_pb(decision.overflow))
    return response
