"""API keys across real processes: a coordinator and a tiny-model agent.

A key minted at the coordinator serves the official OpenAI SDK through FleetClient; a
revoked key is refused; an agent restarted while the coordinator is away keeps checking
keys from the last keys section it saved.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until
from edgefleet_client import FleetClient

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

BODY = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}


async def post(url: str, path: str, body: Any, secret: str | None = None) -> tuple[int, Any]:
    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def status_with(agent: AgentProcess, secret: str | None) -> int:
    return (await post(agent.url, "/v1/completions", BODY, secret))[0]


async def mint(coordinator: CoordinatorProcess, **scopes: Any) -> dict[str, Any]:
    status, key = await post(
        coordinator.http_url, "/v1/admin/keys", scopes, secret=coordinator.admin_token
    )
    assert status == 201, key
    return dict(key)


async def test_keys_end_to_end_and_agent_restart_with_coordinator_away(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    state_dir = tmp_path / "agent-state"

    def agent(target: str) -> AgentProcess:
        return AgentProcess(
            models_dir=str(tiny_artifacts), serve=["tiny-llama"], coordinator=target,
            agent_id="edge-keys", insecure_no_auth=False,
            extra_args=["--set", f"coordinator.state_dir={state_dir}"],
        )  # fmt: skip

    coordinator = CoordinatorProcess(report_interval_ms=200)
    await coordinator.start()
    first = agent(coordinator.grpc_target)
    try:
        await first.start()
        kept = await mint(coordinator, name="kept")
        doomed = await mint(coordinator, name="doomed")
        await wait_until(
            lambda: _is(status_with(first, kept["secret"]), 200), timeout_s=20, message="key"
        )
        assert await status_with(first, None) == 401
        assert await status_with(first, doomed["secret"]) == 200

        # The official SDK through FleetClient, the key as api_key.
        fleet = FleetClient(
            "tiny-llama",
            coordinator_url=coordinator.http_url,
            api_key=kept["secret"],
            allow_insecure_agents=True,  # loopback HTTP agents in this test
        )
        with fleet.openai(timeout=30) as client:
            done = await asyncio.to_thread(
                client.completions.create, model="tiny-llama", prompt="hi", max_tokens=2
            )
        assert done.usage.completion_tokens == 2

        started = time.monotonic()
        async with (
            aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
            http.delete(f"{coordinator.http_url}/v1/admin/keys/{doomed['key_id']}") as response,
        ):
            assert response.status == 200
        await wait_until(
            lambda: _is(status_with(first, doomed["secret"]), 401), timeout_s=2,
            interval_s=0.01, message="revoked key refused",
        )  # fmt: skip
        took = time.monotonic() - started
        print(f"revoked key refused by the agent process {took * 1000:.0f} ms after DELETE")
        assert took < 0.2 + 0.3  # one 200 ms report interval, plus a loaded machine's slack
        assert await status_with(first, kept["secret"]) == 200
        saved = state_dir / "api_keys.json"
        assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
        assert kept["secret"] not in saved.read_text()
    finally:
        await first.terminate()
        target = coordinator.grpc_target
        await coordinator.terminate()

    # The coordinator is gone; a restarted agent checks keys from its saved section.
    second = agent(target)
    await second.start()
    try:
        assert await status_with(second, kept["secret"]) == 200
        assert await status_with(second, doomed["secret"]) == 401
        assert await status_with(second, None) == 401
        assert await status_with(second, "ef-000000000000-made-up") == 401
    finally:
        await second.terminate()


async def _is(probe: Any, wanted: int) -> bool:
    return bool(await probe == wanted)
