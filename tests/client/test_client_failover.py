"""The client library against real processes: route lookup, RTT, failover when an agent dies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
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


@asynccontextmanager
async def two_site_fleet(tiny_artifacts: Path, state: Path) -> AsyncIterator[Fleet]:
    """A coordinator with TLS and two enrolled HTTPS agents, one per site (the common edge
    topology), API keys required: the configuration a user runs beyond loopback."""
    async with CoordinatorProcess(report_interval_ms=200, tls=True) as coordinator:
        agents = [
            enrolled_agent(
                coordinator,
                agent_id=f"edge-{name}",
                site=f"edge-{name}",
                lat=lat,
                lon=lon,
                state_dir=state / name,
                models_dir=str(tiny_artifacts),
                serve=["tiny-llama"],
            )
            for name, lat, lon in (("paris", 48.8566, 2.3522), ("berlin", 52.52, 13.405))
        ]
        await asyncio.gather(*(a.start() for a in agents))
        try:
            api_key = await coordinator.api_key_for(agents)

            async def both_routed() -> bool:
                body = await coordinator.get_json("/v1/route?model=tiny-llama")
                return len(body["agents"]) == 2

            await wait_until(both_routed, timeout_s=20, message="both agents routable")
            yield Fleet(coordinator, agents, api_key)
        finally:
            for agent in agents:
                await agent.terminate()


@dataclass
class Fleet:
    coordinator: CoordinatorProcess
    agents: list[AgentProcess]
    api_key: str

    def agent(self, agent_id: str) -> AgentProcess:
        return next(a for a in self.agents if a.agent_id == agent_id)


def run_requests(
    client: Any,
    count: int,
    served: list[str],
    errors: list[BaseException],
    halfway: threading.Event,
) -> None:
    """``count`` completions in a row, every other one streamed; the ``count // 3``-th sets
    ``halfway``. Streams are long enough (24 tokens, none earlier) to be cut mid-way."""
    for i in range(count):
        if i == count // 3:
            halfway.set()
        try:
            if i % 2:
                stream = client.completions.create(
                    model="tiny-llama", prompt=f"hi {i}", max_tokens=24, stream=True,
                    extra_body={"min_tokens": 24},
                )  # fmt: skip
                served.append("".join(c.choices[0].text for c in stream if c.choices))
            else:
                done = client.completions.create(model="tiny-llama", prompt="hi", max_tokens=4)
                served.append(done.choices[0].text)
        except BaseException as exc:
            errors.append(exc)


async def test_no_failed_request_when_the_chosen_agent_is_killed(
    tiny_artifacts: Path, tmp_path: Path
) -> None:
    async with two_site_fleet(tiny_artifacts, tmp_path) as fleet_:
        coordinator = fleet_.coordinator
        by_place = await asyncio.to_thread(
            route_lookup, coordinator.http_url, "tiny-llama", lat=52.5, lon=13.4,
            ssl_context=coordinator.ca_context(),
        )  # fmt: skip
        assert [a.agent_id for a in by_place] == ["edge-berlin", "edge-paris"]
        fleet = FleetClient(
            "tiny-llama",
            coordinator_url=coordinator.http_url,
            lat=52.5,
            lon=13.4,
            cooldown_s=120,  # the dead agent stays last for the rest of the run
            ca_file=coordinator.ca_file,
            api_key=fleet_.api_key,
        )
        # With RTTs (both on loopback, so about equal) the client may pick either.
        ranked = await asyncio.to_thread(fleet.discover)
        assert {a.agent_id for a in ranked} == {"edge-paris", "edge-berlin"}
        assert all(a.rtt_ms is not None for a in ranked)
        chosen = fleet_.agent(ranked[0].agent_id)
        other = next(a for a in fleet_.agents if a is not chosen)
        assert fleet.base_url() == chosen.url + "/v1"

        client = fleet.openai(timeout=30)
        served: list[str] = []
        errors: list[BaseException] = []
        halfway = threading.Event()
        worker = asyncio.create_task(
            asyncio.to_thread(run_requests, client, 150, served, errors, halfway)
        )
        await asyncio.to_thread(halfway.wait, 60)
        await chosen.kill()  # the chosen agent dies mid-run
        await worker
        assert errors == []
        assert len(served) == 150
        assert fleet.candidates()[0].agent_id == other.agent_id


async def test_a_one_agent_site_loses_nothing_when_its_agent_dies(
    tiny_artifacts: Path, tmp_path: Path
) -> None:
    """A client that names only its site (one agent there) fails over beyond it at once:
    the route answer carries the nearest live agent beyond the site. (It held only the
    site's agent, and every request failed for 10 s until that agent was declared down.)"""
    async with two_site_fleet(tiny_artifacts, tmp_path) as fleet_:
        coordinator = fleet_.coordinator
        fleet = FleetClient(
            "tiny-llama",
            coordinator_url=coordinator.http_url,
            site="edge-paris",
            cooldown_s=120,
            ca_file=coordinator.ca_file,
            api_key=fleet_.api_key,
        )
        ranked = await asyncio.to_thread(fleet.discover)
        assert [a.agent_id for a in ranked] == ["edge-paris", "edge-berlin"]
        clients = [fleet.openai(timeout=30) for _ in range(4)]
        served: list[list[str]] = [[] for _ in clients]
        errors: list[BaseException] = []
        halfway = [threading.Event() for _ in clients]
        workers = [
            asyncio.create_task(asyncio.to_thread(run_requests, c, 60, out, errors, h))
            for c, out, h in zip(clients, served, halfway, strict=True)
        ]
        await asyncio.gather(*(asyncio.to_thread(h.wait, 60) for h in halfway))
        await fleet_.agent("edge-paris").kill()  # the site's only agent, mid-stream
        await asyncio.gather(*workers)
        assert errors == []
        assert [len(out) for out in served] == [60] * len(clients)
        assert fleet.candidates()[0].agent_id == "edge-berlin"
