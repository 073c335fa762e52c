"""The shared contract: one dataclass per proto message, conversion both ways, and the load
report from the agent's sampler through protobuf to the coordinator's route score."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.agent_state import AgentState
from agent.engine.interface import EngineLoad
from agent.load_sampler import LoadSampler
from agent.metrics import AgentMetrics
from coordinator.fleet.registry import LiveFleetRegistry
from coordinator.routing.scorer import UNKNOWN_RATE_WAIT_MS, RouteQuery, RouteScorer
from coordinator.rpc import convert as proto_convert
from coordinator.store.sqlite import SQLiteFleetStore
from edgefleet import contract, contract_pb
from edgefleet.contract import (
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

REPO_ROOT = Path(__file__).resolve().parents[2]

# Contract dataclass -> the proto message it mirrors.
MIRRORS: dict[type, Any] = {
    contract.Location: pb.Location,
    contract.Hardware: pb.Hardware,
    contract.LoadedModel: pb.LoadedModel,
    contract.OverflowTarget: pb.OverflowTarget,
    contract.Hello: pb.Hello,
    contract.SectionGenerations: pb.SectionGenerations,
    contract.LoadReport: pb.LoadReport,
    contract.Bye: pb.Bye,
    contract.Welcome: pb.Welcome,
    contract.ModelTarget: pb.ModelTarget,
    contract.ModelsSection: pb.ModelsSection,
    contract.OverflowTargetsSection: pb.OverflowTargetsSection,
    contract.KeysSection: pb.KeysSection,
    contract.ConfigSection: pb.ConfigSection,
    contract.DesiredState: pb.DesiredState,
    contract.Command: pb.Command,
    contract.ApiKey: pb.ApiKey,
    contract.KeyUsage: pb.KeyUsage,
    contract.RenewCertificate: pb.RenewCertificate,
    contract.CertificateIssued: pb.CertificateIssued,
    contract.RequestRecords: pb.RequestRecords,
    contract.RecordsAck: pb.RecordsAck,
    contract.ModelInventory: pb.ModelInventory,
    contract.SelfCheckResult: pb.SelfCheckResult,
    contract.Histogram: pb.Histogram,
    contract.ModelStats: pb.ModelStats,
    contract.OverflowEndpoint: pb.OverflowEndpoint,
    contract.OverflowUsage: pb.OverflowUsage,
}


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(cls._fields)  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", list(MIRRORS), ids=lambda c: c.__name__)
def test_each_contract_type_has_the_name_and_fields_of_its_proto_message(cls: type) -> None:
    message = MIRRORS[cls]
    assert cls.__name__ == message.DESCRIPTOR.name
    assert _fields(cls) == {f.name for f in message.DESCRIPTOR.fields}


def test_enums_mirror_the_proto_enums() -> None:
    assert len(OverflowKind) == len(pb.OverflowKind.keys())
    assert len(contract.OverflowApi) == len(pb.OverflowApi.keys())
    assert len(CommandKind) == len(pb.Command.Kind.keys())
    assert len(contract.ModelInventoryState) == len(pb.ModelInventory.State.keys())


def test_removed_fields_are_reserved_not_sent() -> None:
    proto = (REPO_ROOT / "protos" / "edgefleet" / "v1" / "fleet.proto").read_text()
    assert 'reserved "timestamp", "queue_depth", "overflow_requests_total";' in proto
    for gone in ("timestamp", "queue_depth", "overflow_requests_total"):
        assert gone not in pb.LoadReport.DESCRIPTOR.fields_by_name
    assert "accelerators" not in pb.Hardware.DESCRIPTOR.fields_by_name


def test_the_contract_module_needs_only_the_standard_library() -> None:
    code = (
        "import sys, edgefleet.contract; "
        "print(sorted(m for m in sys.modules if m.startswith(('google', 'grpc', 'edgefleet.v1'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


HELLO = Hello(
    agent_id="edge-1",
    site="lab",
    http_url="http://10.0.0.7:8000",
    agent_version="1.2.3",
    location=Location(52.5, 13.4),
    hardware=Hardware(cpu_count=8, memory_bytes=16 << 30, execution_providers=("CPU",)),
    models=(LoadedModel("tiny-llama", "int8-abc", "text-generation", "int8"),),
    token="secret",
)
STATE = DesiredState(
    version=7,
    models=ModelsSection(
        3,
        (
            ModelTarget(
                "m",
                "v2",
                "https://c:8443/v1/blobs",
                "ab" * 32,
                b'{"name": "m"}',
                b"\x07" * 64,
                ("https://peer:8000/v1/blobs",),
                "ro_1",
                contract.Residency.PINNED,
            ),
        ),
    ),
    overflow_targets=OverflowTargetsSection(
        2,
        (
            OverflowTarget("gpu", OverflowKind.GPU_POOL, "http://gpu/v1", ("m",)),
            OverflowTarget(
                "claude",
                OverflowKind.HOSTED_PROVIDER,
                "https://api.anthropic.example",
                ("m",),
                contract.OverflowApi.ANTHROPIC,
                (
                    contract.OverflowEndpoint("https://a.example/v1", 2.0, 8),
                    contract.OverflowEndpoint("https://b.example/v1"),
                ),
                "ANTHROPIC_API_KEY",
                "/run/secrets/anthropic",
                0.25,
                1.25,
                True,
                True,
                {"m": "claude-haiku"},
                "lab",
                3,
                500,
                10_000,
                60_000,
            ),
        ),
    ),
    keys=KeysSection(
        1,
        (
            contract.ApiKey(
                "key_1",
                b"\x01" * 32,
                ("m", "m@v2"),
                True,
                "high",
                512,
                60.0,
                9000.0,
                1_900_000_000,
                "app",
                600.0,
                True,
                contract.KeyPolicy(
                    contract.ModerationPolicy(
                        (
                            contract.ModerationRule(
                                "harassment",
                                contract.ModerationDirection.INPUT,
                                contract.ModerationAction.BLOCK,
                            ),
                            contract.ModerationRule(
                                "violence",
                                contract.ModerationDirection.OUTPUT,
                                contract.ModerationAction.OFF,
                                0.4,
                            ),
                        ),
                        contract.ModerationStreamMode.UNBUFFERED,
                    ),
                    semantic_cache=True,
                ),
            ),
        ),
    ),
    config=ConfigSection(4, {"engine.max_batch_size": "8"}),
)


@pytest.mark.parametrize(
    ("value", "to_pb", "from_pb", "message"),
    [
        (HELLO, contract_pb.hello_to_pb, contract_pb.hello_from_pb, pb.Hello),
        (
            dataclasses.replace(HELLO, location=None),
            contract_pb.hello_to_pb,
            contract_pb.hello_from_pb,
            pb.Hello,
        ),
        (
            LoadReport(
                3,
                5,
                41.5,
                0.25,
                900,
                1 << 30,
                10,
                2,
                True,
                "sick",
                SectionGenerations(1, 2),
                (contract.KeyUsage("key_1", 4, 100, 50, 1),),
                (
                    contract.ModelInventory(
                        "m",
                        "v2",
                        contract.ModelInventoryState.CHECKING,
                        10,
                        20,
                        "",
                        contract.SelfCheckResult(True, 13.1, 1.01, 14, 20, 2.5, ""),
                        5,
                        15,
                        123 << 20,
                    ),
                    contract.ModelInventory("m", "v1", contract.ModelInventoryState.LOADED),
                ),
                (
                    contract.ModelStats(
                        "m", "v2", 9, 1, 300, 90, contract.Histogram((0.1, 1.0), (4, 3, 2), 3.5)
                    ),
                ),
                (("EMAIL", 3), ("PERSON", 1)),
                (contract.OverflowUsage("claude", 4, 1, 400, 200, 0.35),),
                (("m2", 0.75), ("qwen", 2.5)),
                2 << 30,
                700 << 20,
                "moderation/all-minilm-l6-v2@fp32-ddf7336dbb12",
                (("harassment:flag", 2), ("illicit:block", 1)),
                (("", 1), ("key_1", 2)),
                (("hit", 3), ("ineligible", 1), ("miss", 7), ("refused", 2)),
            ),
            contract_pb.load_report_to_pb,
            contract_pb.load_report_from_pb,
            pb.LoadReport,
        ),
        (
            STATE,
            contract_pb.desired_state_to_pb,
            contract_pb.desired_state_from_pb,
            pb.DesiredState,
        ),
        (
            DesiredState(version=1, config=ConfigSection(1)),
            contract_pb.desired_state_to_pb,
            contract_pb.desired_state_from_pb,
            pb.DesiredState,
        ),
        (
            Welcome("s-1", 2000, model_signing_key=b"\x01" * 32),
            contract_pb.welcome_to_pb,
            contract_pb.welcome_from_pb,
            pb.Welcome,
        ),
        (Welcome("s-1", 2000), contract_pb.welcome_to_pb, contract_pb.welcome_from_pb, pb.Welcome),
        (
            Welcome("s-1", 2000, coordinators=("10.0.0.1:50051", "[fd00::2]:50051")),
            contract_pb.welcome_to_pb,
            contract_pb.welcome_from_pb,
            pb.Welcome,
        ),
        (
            contract.RenewCertificate("-----BEGIN CERTIFICATE REQUEST-----"),
            contract_pb.renew_certificate_to_pb,
            contract_pb.renew_certificate_from_pb,
            pb.RenewCertificate,
        ),
        (
            contract.CertificateIssued("cert", "ca", 1_900_000_000),
            contract_pb.certificate_issued_to_pb,
            contract_pb.certificate_issued_from_pb,
            pb.CertificateIssued,
        ),
        (
            contract.RequestRecords(7, b"\x91\x80", 3),
            contract_pb.request_records_to_pb,
            contract_pb.request_records_from_pb,
            pb.RequestRecords,
        ),
        (
            contract.RecordsAck(9),
            contract_pb.records_ack_to_pb,
            contract_pb.records_ack_from_pb,
            pb.RecordsAck,
        ),
        (
            Command(CommandKind.DRAIN, "maintenance"),
            contract_pb.command_to_pb,
            contract_pb.command_from_pb,
            pb.Command,
        ),
        (
            Command(CommandKind.UNLOAD_MODEL, "by an operator", model="smollm2-135m-instruct"),
            contract_pb.command_to_pb,
            contract_pb.command_from_pb,
            pb.Command,
        ),
    ],
)
def test_every_message_survives_the_wire(
    value: Any, to_pb: Any, from_pb: Any, message: Any
) -> None:
    assert from_pb(message.FromString(to_pb(value).SerializeToString())) == value


def test_an_unknown_place_stays_unknown_on_the_wire() -> None:
    wire = contract_pb.hello_to_pb(dataclasses.replace(HELLO, location=None))
    assert not wire.HasField("location")


def test_newer_sections_replace_older_ones_and_older_ones_are_ignored() -> None:
    held, changed = DesiredState().merged(STATE)
    assert held == STATE and changed == ("models", "overflow_targets", "keys", "config")
    stale = DesiredState(version=8, config=ConfigSection(4, {"engine.max_batch_size": "1"}))
    newer = DesiredState(version=9, keys=KeysSection(2))
    held2, changed = held.merged(stale)
    assert changed == () and held2.config == STATE.config
    held3, changed = held2.merged(newer)
    assert changed == ("keys",) and held3.generations() == SectionGenerations(3, 2, 2, 4)
    assert held3.version == 9


class _EnginesWithKnownLoad:
    """What LoadSampler asks a model registry for: the engines' load, and which models'
    weights are in memory (its residency; None: all of them)."""

    def __init__(self, load: EngineLoad, residency: object = None) -> None:
        self._load = load
        self.residency = residency

    def load(self) -> EngineLoad:
        return self._load


async def test_load_from_the_agents_sampler_to_the_coordinators_route_score(
    tmp_path: Path,
) -> None:
    # Agent side: an engine with 4 running and 40 waiting sequences.
    busy = EngineLoad(running=4, waiting=40, kv_used_tokens=900, kv_used_fraction=0.3)
    idle = EngineLoad(running=1, waiting=0, kv_used_tokens=10, kv_used_fraction=0.01)
    store = SQLiteFleetStore(tmp_path / "fleet.db")
    await store.open()
    registry = await LiveFleetRegistry.open(store)
    for agent_id, load in (("busy", busy), ("idle", idle)):
        sampler = LoadSampler(_EnginesWithKnownLoad(load), AgentMetrics(), AgentState())  # type: ignore[arg-type]
        wire = contract_pb.load_report_to_pb(sampler()).SerializeToString()
        # Coordinator side: validate, record, route.
        hello = dataclasses.replace(HELLO, agent_id=agent_id, location=None)
        session_id = registry.open_session(hello)
        registry.record_report(
            agent_id, session_id, proto_convert.load_report_from_pb(pb.LoadReport.FromString(wire))
        )
    recorded = registry.get("busy").last_report
    assert recorded is not None
    assert (recorded.running_sequences, recorded.waiting_sequences) == (4, 40)
    assert recorded.kv_cache_used_fraction == 0.3

    decision = RouteScorer().rank(registry.agents(), RouteQuery("tiny-llama"))
    by_id = {a.agent_id: a for a in decision.agents}
    # 40 waiting is under the saturation limit of 64 (counted twice it was 80: saturated).
    assert set(by_id) == {"busy", "idle"}
    # No rate measured yet: 1 s per waiting sequence; the running ones do not delay a start.
    assert by_id["busy"].predicted_wait_ms == 40 * UNKNOWN_RATE_WAIT_MS
    assert by_id["idle"].predicted_wait_ms == 0.0
    # Load = running + waiting: 44 vs 1, min-max normalized.
    assert (by_id["busy"].score_parts["queue"], by_id["idle"].score_parts["queue"]) == (0.0, 1.0)
    assert by_id["busy"].score_parts["kv"] == pytest.approx(0.7)
    assert [a.agent_id for a in decision.agents] == ["idle", "busy"]
    await registry.flush()
    await store.close()


async def test_a_cold_model_on_the_agent_is_waited_for_in_the_coordinators_route(
    tmp_path: Path,
) -> None:
    """An agent that loads models on demand says which are not in memory and how long
    their load takes; the route counts it in the predicted wait and ranks a warm agent
    first; the budget travels too."""
    from agent.engine.residency import Residency, ResidencyConfig

    store = SQLiteFleetStore(tmp_path / "fleet.db")
    await store.open()
    registry = await LiveFleetRegistry.open(store)
    idle = EngineLoad(running=0, waiting=0, kv_used_tokens=0, kv_used_fraction=0.0)
    for agent_id, loaded in (("cold", False), ("warm", True)):
        residency = Residency(ResidencyConfig(budget_bytes=1 << 30))
        model: Any = _Heavy()
        residency.register(model, predicted_bytes=1 << 20, reserve_bytes=0, loaded=loaded)
        engines = _EnginesWithKnownLoad(idle, residency)
        sampler = LoadSampler(engines, AgentMetrics(), AgentState())  # type: ignore[arg-type]
        wire = contract_pb.load_report_to_pb(sampler()).SerializeToString()
        hello = dataclasses.replace(HELLO, agent_id=agent_id, location=None)
        session_id = registry.open_session(hello)
        registry.record_report(
            agent_id, session_id, proto_convert.load_report_from_pb(pb.LoadReport.FromString(wire))
        )
    cold = registry.get("cold").last_report
    assert cold is not None and cold.cold_models == (("tiny-llama", 5.0),)
    assert (cold.memory_budget_bytes, cold.memory_committed_bytes) == (1 << 30, 0)
    warm = registry.get("warm").last_report
    assert warm is not None and warm.cold_models == () and warm.memory_committed_bytes == 1 << 20
    decision = RouteScorer().rank(registry.agents(), RouteQuery("tiny-llama"))
    assert [a.agent_id for a in decision.agents] == ["warm", "cold"]
    assert decision.agents[1].predicted_wait_ms == 5000.0  # no load measured yet: 5 s
    await registry.flush()
    await store.close()


class _Heavy:
    model_id, version = "tiny-llama", "v1"


def test_a_pushed_overflow_section_says_what_each_target_is_now() -> None:
    """desired_state_to_pb makes each target's message once per target object (the
    coordinator pushes the same objects to every agent at a site): a target replaced by one
    with other room or another URL is sent as it is now, never as the message kept for the
    one before it, and the kept message is never changed by being sent."""

    def section(*targets: contract.OverflowTarget) -> contract.DesiredState:
        return contract.DesiredState(version=1).with_section(
            contract.OverflowTargetsSection(3, targets)
        )

    def peer(name: str, free: int, url: str = "http://10.0.0.1:8000/v1") -> contract.OverflowTarget:
        return contract.OverflowTarget(
            name=name, kind=contract.OverflowKind.PEER, url=url,
            api=contract.OverflowApi.EDGEFLEET, site="s", free_slots=free,
        )  # fmt: skip

    a, b = peer("a", 16), peer("b", 4)
    first = contract_pb.desired_state_to_pb(section(a, b))
    again = contract_pb.desired_state_to_pb(section(a, b))
    assert first == again
    assert contract_pb.desired_state_from_pb(
        first
    ).overflow_targets == contract.OverflowTargetsSection(3, (a, b))
    # b's room changed (a new object, as the distributor makes one), a moved
    fuller, moved = peer("b", 0), peer("a", 16, "http://10.0.0.2:8000/v1")
    now = contract_pb.desired_state_from_pb(contract_pb.desired_state_to_pb(section(moved, fuller)))
    assert now.overflow_targets == contract.OverflowTargetsSection(3, (moved, fuller))
    # the message sent first is intact (the section copied the kept messages)
    first.overflow_targets.targets[0].free_slots = 99
    later = contract_pb.desired_state_to_pb(section(a, b))
    assert later.overflow_targets.targets[0].free_slots == 16


def test_model_residency_unset_or_unknown_reads_as_on_demand() -> None:
    """An older coordinator sends no residency, a newer one may send a value this agent
    does not know: both read as on demand, the agent's default."""
    message = contract_pb.model_target_to_pb(STATE.models.models[0])  # type: ignore[union-attr]
    assert message.residency == pb.ModelTarget.RESIDENCY_PINNED
    message.ClearField("residency")
    assert contract_pb.model_target_from_pb(message).residency is contract.Residency.ON_DEMAND
    raw = message.SerializeToString() + bytes([9 << 3, 42])  # field 9, varint 42
    again = pb.ModelTarget.FromString(raw)
    assert contract_pb.model_target_from_pb(again).residency is contract.Residency.ON_DEMAND
    assert contract_pb.model_target_to_pb(contract.ModelTarget("m", "v", "u", "s")).residency == (
        pb.ModelTarget.RESIDENCY_ON_DEMAND
    )


def test_key_policy_unset_or_unknown_values_keep_the_defaults() -> None:
    """An older coordinator sends no policy: the key has the default one (block
    sexual/minors, flag the rest, buffered). A newer one's unknown action or direction
    drops that rule only, and an unknown stream mode reads as buffered."""
    key = STATE.keys.keys[0]  # type: ignore[union-attr]
    message = contract_pb.api_key_to_pb(key)
    assert len(message.policy.moderation.rules) == 2
    message.ClearField("policy")
    assert contract_pb.api_key_from_pb(message).policy == contract.KeyPolicy()
    message = contract_pb.api_key_to_pb(key)
    message.policy.moderation.rules[0].action = 42  # type: ignore[assignment]
    message.policy.moderation.stream_mode = 7  # type: ignore[assignment]
    again = contract_pb.api_key_from_pb(pb.ApiKey.FromString(message.SerializeToString()))
    assert [r.category for r in again.policy.moderation.rules] == ["violence"]
    assert again.policy.moderation.stream_mode is contract.ModerationStreamMode.BUFFERED
