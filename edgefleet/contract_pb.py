"""Conversion between ``edgefleet.contract`` dataclasses and the generated protobuf messages.

One function pair per message, used by both processes. These convert faithfully and
check nothing: the coordinator validates what agents send (``coordinator.proto_convert``)
before converting with these.
"""

from __future__ import annotations

from edgefleet.contract import (
    Bye,
    Command,
    CommandKind,
    ConfigSection,
    DesiredState,
    Hardware,
    Hello,
    KeysSection,
    LoadedModel,
    LoadReport,
    Location,
    ModelsSection,
    ModelTarget,
    OverflowKind,
    OverflowTarget,
    OverflowTargetsSection,
    SectionGenerations,
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
_COMMAND_KIND_TO_PB = {
    CommandKind.UNSPECIFIED: pb.Command.KIND_UNSPECIFIED,
    CommandKind.DRAIN: pb.Command.KIND_DRAIN,
    CommandKind.RELOAD: pb.Command.KIND_RELOAD,
    CommandKind.RESUME: pb.Command.KIND_RESUME,
}
_COMMAND_KIND_FROM_PB = {v: k for k, v in _COMMAND_KIND_TO_PB.items()}


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
    )


def overflow_target_from_pb(message: pb.OverflowTarget) -> OverflowTarget:
    return OverflowTarget(
        name=message.name,
        # A kind from a newer contract is "unspecified" to us.
        kind=_OVERFLOW_KIND_FROM_PB.get(message.kind, OverflowKind.UNSPECIFIED),
        url=message.url,
        models=tuple(message.models),
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
    )


def load_report_from_pb(message: pb.LoadReport) -> LoadReport:
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
    )


def welcome_from_pb(message: pb.Welcome) -> Welcome:
    return Welcome(
        session_id=message.session_id,
        report_interval_ms=message.report_interval_ms,
        contract_minor=message.contract_minor,
    )


def model_target_to_pb(target: ModelTarget) -> pb.ModelTarget:
    return pb.ModelTarget(
        name=target.name,
        version=target.version,
        artifact_url=target.artifact_url,
        sha256=target.sha256,
    )


def model_target_from_pb(message: pb.ModelTarget) -> ModelTarget:
    return ModelTarget(
        name=message.name,
        version=message.version,
        artifact_url=message.artifact_url,
        sha256=message.sha256,
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
                targets=[overflow_target_to_pb(t) for t in state.overflow_targets.targets],
            )
        )
    if state.keys is not None:
        message.keys.CopyFrom(pb.KeysSection(generation=state.keys.generation))
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
        keys = KeysSection(generation=message.keys.generation)
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
    return pb.Command(kind=_COMMAND_KIND_TO_PB[command.kind], reason=command.reason)


def command_from_pb(message: pb.Command) -> Command:
    # A kind from a newer contract is "unspecified" to us.
    kind = _COMMAND_KIND_FROM_PB.get(message.kind, CommandKind.UNSPECIFIED)
    return Command(kind=kind, reason=message.reason)
