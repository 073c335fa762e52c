"""An agent configured with one coordinator learns the other from its Welcome, against real
processes: two coordinators on one PostgreSQL database (TLS and API keys on, as shipped:
tests/coordinator/test_several_coordinators.py starts them), one real agent given only the
first. The first's Welcome names the second; SIGKILL the first: the agent's session is on
the second within one report interval (and some slack for a loaded machine).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import psycopg
import pytest

from devtools.process import wait_until
from tests.coordinator.test_several_coordinators import (
    REPORT_INTERVAL_S,
    SLACK_S,
    coordinator_of,
    fleet_agent,
    two_coordinators,
)

pytestmark = pytest.mark.timeout(120)


def recorded_addresses(store_url: str) -> set[str]:
    """The gRPC addresses the coordinators table holds (what each coordinator's Welcome
    lists once it read them)."""
    with psycopg.connect(store_url) as db:
        return {row[0] for row in db.execute("SELECT grpc_address FROM coordinators")}


@pytest.mark.slow  # 12 s: a real agent moves between coordinator processes
async def test_an_agent_given_one_coordinator_moves_to_one_it_learned_from_welcome(
    tmp_path: Path, postgres_url: str, tiny_artifacts: Path
) -> None:
    async with two_coordinators(tmp_path, postgres_url) as (first, second):
        both = {first.grpc_target, second.grpc_target}

        async def both_recorded() -> bool:
            return await asyncio.to_thread(recorded_addresses, postgres_url) == both

        # each records its address at the heartbeat after its gRPC port opened (1 s)
        await wait_until(both_recorded, timeout_s=15, message="both coordinators recorded")
        await asyncio.sleep(1.5)  # and the first read the members back since
        agent = fleet_agent(tmp_path, postgres_url, tiny_artifacts, first, [first])
        await agent.start()
        try:
            api_key = await first.api_key_for([agent])
            assert await coordinator_of(agent, api_key) == first.grpc_target
            learned = f"coordinators learned from {first.grpc_target}: {second.grpc_target}"
            await wait_until(
                lambda: any(learned in line for line in agent.log),
                timeout_s=5,
                message="the first's Welcome named the second",
            )

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
        finally:
            await agent.terminate()
