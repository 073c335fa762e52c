"""The client library against real processes: route lookup, RTT, failover when an agent dies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import REPO_ROOT, wait_until
from edgefleet_client import FleetClient, __all__, route_lookup

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_public_names_are_pinned() -> None:
    assert __all__ == [
        "Agent",
        "DiscoveryError",
        "EdgefleetClientError",
        "FleetClient",
        "NoAgentAvailableError",
        "StreamSegment",
        "browse_mdns",
        "probe_rtt_ms",
        "route_lookup",
    ]


def test_importing_the_client_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys, edgefleet_client\n"
        "heavy = {'onnxruntime', 'numpy', 'grpc', 'google.protobuf', 'agent', 'coordinator'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


async def test_no_failed_request_when_the_chosen_agent_is_killed(tiny_artifacts: Path) -> None:
    async with CoordinatorProcess(report_interval_ms=200) as coordinator:
        agents = [
            AgentProcess(
                models_dir=str(tiny_artifacts),
                serve=["tiny-llama"],
                coordinator=coordinator.grpc_target,
                agent_id=f"edge-{name}",
                site=name,
                lat=lat,
                lon=13.4,
            )
            for name, lat in (("near", 52.5), ("far", 48.1))
        ]
        await asyncio.gather(*(a.start() for a in agents))
        try:

            async def both_routed() -> bool:
                body = await coordinator.get_json("/v1/route?model=tiny-llama")
                return len(body["agents"]) == 2

            await wait_until(both_routed, timeout_s=20, message="both agents routable")
            fleet = FleetClient(
                "tiny-llama",
                coordinator_url=coordinator.http_url,
                lat=52.5,
                lon=13.4,
                allow_insecure_agents=True,
            )
            by_place = await asyncio.to_thread(
                route_lookup, coordinator.http_url, "tiny-llama", lat=52.5, lon=13.4
            )
            assert [a.agent_id for a in by_place] == ["edge-near", "edge-far"]
            # With RTTs (both on loopback, so about equal) the client may pick either.
            ranked = await asyncio.to_thread(fleet.discover)
            assert {a.agent_id for a in ranked} == {"edge-near", "edge-far"}
            assert all(a.rtt_ms is not None for a in ranked)
            chosen = next(a for a in agents if a.agent_id == ranked[0].agent_id)
            other = next(a for a in agents if a is not chosen)
            assert fleet.base_url() == chosen.url + "/v1"

            client = fleet.openai(timeout=30)
            served: list[str] = []
            errors: list[BaseException] = []
            halfway = threading.Event()

            def run() -> None:
                for i in range(200):
                    if i == 60:
                        halfway.set()
                    try:
                        if i % 4 == 3:
                            stream = client.completions.create(
                                model="tiny-llama", prompt="hi", max_tokens=4, stream=True
                            )
                            text = "".join(c.choices[0].text for c in stream if c.choices)
                            served.append(text)
                        else:
                            done = client.completions.create(
                                model="tiny-llama", prompt="hi", max_tokens=4
                            )
                            served.append(done.choices[0].text)
                    except BaseException as exc:
                        errors.append(exc)

            worker = asyncio.create_task(asyncio.to_thread(run))
            await asyncio.to_thread(halfway.wait, 60)
            await chosen.kill()  # the chosen agent dies mid-run
            await worker
            assert errors == []
            assert len(served) == 200
            assert fleet.candidates()[0].agent_id == other.agent_id
        finally:
            for agent in agents:
                await agent.terminate()
