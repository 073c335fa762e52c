"""An agent and a client given several coordinators, against real processes.

Two coordinators serve one fleet on one PostgreSQL database (``store_url``), the second
provisioned with the first's fleet CA (``ca/``) and model-signing key, as
docs/operators/postgresql.md says: an agent enrolled through either has its session on
either. TLS on (mutual TLS sessions, a separate enrollment port, HTTPS), API keys
required. SIGKILL the coordinator an agent's session is on: the agent's session is on the
other within one report interval, and a client given both URLs still gets route answers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from coordinator.catalog.catalog import SIGNING_KEY_FILE
from devtools.fleet import ADMIN_TOKEN_ENV, AgentProcess, CoordinatorProcess, free_port
from devtools.process import wait_until
from edgefleet_client import FleetClient, route_lookup

pytestmark = pytest.mark.timeout(120)

REPORT_INTERVAL_S = 1.0
# What a loaded test machine adds to "within one report interval".
SLACK_S = 1.0


def provision_like(first: Path, second: Path) -> None:
    """What a second coordinator of a fleet is given before its first start: the first's
    fleet CA and model-signing key (never generated per coordinator)."""
    second.mkdir(parents=True)
    shutil.copytree(first / "ca", second / "ca")
    shutil.copy2(first / SIGNING_KEY_FILE, second / SIGNING_KEY_FILE)


def join_token(data_dir: Path, store_url: str, http_url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "tokens", "create", "--expires-in", "1h",
         "--uses", "1", "--site", "lab", "--http-url", http_url, "--data-dir", str(data_dir)],
        env={**os.environ, "EDGEFLEET_COORDINATOR_STORE_URL": store_url},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fleet_agent(
    tmp_path: Path,
    store_url: str,
    models_dir: Path,
    first: CoordinatorProcess,
    targets: list[CoordinatorProcess],
    serve: str = "tiny-llama",
    agent_id: str = "edge-1",
) -> AgentProcess:
    """A real agent (TLS, enrolled with a join token minted on ``first``'s database) given
    the gRPC and enrollment addresses of ``targets`` only, in that order (state under
    ``tmp_path / "agent"``)."""
    port = free_port()
    return AgentProcess(
        port=port, coordinator=",".join(c.grpc_target for c in targets),
        agent_id=agent_id, site="lab", lat=48.85, lon=2.35,
        join_token=join_token(first.data_dir, store_url, f"https://127.0.0.1:{port}"),
        state_dir=tmp_path / "agent", models_dir=str(models_dir), serve=[serve],
        extra_args=[
            "--set", "server.tls=on",
            "--set", "coordinator.tls=true",
            "--set", "coordinator.enroll_target=" + ",".join(c.enroll_target for c in targets),
            "--set", f"coordinator.ca_file={first.ca_file}",
        ],
        ssl_context=first.ca_context(),
    )  # fmt: skip


async def wait_connected_only_to(coordinator: CoordinatorProcess) -> None:
    """Until ``coordinator`` lists the agent edge-1, and only it, as connected."""

    async def connected() -> bool:
        listed = await coordinator.agents()
        return [(a["agent_id"], a["status"]) for a in listed] == [("edge-1", "connected")]

    await wait_until(connected, timeout_s=20, message=f"the agent's session on {coordinator}")


@asynccontextmanager
async def two_coordinators(
    tmp_path: Path, store_url: str, report_interval_s: float = REPORT_INTERVAL_S
) -> AsyncIterator[tuple[CoordinatorProcess, CoordinatorProcess]]:
    env = {"EDGEFLEET_COORDINATOR_STORE_URL": store_url}
    interval_ms = int(report_interval_s * 1000)
    first = CoordinatorProcess(
        report_interval_ms=interval_ms, tls=True, data_dir=tmp_path / "a", env=env
    )
    await first.start()
    try:
        provision_like(first.data_dir, tmp_path / "b")
        second = CoordinatorProcess(
            report_interval_ms=interval_ms, tls=True, data_dir=tmp_path / "b",
            env={**env, ADMIN_TOKEN_ENV: first.admin_token},
        )  # fmt: skip
        await second.start()
        try:
            yield first, second
        finally:
            await second.kill()
    finally:
        await first.kill()


async def coordinator_of(agent: AgentProcess, api_key: str) -> str | None:
    """The coordinator the agent says its session is on (its /metrics), None for none."""
    async with (
        aiohttp.ClientSession(headers=agent.headers(api_key)) as http,
        http.get(agent.url + "/metrics", ssl=agent.ssl_context or True) as response,
    ):
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("edgefleet_agent_coordinator{") and line.endswith(" 1.0"):
            return line.split('target="', 1)[1].split('"', 1)[0]
    return None


async def test_an_agent_moves_to_the_other_coordinator_within_a_report_interval(
    tmp_path: Path, postgres_url: str, tiny_artifacts: Path
) -> None:
    async with two_coordinators(tmp_path, postgres_url) as (first, second):
        agent = fleet_agent(tmp_path, postgres_url, tiny_artifacts, first, [first, second])
        await agent.start()
        try:
            api_key = await first.api_key_for([agent])
            assert await coordinator_of(agent, api_key) == first.grpc_target
            urls = [first.http_url, second.http_url]
            context = first.ca_context()  # the fleet CA: both coordinators' HTTPS chain to it

            async def routed() -> list[str]:
                found = await asyncio.to_thread(
                    route_lookup, urls, "tiny-llama", ssl_context=context, timeout_s=2
                )
                return [a.agent_id for a in found]

            async def routed_by_first() -> bool:
                return await routed() == ["edge-1"]

            await wait_until(routed_by_first, timeout_s=10, message="the agent routed")

            await first.signal_and_wait(signal.SIGKILL, 10)
            killed_at = time.monotonic()
            while (where := await coordinator_of(agent, api_key)) != second.grpc_target:
                assert time.monotonic() - killed_at < 10, f"the agent's session is on {where}"
                await asyncio.sleep(0.05)
            moved_s = time.monotonic() - killed_at
            assert moved_s < REPORT_INTERVAL_S + SLACK_S, f"moved after {moved_s:.2f} s"
            assert [(a["agent_id"], a["status"]) for a in await second.agents()] == [
                ("edge-1", "connected")
            ]
            moved = f"moved to coordinator {second.grpc_target} (from {first.grpc_target})"
            assert any(moved in line for line in agent.log)

            # A client given both URLs: the first is dead, the second answers.
            async def routed_by_second() -> bool:
                return await routed() == ["edge-1"]

            await wait_until(routed_by_second, timeout_s=5, message="routed by the second")
            fleet = FleetClient(
                "tiny-llama", coordinator_url=",".join(urls), ca_file=first.ca_file,
                api_key=api_key,
            )  # fmt: skip
            assert [a.agent_id for a in await asyncio.to_thread(fleet.discover)] == ["edge-1"]
            assert fleet.coordinator_url == second.http_url  # asked first from now on
        finally:
            await agent.terminate()
