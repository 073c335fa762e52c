"""Desired-state generations across coordinator restarts and the upgrade, with real
processes: a coordinator, and a tiny-model agent that requires API keys and stays up.

An agent keeps the newest generation of each section across reconnects and ignores older
ones. A restarted coordinator must still reach it: with changed overflow targets (their
generation was a count kept in memory, so a restarted coordinator started again at 1),
and with a revocation made after the upgrade from a coordinator whose keys generations
were its clock in milliseconds, on a machine whose clock ran ahead.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess, wait_key_accepted
from devtools.process import REPO_ROOT, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

# The coordinator of the last commit whose keys and models generations were its clock in
# milliseconds, and overflow targets' a count in memory (before migration 8): what
# ``git archive --format=tar a225883 -- coordinator edgefleet models/__init__.py
# models/errors.py models/manifest.py`` gives (its model catalog imports models/), kept
# xz-compressed so that the test needs no git history.
CLOCK_GENERATIONS = REPO_ROOT / "tests" / "data" / "old_trees" / "a225883.tar.xz"
AHEAD_S = 2 * 86_400  # beyond the migration's margin (an hour): only the record helps

# Run as ``python -m clock_ahead MODULE ARGS...`` inside the old tree.
_CLOCK_AHEAD = f'''"""``python -m MODULE ARGS...`` on a machine whose clock runs {AHEAD_S} s ahead
(time.time, which the old coordinator's keys generations were taken from)."""
import runpy
import sys
import time

_real = time.time
time.time = lambda: _real() + {AHEAD_S}
del sys.argv[0]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
'''


def agent(coordinator: CoordinatorProcess, tiny: Path, state: Path) -> AgentProcess:
    return AgentProcess(
        models_dir=str(tiny), serve=["tiny-llama"], coordinator=coordinator.grpc_target,
        agent_id="edge-gen", site="lab", state_dir=state,  # API keys required
    )  # fmt: skip


async def desired_and_applied(coordinator: CoordinatorProcess, section: str) -> tuple[int, int]:
    """The generation of ``section`` the coordinator set for the agent, and the one the
    agent's last report acknowledged (0 before any report)."""
    view = (await coordinator.get_json("/v1/agents/edge-gen"))["desired_state"]
    return view["generations"][section], (view["applied"] or {}).get(section, 0)


async def acknowledged(coordinator: CoordinatorProcess, section: str) -> bool:
    desired, applied = await desired_and_applied(coordinator, section)
    return applied == desired


async def connected(coordinator: CoordinatorProcess) -> bool:
    agents = await coordinator.agents()
    return any(a["agent_id"] == "edge-gen" and a["status"] == "connected" for a in agents)


def targets_file(path: Path, pool: str) -> Path:
    path.write_text(
        json.dumps(
            {"pools": [{"name": pool, "endpoints": [{"url": f"http://{pool}.invalid:8000/v1"}]}]}
        )
    )
    return path


def using(agent: AgentProcess, pool: str) -> bool:
    """The agent's own word on the overflow targets it uses (its log)."""
    lines = [line for line in agent.log if "overflow targets: generation" in line]
    return bool(lines) and lines[-1].rstrip().endswith(f": {pool} (gpu_pool)")


async def test_changed_overflow_targets_reach_an_agent_after_a_coordinator_restart(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    data, targets = tmp_path / "coordinator", tmp_path / "targets.json"
    overflow = ["--set", f"overflow_targets_file={targets}"]
    first = CoordinatorProcess(report_interval_ms=200, data_dir=data, extra_args=overflow)
    targets_file(targets, "pool-a")
    await first.start()
    edge = agent(first, tiny_artifacts, tmp_path / "agent-state")
    try:
        await edge.start()
        await wait_until(lambda: using(edge, "pool-a"), timeout_s=20, message="pool-a in use")
        grpc_port = first.grpc_port
        await first.terminate()

        # The operator replaces the pool and restarts the coordinator; the agent stays up.
        targets_file(targets, "pool-b")
        second = CoordinatorProcess(
            report_interval_ms=200, data_dir=data, grpc_port=grpc_port, extra_args=overflow
        )
        await second.start()
        try:
            await wait_until(lambda: connected(second), timeout_s=20, message="reconnect")
            await wait_until(lambda: using(edge, "pool-b"), timeout_s=10, message="pool-b in use")
            await wait_until(
                lambda: acknowledged(second, "overflow_targets"), timeout_s=5,
                message="the agent's report acknowledging them",
            )  # fmt: skip
        finally:
            await second.terminate()
    finally:
        await edge.terminate()
        await first.terminate()


async def admin(coordinator: CoordinatorProcess, method: str, path: str, body: Any = None) -> Any:
    async with (
        aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
        http.request(method, coordinator.http_url + path, json=body) as response,
    ):
        assert response.status in (200, 201), await response.text()
        return await response.json()


def clock_generations_tree(into: Path) -> Path:
    """The coordinator of CLOCK_GENERATIONS, with the clock-ahead runner beside it."""
    with tarfile.open(CLOCK_GENERATIONS, "r:xz") as tar:
        tar.extractall(into, filter="data")
    (into / "clock_ahead.py").write_text(_CLOCK_AHEAD)
    return into


async def test_a_revocation_after_the_upgrade_reaches_an_agent_holding_clock_generations(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    """The coordinator before the counter ran on a machine whose clock was two days ahead
    (its keys generations with it); it is upgraded in place on this machine, whose clock is
    right. The agent, up all along, must apply the revocation made after the upgrade."""
    data = tmp_path / "coordinator"
    old = CoordinatorProcess(report_interval_ms=200, data_dir=data)
    old.cwd = clock_generations_tree(tmp_path / "old")
    old.module, old.args = "clock_ahead", ["coordinator", *old.args]
    await old.start()
    edge = agent(old, tiny_artifacts, tmp_path / "agent-state")
    try:
        key = await admin(old, "POST", "/v1/admin/keys", {"name": "doomed"})
        await edge.start()
        await wait_key_accepted([edge], key["secret"])
        # Acknowledged, so the old coordinator's snapshot of the agent's state holds it.
        await wait_until(
            lambda: acknowledged(old, "keys"), timeout_s=5, message="keys acknowledged"
        )
        held, _ = await desired_and_applied(old, "keys")
        assert held > (time.time() + AHEAD_S / 2) * 1000  # the clock ahead, as generation
        grpc_port = old.grpc_port
        await old.terminate()

        new = CoordinatorProcess(report_interval_ms=200, data_dir=data, grpc_port=grpc_port)
        await new.start()
        try:
            assert any("schema migrated to version 8" in line for line in new.log)
            await wait_until(lambda: connected(new), timeout_s=20, message="reconnect")
            revoked = await admin(new, "DELETE", f"/v1/admin/keys/{key['key_id']}")
            assert revoked["state"] == "revoked"
            await wait_until(
                lambda: _not(edge.accepts_key(key["secret"])), timeout_s=5,
                message="the revoked key refused",
            )  # fmt: skip
            generation, _ = await desired_and_applied(new, "keys")
            assert generation > held
        finally:
            await new.terminate()
    finally:
        await edge.terminate()
        await old.terminate()


async def _not(probe: Awaitable[bool]) -> bool:
    return not await probe
