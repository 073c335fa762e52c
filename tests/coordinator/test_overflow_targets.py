"""The coordinator's overflow targets: the targets file (credentials by name only), peers
at the same site from the registry, pushed to agents in the desired state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.control import CoordinatorSession
from agent.overflow.service import OverflowService
from agent.overflow.wiring import desired_state_appliers
from agent.redaction import Redactor
from coordinator.api.app_keys import METRICS_KEY
from coordinator.routing.overflow import OverflowConfigError, coarse_slots, load_targets_file
from devtools.process import wait_until
from edgefleet.contract import (
    DesiredState,
    Hello,
    LoadedModel,
    LoadReport,
    OverflowApi,
    OverflowEndpoint,
    OverflowKind,
)
from tests.coordinator.coordinator_testing import MakeCoordinator

pytestmark = pytest.mark.timeout(60)

TARGETS = {
    "pools": [
        {
            "name": "gpu-pool",
            "endpoints": [
                {"url": "http://10.9.0.1:8000/v1", "weight": 3, "capacity": 16},
                {"url": "http://10.9.0.2:8000/v1/"},
            ],
            "credential_env": "GPU_POOL_KEY",
            "prompt_price_per_1k": 0.01,
            "completion_price_per_1k": 0.03,
            "supports_continuation": True,
        }
    ],
    "providers": [
        {
            "name": "claude",
            "api": "anthropic",
            "url": "https://api.anthropic.com/v1",
            "credential_file": "/run/secrets/anthropic",
            "model_names": {"m": "claude-haiku"},
            "models": ["m"],
        }
    ],
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "targets.json"
    path.write_text(json.dumps(data))
    return path


def test_the_targets_file_gives_pools_then_providers(tmp_path: Path) -> None:
    parsed = load_targets_file(write(tmp_path, TARGETS))
    pool, provider = parsed.cloud_targets()
    assert pool.kind is OverflowKind.GPU_POOL and pool.api is OverflowApi.OPENAI
    assert pool.endpoints == (
        OverflowEndpoint("http://10.9.0.1:8000/v1", 3.0, 16),
        OverflowEndpoint("http://10.9.0.2:8000/v1", 1.0, 0),
    )
    assert pool.credential_env == "GPU_POOL_KEY" and pool.completion_price_per_1k == 0.03
    assert provider.kind is OverflowKind.HOSTED_PROVIDER and provider.api is OverflowApi.ANTHROPIC
    assert provider.credential_file == "/run/secrets/anthropic"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("credential_env", "sk-live-9f8e7d6c5b4a"),  # a key pasted where a name goes
        ("credential_file", "sk-live-9f8e7d6c5b4a"),
    ],
)
def test_a_credential_value_is_refused_without_being_repeated(
    tmp_path: Path, field: str, value: str
) -> None:
    bad = json.loads(json.dumps(TARGETS))
    bad["pools"][0][field] = value
    with pytest.raises(OverflowConfigError) as caught:
        load_targets_file(write(tmp_path, bad))
    assert value not in str(caught.value) and field in str(caught.value)


def test_the_targets_file_refuses_unknown_fields_bad_urls_and_repeated_names(
    tmp_path: Path,
) -> None:
    for change, words in (
        ({"api_key": "x"}, "api_key"),
        ({"url": "ftp://x"}, "url"),
        ({"name": "gpu-pool"}, "repeat"),
    ):
        bad = json.loads(json.dumps(TARGETS))
        bad["providers"][0].update(change)
        with pytest.raises(OverflowConfigError, match=words):
            load_targets_file(write(tmp_path, bad))


def test_free_slots_are_sent_in_coarse_steps() -> None:
    assert [coarse_slots(n) for n in (-3, 0, 1, 3, 5, 9, 100)] == [0, 0, 1, 2, 4, 8, 16]


async def test_agents_get_their_site_peers_and_the_cloud_targets(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator(overflow_targets_file=str(write(tmp_path, TARGETS)))
    sessions = []
    held: dict[str, DesiredState] = {}

    def start(agent_id: str, site: str) -> CoordinatorSession:
        hello = Hello(
            agent_id=agent_id,
            site=site,
            http_url=f"http://10.0.0.{len(sessions) + 1}:8000",
            models=(LoadedModel("m", "v1"),),
        )
        session = CoordinatorSession(
            c.grpc_target,
            lambda: hello,
            LoadReport,
            on_desired_state=lambda d: held.__setitem__(agent_id, d),
            initial_backoff_s=0.05,
        )
        sessions.append(session)
        return session

    for agent_id, site in (("edge-1", "lab"), ("edge-2", "lab"), ("edge-3", "far")):
        await start(agent_id, site).start()
    # edge-4 is wired as the agent wires itself: its overflow service applies the section
    # and its load reports carry the service's overflow usage
    service = OverflowService(redactor=Redactor())
    service.book.add(
        {"overflow": [{"target": "gpu-pool", "prompt_tokens": 100, "completion_tokens": 50,
                       "failed": False, "cost": 0.0025}]}
    )  # fmt: skip
    hello4 = Hello(agent_id="edge-4", site="far", models=(LoadedModel("m", "v1"),))
    agent4 = CoordinatorSession(
        c.grpc_target,
        lambda: hello4,
        lambda: LoadReport(overflow_usage=service.book.take()),
        on_desired_state=desired_state_appliers(None, service),
        initial_backoff_s=0.05,
    )
    sessions.append(agent4)
    await agent4.start()
    try:

        def names(agent_id: str) -> list[str]:
            state = held.get(agent_id)
            if state is None or state.overflow_targets is None:
                return []
            return [t.name for t in state.overflow_targets.targets]

        await wait_until(lambda: names("edge-1") == ["edge-2", "gpu-pool", "claude"])
        await wait_until(lambda: names("edge-3") == ["gpu-pool", "claude"])
        state = held["edge-1"].overflow_targets
        assert state is not None
        peer = state.targets[0]
        assert peer.kind is OverflowKind.PEER and peer.site == "lab" and peer.free_slots > 0
        assert peer.url == "http://10.0.0.2:8000/v1" and peer.models == ("m",)
        pushed = json.dumps([repr(t) for t in state.targets])
        assert "GPU_POOL_KEY" in pushed and "/run/secrets/anthropic" in pushed
        await wait_until(
            lambda: [t.name for t in service.targets] == ["edge-3", "gpu-pool", "claude"]
        )
        metrics = c.app[METRICS_KEY].registry
        await wait_until(
            lambda: (
                metrics.get_sample_value(
                    "edgefleet_coordinator_overflow_cost_total", {"target": "gpu-pool"}
                )
                == pytest.approx(0.0025)
            )
        )
        assert (
            metrics.get_sample_value(
                "edgefleet_coordinator_overflow_tokens_total",
                {"target": "gpu-pool", "type": "prompt"},
            )
            == 100
        )
        route = await c.get_json("/v1/route?model=other")
        assert route["overflow"]["name"] == "gpu-pool"
        # a peer that leaves is no longer offered
        await sessions[1].stop()
        await wait_until(lambda: names("edge-1") == ["gpu-pool", "claude"], timeout_s=20)
    finally:
        for session in sessions:
            await session.stop()


def test_overflow_usage_in_a_load_report_is_checked() -> None:
    from coordinator.errors import ProtocolError
    from coordinator.rpc.convert import load_report_from_pb
    from edgefleet.v1 import fleet_pb2 as pb

    good = pb.LoadReport(overflow_usage=[pb.OverflowUsage(target="p", requests=2, failed=1)])
    assert load_report_from_pb(good).overflow_usage[0].failed == 1
    for bad in (
        pb.OverflowUsage(target="p", requests=1, failed=2),
        pb.OverflowUsage(target="p", cost=float("nan")),
        pb.OverflowUsage(target="p", cost=-1.0),
        pb.OverflowUsage(target="x" * 500),
    ):
        with pytest.raises(ProtocolError, match="overflow_usage"):
            load_report_from_pb(pb.LoadReport(overflow_usage=[bad]))
