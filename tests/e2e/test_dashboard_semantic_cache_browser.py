"""The dashboard shows each agent's semantic cache hit rate (issue 29), in a real browser
(Playwright driving Debian's Chromium) against a real coordinator (TLS, enrollment) and a
real agent serving SmolLM2 and the int8 MiniLM: a key whose policy turns the semantic
cache on asks a question, a typo'd repeat (a semantic hit), the question about 2 accounts
(refused by the guard), another question and a time-sensitive one; the agent reports its
lookups and the agent's page shows the hit rate over the lookups compared."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from devtools.browser import poll, signed_in_page
from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
MODEL = "smollm2-135m-instruct"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(
    real_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[CoordinatorProcess, AgentProcess]]:
    state = tmp_path_factory.mktemp("dashboard-semantic")
    async with CoordinatorProcess(report_interval_ms=400, tls=True) as coordinator:
        agent = enrolled_agent(
            coordinator, agent_id="edge-nantes", site="nantes", state_dir=state / "agent",
            models_dir=str(real_artifacts), serve=[MODEL, "all-minilm-l6-v2"],
            extra_args=["--threads", "1"],
        )  # fmt: skip
        try:
            await agent.start()
            yield coordinator, agent
        finally:
            await agent.terminate()


async def ask(agent: AgentProcess, key: str, text: str) -> str:
    """A deterministic chat request; how the caches answered it (X-Edgefleet-Cache)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http,
        http.post(agent.url + "/v1/chat/completions", json=body,
                  ssl=agent.ssl_context) as response,
    ):  # fmt: skip
        assert response.status == 200, await response.text()
        return response.headers["X-Edgefleet-Cache"]


async def test_the_agent_page_shows_the_semantic_cache_hit_rate(
    fleet: tuple[CoordinatorProcess, AgentProcess],
) -> None:
    coordinator, agent = fleet
    key = await coordinator.api_key_for([agent], "semantic", policy={"semantic_cache": True})
    assert await ask(agent, key, "How do I change the email address on my account?") == "miss"
    assert await ask(agent, key, "How do I chnage the email adress on my account?") == (
        "semantic-hit"
    )
    # close in meaning, but the number differs: refused by the guard (a miss to the client)
    assert await ask(agent, key, "How do I change the email address on my 2 accounts?") == "miss"
    assert await ask(agent, key, "What is the capital of France?") == "miss"
    assert await ask(agent, key, "What's the weather today?") == "miss"  # not compared

    SHOTS.mkdir(parents=True, exist_ok=True)
    async with signed_in_page(coordinator) as page:
        await page.goto(f"{coordinator.http_url}/dashboard/#agent/edge-nantes")
        detail_js = (
            "Object.fromEntries([...document.querySelectorAll('#agent-detail dt')]"
            ".map(dt => [dt.textContent, dt.nextElementSibling.textContent]))"
        )
        await poll(
            page, f"(({detail_js})['Semantic cache since start'] || '').includes('1 not compared')"
        )
        detail: dict[str, Any] = await page.evaluate(detail_js)
        assert detail["Semantic cache since start"] == (
            "25.0% hit rate (1 hits, 2 misses, 1 refused by the guard, 1 not compared)"
        ), detail
        await page.screenshot(path=str(SHOTS / "agent-semantic-cache.png"), full_page=True)
