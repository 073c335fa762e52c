"""Conversion between ``edgefleet.contract`` dataclasses and the generated protobuf messages.

One function pair per message, used by both processes. These convert faithfully and
check nothing: the coordinator validates what agents send (``coordinator.rpc.convert``)
before converting with these.
"""

from __future__ import annotations

from edgefleet.contract import (
    ApiKey,
    Bye,
    CertificateIssued,
    Command,
    CommandKind,
    ConfigSection,
    DesiredState,
    Hardware,
    Hello,
    Histogram,
    KeyPolicy,
    KeysSection,
    KeyUsage,
    LoadedModel,
    LoadReport,
    Location,
    ModelInventory,
    ModelInventoryState,
    ModelsSection,
    ModelStats,
    ModelTarget,
    ModerationAction,
    ModerationDirection,
    ModerationPolicy,
    ModerationRule,
    ModerationStreamMode,
    OverflowApi,
    OverflowEndpoint,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
    OverflowUsage,
    RecordsAck,
    RenewCertificate,
    RequestRecords,
    Residency,
    SectionGenerations,
    SelfCheckResult,
    Welcome,
)
from edgefleet.v1 import fleet_pb2 as pb

_OVERFLOW_KIND_TO_PB = {
    OverflowKind.UNSPECIFIED: pb.OVERFLOW_KIND_UNSPECIFIED,
    OverflowKind.PEER: pb.OVERFLOW_KIND_PEER,
    OverflowKind.GPU_POOL: pb.OVERFLOW_KIND_GPU_POOL,
    OverflowKind.HOSTED_PROVIDER: pb.OVERFLOW_KIND_HOSTED_PROVIDER,
}
_OVERFLOW_KIND_FROM_PB = {v: k for k, v in _OVERFLOW_KIND_TO_PB.items()}
_OVERFLOW_API_TO_PB = {
    OverflowApi.UNSPECIFIED: pb.OVERFLOW_API_UNSPECIFIED,
    OverflowApi.OPENAI: pb.OVERFLOW_API_OPENAI,
    OverflowApi.ANTHROPIC: pb.OVERFLOW_API_ANTHROPIC,
    OverflowApi.EDGEFLEET: pb.OVERFLOW_API_EDGEFLEET,
}
_OVERFLOW_API_FROM_PB = {v: k for k, v in _OVERFLOW_API_TO_PB.items()}
_COMMAND_KIND_TO_PB = {
    CommandKind.UNSPECIFIED: pb.Command.KIND_UNSPECIFIED,
    CommandKind.DRAIN: pb.Command.KIND_DRAIN,
    CommandKind.RELOAD: pb.Command.KIND_RELOAD,
    CommandKind.RESUME: pb.Command.KIND_RESUME,
    CommandKind.LOAD_MODEL: pb.Command.KIND_LOAD_MODEL,
    CommandKind.UNLOAD_MODEL: pb.Command.KIND_UNLOAD_MODEL,
}
_COMMAND_KIND_FROM_PB = {v: k for k, v in _COMMAND_KIND_TO_PB.items()}
_RESIDENCY_TO_PB = {
    Residency.ON_DEMAND: pb.ModelTarget.RESIDENCY_ON_DEMAND,
    Residency.PINNED: pb.ModelTarget.RESIDENCY_PINNED,
    Residency.STORE_ONLY: pb.ModelTarget.RESIDENCY_STORE_ONLY,
}
# Unset (an older coordinator) and values from a newer one read as on demand.
_RESIDENCY_FROM_PB = {v: k for k, v in _RESIDENCY_TO_PB.items()}
_MP = pb.ModerationPolicy
_DIRECTION_TO_PB = {
    ModerationDirection.INPUT: _MP.DIRECTION_INPUT,
    ModerationDirection.OUTPUT: _MP.DIRECTION_OUTPUT,
}
_DIRECTION_FROM_PB = {v: k for k, v in _DIRECTION_TO_PB.items()}
_ACTION_TO_PB = {
    ModerationAction.BLOCK: _MP.ACTION_BLOCK,
    ModerationAction.FLAG: _MP.ACTION_FLAG,
    ModerationAction.OFF: _MP.ACTION_OFF,
}
_ACTION_FROM_PB = {v: k for k, v in _ACTION_TO_PB.items()}
_STREAM_MODE_TO_PB = {
    ModerationStreamMode.BUFFERED: _MP.STREAM_MODE_BUFFERED,
    ModerationStreamMode.UNBUFFERED: _MP.STREAM_MODE_UNBUFFERED,
}
# Unset and values from a newer coordinator read as buffered (the safer mode).
_STREAM_MODE_FROM_PB = {v: k for k, v in _STREAM_MODE_TO_PB.items()}


# ------------------------------------------------------------------ shared types


def location_to_pb(location: Location) -> pb.Location:
    return pb.Location(lat=location.lat, lon=location.lon)


def location_from_pb(message: pb.Location) -> Location:
    return Location(lat=message.lat, lon=message.lon)


def hardware_to_pb(hardware: Hardware) -> pb.Hardware:
    return pb.Hardware(
        cpu_count=hardware.cpu_count,
        memory_bytes=hardware.memory_bytes,
        execution_providers=list(hardware.execution_providers),
    )


def hardware_from_pb(message: pb.Hardware) -> Hardware:
    return Hardware(
        cpu_count=message.cpu_count,
        memory_bytes=message.memory_bytes,
        execution_providers=tuple(message.execution_providers),
    )


def loaded_model_to_pb(model: LoadedModel) -> pb.LoadedModel:
    return pb.LoadedModel(
        name=model.name, version=model.version, task=model.task, variant=model.variant
    )


def loaded_model_from_pb(message: pb.LoadedModel) -> LoadedModel:
    return LoadedModel(
        name=message.name, version=message.version, task=message.task, variant=message.variant
    )


def overflow_target_to_pb(target: OverflowTarget) -> pb.OverflowTarget:
    return pb.OverflowTarget(
        name=target.name,
        kind=_OVERFLOW_KIND_TO_PB[target.kind],
        url=target.url,
        models=list(target.models),
        api=_OVERFLOW_API_TO_PB[target.api],
        endpoints=[
            pb.OverflowEndpoint(url=e.url, weight=e.weight, capacity=e.capacity)
            for e in target.endpoints
        ],
        credential_env=target.credential_env,
        credential_file=target.credential_file,
        prompt_price_per_1k=target.prompt_price_per_1k,
        completion_price_per_1k=target.completion_price_per_1k,
        supports_continuation=target.supports_continuation,
        supports_constraints=target.supports_constraints,
        model_names=dict(target.model_names),
        site=target.site,
        free_slots=target.free_slots,
        connect_timeout_ms=target.connect_timeout_ms,
        first_token_timeout_ms=target.first_token_timeout_ms,
        total_timeout_ms=target.total_timeout_ms,
    )


# Each target's message, by the target object's identity (the object kept with it, so the
# id is not reused while cached): the coordinator's overflow distributor hands the same
# target objects to every agent at a site, interval after interval, and building a message
# from a target's twenty fields was most of a push's cost. Bounded: cleared when full.
_OVERFLOW_MESSAGES: dict[int, tuple[OverflowTarget, pb.OverflowTarget]] = {}
_OVERFLOW_MESSAGES_MAX = 20_000


def _overflow_message(target: OverflowTarget) -> pb.OverflowTarget:
    """``overflow_target_to_pb(target)``, made once per target object (never mutated:
    the section's repeated field copies it)."""
    kept = _OVERFLOW_MESSAGES.get(id(target))
    if kept is not None and kept[0] is target:
        return kept[1]
    message = overflow_target_to_pb(target)
    if len(_OVERFLOW_MESSAGES) >= _OVERFLOW_MESSAGES_MAX:
        _OVERFLOW_MESSAGES.clear()
    _OVERFLOW_MESSAGES[id(target)] = (target, message)
    return message


def overflow_target_from_pb(message: pb.OverflowTarget) -> OverflowTarget:
    return OverflowTarget(
        name=message.name,
        # A kind from a newer contract is "unspecified" to us.
        kind=_OVERFLOW_KIND_FROM_PB.get(message.kind, OverflowKind.UNSPECIFIED),
        url=message.url,
        models=tuple(message.models),
        api=_OVERFLOW_API_FROM_PB.get(message.api, OverflowApi.UNSPECIFIED),
        endpoints=tuple(OverflowEndpoint(e.url, e.weight, e.capacity) for e in message.endpoints),
        credential_env=message.credential_env,
        credential_file=message.credential_file,
        prompt_price_per_1k=message.prompt_price_per_1k,
        completion_price_per_1k=message.completion_price_per_1k,
        supports_continuation=message.supports_continuation,
        supports_constraints=message.supports_constraints,
        model_names=dict(message.model_names),
        site=message.site,
        free_slots=message.free_slots,
        connect_timeout_ms=message.connect_timeout_ms,
        first_token_timeout_ms=message.first_token_timeout_ms,
        total_timeout_ms=message.total_timeout_ms,
    )


def overflow_usage_to_pb(usage: OverflowUsage) -> pb.OverflowUsage:
    return pb.OverflowUsage(
        target=usage.target,
        requests=usage.requests,
        failed=usage.failed,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost=usage.cost,
    )


def overflow_usage_from_pb(message: pb.OverflowUsage) -> OverflowUsage:
    return OverflowUsage(
        target=message.target,
        requests=message.requests,
        failed=message.failed,
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.completion_tokens,
        cost=message.cost,
    )


# ------------------------------------------------------------------ agent -> coordinator


def hello_to_pb(hello: Hello) -> pb.Hello:
    message = pb.Hello(
        agent_id=hello.agent_id,
        token=hello.token,
        agent_version=hello.agent_version,
        site=hello.site,
        hardware=hardware_to_pb(hello.hardware),
        http_url=hello.http_url,
        models=[loaded_model_to_pb(m) for m in hello.models],
        contract_minor=hello.contract_minor,
    )
    if hello.location is not None:
        message.location.CopyFrom(location_to_pb(hello.location))
    return message


def hello_from_pb(message: pb.Hello) -> Hello:
    return Hello(
        agent_id=message.agent_id,
        site=message.site,
        http_url=message.http_url,
        agent_version=message.agent_version,
        location=location_from_pb(message.location) if message.HasField("location") else None,
        hardware=hardware_from_pb(message.hardware),
        models=tuple(loaded_model_from_pb(m) for m in message.models),
        token=message.token,
        contract_minor=message.contract_minor,
    )


def section_generations_to_pb(generations: SectionGenerations) -> pb.SectionGenerations:
    return pb.SectionGenerations(
        models=generations.models,
        overflow_targets=generations.overflow_targets,
        keys=generations.keys,
        config=generations.config,
    )


def section_generations_from_pb(message: pb.SectionGenerations) -> SectionGenerations:
    return SectionGenerations(
        models=message.models,
        overflow_targets=message.overflow_targets,
        keys=message.keys,
        config=message.config,
    )


def load_report_to_pb(report: LoadReport) -> pb.LoadReport:
    return pb.LoadReport(
        running_sequences=report.running_sequences,
        waiting_sequences=report.waiting_sequences,
        tokens_per_second=report.tokens_per_second,
        kv_cache_used_fraction=report.kv_cache_used_fraction,
        kv_cache_used_tokens=report.kv_cache_used_tokens,
        free_memory_bytes=report.free_memory_bytes,
        requests_total=report.requests_total,
        requests_failed_total=report.requests_failed_total,
        draining=report.draining,
        unhealthy_reason=report.unhealthy_reason,
        applied=section_generations_to_pb(report.applied),
        key_usage=[key_usage_to_pb(u) for u in report.key_usage],
        inventory=[model_inventory_to_pb(m) for m in report.inventory],
        model_stats=[model_stats_to_pb(m) for m in report.model_stats],
        redactions=dict(report.redactions),
        overflow_usage=[overflow_usage_to_pb(u) for u in report.overflow_usage],
        cold_models=dict(report.cold_models),
        memory_budget_bytes=report.memory_budget_bytes,
        memory_committed_bytes=report.memory_committed_bytes,
        moderation_heads=report.moderation_heads,
        moderation_flags=dict(report.moderation_flags),
        moderation_flags_by_key=dict(report.moderation_flags_by_key),
        semantic_cache_lookups=dict(report.semantic_cache_lookups),
    )


def load_report_from_pb(message: pb.LoadReport) -> LoadReport:
    # A coordinator converts thousands of reports a second, their lists mostly empty:
    # an empty one costs no generator.
    key_usage, inventory, model_stats = message.key_usage, message.inventory, message.model_stats
    redactions, overflow_usage = message.redactions, message.overflow_usage
    cold = message.cold_models
    flags, by_key = message.moderation_flags, message.moderation_flags_by_key
    return LoadReport(
        running_sequences=message.running_sequences,
        waiting_sequences=message.waiting_sequences,
        tokens_per_second=message.tokens_per_second,
        kv_cache_used_fraction=message.kv_cache_used_fraction,
        kv_cache_used_tokens=message.kv_cache_used_tokens,
        free_memory_bytes=message.free_memory_bytes,
        requests_total=message.requests_total,
        requests_failed_total=message.requests_failed_total,
        draining=message.draining,
        unhealthy_reason=message.unhealthy_reason,
        applied=section_generations_from_pb(message.applied),
        key_usage=tuple([key_usage_from_pb(u) for u in key_usage]) if key_usage else (),
        inventory=tuple([model_inventory_from_pb(m) for m in inventory]) if inventory else (),
        model_stats=tuple([model_stats_from_pb(m) for m in model_stats]) if model_stats else (),
        redactions=tuple(sorted(redactions.items())) if redactions else (),
        overflow_usage=(
            tuple([overflow_usage_from_pb(u) for u in overflow_usage]) if overflow_usage else ()
        ),
        cold_models=tuple(sorted(cold.items())) if cold else (),
        memory_budget_bytes=message.memory_budget_bytes,
        memory_committed_bytes=message.memory_committed_bytes,
        moderation_heads=message.moderation_heads,
        moderation_flags=tuple(sorted(flags.items())) if flags else (),
        moderation_flags_by_key=tuple(sorted(by_key.items())) if by_key else (),
        semantic_cache_lookups=tuple(sorted(message.semantic_cache_lookups.items())),
    )


_INVENTORY_STATE_TO_PB = {
    ModelInventoryState.UNSPECIFIED: pb.ModelInventory.STATE_UNSPECIFIED,
    ModelInventoryState.DOWNLOADING: pb.ModelInventory.STATE_DOWNLOADING,
    ModelInventoryState.ON_DISK: pb.ModelInventory.STATE_ON_DISK,
    ModelInventoryState.LOADING: pb.ModelInventory.STATE_LOADING,
    ModelInventoryState.CHECKING: pb.ModelInventory.STATE_CHECKING,
    ModelInventoryState.LOADED: pb.ModelInventory.STATE_LOADED,
    ModelInventoryState.FAILED: pb.ModelInventory.STATE_FAILED,
}
_INVENTORY_STATE_FROM_PB = {v: k for k, v in _INVENTORY_STATE_TO_PB.items()}


def self_check_result_to_pb(result: SelfCheckResult) -> pb.SelfCheckResult:
    return pb.SelfCheckResult(
        passed=result.passed,
        perplexity=result.perplexity,
        perplexity_ratio=result.perplexity_ratio,
        greedy_matched=result.greedy_matched,
        greedy_total=result.greedy_total,
        seconds=result.seconds,
        detail=result.detail,
    )


def self_check_result_from_pb(message: pb.SelfCheckResult) -> SelfCheckResult:
    return SelfCheckResult(
        passed=message.passed,
        perplexity=message.perplexity,
        perplexity_ratio=message.perplexity_ratio,
        greedy_matched=message.greedy_matched,
        greedy_total=message.greedy_total,
        seconds=message.seconds,
        detail=message.detail,
    )


def model_inventory_to_pb(item: ModelInventory) -> pb.ModelInventory:
    message = pb.ModelInventory(
        name=item.name,
        version=item.version,
        state=_INVENTORY_STATE_TO_PB[item.state],
        bytes_done=item.bytes_done,
        bytes_total=item.bytes_total,
        last_error=item.last_error,
        bytes_from_peers=item.bytes_from_peers,
        bytes_from_coordinator=item.bytes_from_coordinator,
        resident_bytes=item.resident_bytes,
    )
    if item.self_check is not None:
        message.self_check.CopyFrom(self_check_result_to_pb(item.self_check))
    return message


def model_inventory_from_pb(message: pb.ModelInventory) -> ModelInventory:
    return ModelInventory(
        name=message.name,
        version=message.version,
        # An unknown (newer) state reads as unspecified rather than failing the report.
        state=_INVENTORY_STATE_FROM_PB.get(message.state, ModelInventoryState.UNSPECIFIED),
        bytes_done=message.bytes_done,
        bytes_total=message.bytes_total,
        last_error=message.last_error,
        self_check=(
            self_check_result_from_pb(message.self_check)
            if message.HasField("self_check")
            else None
        ),
        bytes_from_peers=message.bytes_from_peers,
        bytes_from_coordinator=message.bytes_from_coordinator,
        resident_bytes=message.resident_bytes,
    )


def histogram_to_pb(histogram: Histogram) -> pb.Histogram:
    return pb.Histogram(
        upper_bounds=list(histogram.upper_bounds), counts=list(histogram.counts), sum=histogram.sum
    )


def histogram_from_pb(message: pb.Histogram) -> Histogram:
    return Histogram(
        upper_bounds=tuple(message.upper_bounds), counts=tuple(message.counts), sum=message.sum
    )


def model_stats_to_pb(stats: ModelStats) -> pb.ModelStats:
    return pb.ModelStats(
        name=stats.name,
        version=stats.version,
        requests=stats.requests,
        failed=stats.failed,
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.completion_tokens,
        ttft_seconds=histogram_to_pb(stats.ttft_seconds),
    )


def model_stats_from_pb(message: pb.ModelStats) -> ModelStats:
    return ModelStats(
        name=message.name,
        version=message.version,
        requests=message.requests,
        failed=message.failed,
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.completion_tokens,
        ttft_seconds=histogram_from_pb(message.ttft_seconds),
    )


def key_usage_to_pb(usage: KeyUsage) -> pb.KeyUsage:
    return pb.KeyUsage(
        key_id=usage.key_id,
        requests=usage.requests,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        rejected=usage.rejected,
    )


def key_usage_from_pb(message: pb.KeyUsage) -> KeyUsage:
    return KeyUsage(
        key_id=message.key_id,
        requests=message.requests,
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.completion_tokens,
        rejected=message.rejected,
    )


def renew_certificate_to_pb(renew: RenewCertificate) -> pb.RenewCertificate:
    return pb.RenewCertificate(csr_pem=renew.csr_pem)


def renew_certificate_from_pb(message: pb.RenewCertificate) -> RenewCertificate:
    return RenewCertificate(csr_pem=message.csr_pem)


def request_records_to_pb(records: RequestRecords) -> pb.RequestRecords:
    return pb.RequestRecords(
        first_seq=records.first_seq,
        records_msgpack=records.records_msgpack,
        dropped=records.dropped,
    )


def request_records_from_pb(message: pb.RequestRecords) -> RequestRecords:
    return RequestRecords(
        first_seq=message.first_seq,
        records_msgpack=message.records_msgpack,
        dropped=message.dropped,
    )


def bye_to_pb(bye: Bye) -> pb.Bye:
    return pb.Bye(reason=bye.reason)


def bye_from_pb(message: pb.Bye) -> Bye:
    return Bye(reason=message.reason)


# ------------------------------------------------------------------ coordinator -> agent


def welcome_to_pb(welcome: Welcome) -> pb.Welcome:
    return pb.Welcome(
        session_id=welcome.session_id,
        report_interval_ms=welcome.report_interval_ms,
        contract_minor=welcome.contract_minor,
        model_signing_key=welcome.model_signing_key,
        coordinators=welcome.coordinators,
    )


def welcome_from_pb(message: pb.Welcome) -> Welcome:
    return Welcome(
        session_id=message.session_id,
        report_interval_ms=message.report_interval_ms,
        contract_minor=message.contract_minor,
        model_signing_key=message.model_signing_key,
        coordinators=tuple(message.coordinators),
    )


def certificate_issued_to_pb(issued: CertificateIssued) -> pb.CertificateIssued:
    return pb.CertificateIssued(
        client_cert_pem=issued.client_cert_pem,
        ca_cert_pem=issued.ca_cert_pem,
        not_after_unix=issued.not_after_unix,
    )


def certificate_issued_from_pb(message: pb.CertificateIssued) -> CertificateIssued:
    return CertificateIssued(
        client_cert_pem=message.client_cert_pem,
        ca_cert_pem=message.ca_cert_pem,
        not_after_unix=message.not_after_unix,
    )


def records_ack_to_pb(ack: RecordsAck) -> pb.RecordsAck:
    return pb.RecordsAck(through_seq=ack.through_seq)


def records_ack_from_pb(message: pb.RecordsAck) -> RecordsAck:
    return RecordsAck(through_seq=message.through_seq)


def api_key_to_pb(key: ApiKey) -> pb.ApiKey:
    return pb.ApiKey(
        key_id=key.key_id,
        secret_sha256=key.secret_sha256,
        models=list(key.models),
        allow_cloud=key.allow_cloud,
        max_priority=key.max_priority,
        max_tokens_per_request=key.max_tokens_per_request,
        requests_per_minute=key.requests_per_minute,
        tokens_per_minute=key.tokens_per_minute,
        expires_at_unix=key.expires_at_unix,
        name=key.name,
        max_keep_alive_s=key.max_keep_alive_s,
        may_pin_models=key.may_pin_models,
        policy=key_policy_to_pb(key.policy),
    )


def api_key_from_pb(message: pb.ApiKey) -> ApiKey:
    return ApiKey(
        key_id=message.key_id,
        secret_sha256=message.secret_sha256,
        models=tuple(message.models),
        allow_cloud=message.allow_cloud,
        max_priority=message.max_priority,
        max_tokens_per_request=message.max_tokens_per_request,
        requests_per_minute=message.requests_per_minute,
        tokens_per_minute=message.tokens_per_minute,
        expires_at_unix=message.expires_at_unix,
        name=message.name,
        max_keep_alive_s=message.max_keep_alive_s,
        may_pin_models=message.may_pin_models,
        policy=key_policy_from_pb(message.policy),
    )


def key_policy_to_pb(policy: KeyPolicy) -> pb.KeyPolicy:
    moderation = policy.moderation
    return pb.KeyPolicy(
        moderation=pb.ModerationPolicy(
            rules=[
                pb.ModerationPolicy.Rule(
                    category=r.category,
                    direction=_DIRECTION_TO_PB[r.direction],
                    action=_ACTION_TO_PB[r.action],
                    threshold=r.threshold,
                )
                for r in moderation.rules
            ],
            stream_mode=_STREAM_MODE_TO_PB[moderation.stream_mode],
        ),
        semantic_cache=policy.semantic_cache,
    )


def key_policy_from_pb(message: pb.KeyPolicy) -> KeyPolicy:
    """Rules with a direction or action this agent does not know (a newer coordinator's)
    are left out: the category keeps its default."""
    moderation = message.moderation
    rules = tuple(
        ModerationRule(
            category=r.category,
            direction=_DIRECTION_FROM_PB[r.direction],
            action=_ACTION_FROM_PB[r.action],
            threshold=r.threshold,
        )
        for r in moderation.rules
        if r.direction in _DIRECTION_FROM_PB and r.action in _ACTION_FROM_PB
    )
    mode = _STREAM_MODE_FROM_PB.get(moderation.stream_mode, ModerationStreamMode.BUFFERED)
    return KeyPolicy(
        moderation=ModerationPolicy(rules=rules, stream_mode=mode),
        semantic_cache=message.semantic_cache,
    )


def model_target_to_pb(target: ModelTarget) -> pb.ModelTarget:
    return pb.ModelTarget(
        name=target.name,
        version=target.version,
        artifact_url=target.artifact_url,
        sha256=target.sha256,
        manifest=target.manifest,
        signature=target.signature,
        peer_urls=list(target.peer_urls),
        rollout_id=target.rollout_id,
        residency=_RESIDENCY_TO_PB[target.residency],
    )


def model_target_from_pb(message: pb.ModelTarget) -> ModelTarget:
    return ModelTarget(
        name=message.name,
        version=message.version,
        artifact_url=message.artifact_url,
        sha256=message.sha256,
        manifest=message.manifest,
        signature=message.signature,
        peer_urls=tuple(message.peer_urls),
        rollout_id=message.rollout_id,
        residency=_RESIDENCY_FROM_PB.get(message.residency, Residency.ON_DEMAND),
    )


def desired_state_to_pb(state: DesiredState) -> pb.DesiredState:
    message = pb.DesiredState(version=state.version)
    if state.models is not None:
        message.models.CopyFrom(
            pb.ModelsSection(
                generation=state.models.generation,
                models=[model_target_to_pb(m) for m in state.models.models],
            )
        )
    if state.overflow_targets is not None:
        message.overflow_targets.CopyFrom(
            pb.OverflowTargetsSection(
                generation=state.overflow_targets.generation,
                targets=[_overflow_message(t) for t in state.overflow_targets.targets],
            )
        )
    if state.keys is not None:
        message.keys.CopyFrom(
            pb.KeysSection(
                generation=state.keys.generation,
                keys=[api_key_to_pb(k) for k in state.keys.keys],
            )
        )
    if state.config is not None:
        message.config.CopyFrom(
            pb.ConfigSection(generation=state.config.generation, values=dict(state.config.values))
        )
    return message


def desired_state_from_pb(message: pb.DesiredState) -> DesiredState:
    models = overflow = keys = config = None
    if message.HasField("models"):
        models = ModelsSection(
            generation=message.models.generation,
            models=tuple(model_target_from_pb(m) for m in message.models.models),
        )
    if message.HasField("overflow_targets"):
        overflow = OverflowTargetsSection(
            generation=message.overflow_targets.generation,
            targets=tuple(overflow_target_from_pb(t) for t in message.overflow_targets.targets),
        )
    if message.HasField("keys"):
        keys = KeysSection(
            generation=message.keys.generation,
            keys=tuple(api_key_from_pb(k) for k in message.keys.keys),
        )
    if message.HasField("config"):
        config = ConfigSection(
            generation=message.config.generation, values=dict(message.config.values)
        )
    return DesiredState(
        version=message.version,
        models=models,
        overflow_targets=overflow,
        keys=keys,
        config=config,
    )


def command_to_pb(command: Command) -> pb.Command:
    return pb.Command(
        kind=_COMMAND_KIND_TO_PB[command.kind], reason=command.reason, model=command.model
    )


def command_from_pb(message: pb.Command) -> Command:
    # A kind from a newer contract is "unspecified" to us.
    kind = _COMMAND_KIND_FROM_PB.get(message.kind, CommandKind.UNSPECIFIED)
    return Command(kind=kind, reason=message.reason, model=message.model)
