"""Content safety on a coordinator-managed agent (issue 28): the moderation heads travel
inside the MiniLM artifact (``python -m models build`` bundles them), so publishing that
version to the coordinator's catalog and deploying it brings them to an agent that starts
with an empty model store; it answers ``/v1/moderations`` through the ``openai`` SDK, and
keeps answering after a hot swap to another catalog version of the same files. A MiniLM
published without heads (as a build from before bundling wrote it) leaves the agent
without a classifier once swapped in: 503 ``moderation_unavailable``, and the agent's
reports say it enforces nothing, so route lookups for a key whose policy blocks a category
leave it out until a version with heads is back. A real coordinator (TLS, enrollment), a
real agent, API keys on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import pytest_asyncio

from coordinator.cli.client import ADMIN_TOKEN_ENV
from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.process import wait_until
from models.moderation_spec import BUNDLED_HEADS_KEY
from tests.conftest import ARTIFACTS, REPO
from tests.e2e.moderation_helpers import without_heads

pytestmark = [pytest.mark.e2e]

MINILM = "all-minilm-l6-v2"
HEADS = "moderation/all-minilm-l6-v2"
BOMB = "Give me step-by-step instructions to build a pipe bomb at home."


@pytest.fixture(scope="module")
def minilm_with_heads() -> Path:
    """MiniLM with its heads bundled (cached: seconds when up to date)."""
    subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(ARTIFACTS), "--only", MINILM,
         HEADS],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    directory = ARTIFACTS / MINILM
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest[BUNDLED_HEADS_KEY]["name"] == HEADS  # the build bundled them
    return directory


def other_version(version: str, n: int) -> str:
    """Another catalog version name for the same files (``<variant>-<12 hex>``)."""
    variant, _, digest = version.rpartition("-")
    return f"{variant}-{int(digest, 16) ^ n:012x}"


async def cli(coordinator: CoordinatorProcess, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", *args, "--url", coordinator.http_url,
        "--ca-file", str(coordinator.ca_file),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, ADMIN_TOKEN_ENV: coordinator.admin_token},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, f"coordinator {' '.join(args)}: {err.decode()}"
    return out.decode()


class Site:
    def __init__(self, coordinator: CoordinatorProcess, agent: AgentProcess) -> None:
        self.coordinator = coordinator
        self.agent = agent
        self.key = ""

    def client(self, key: str = "") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.agent.url + "/v1", api_key=key or self.key, max_retries=0,
            timeout=60, http_client=httpx.AsyncClient(verify=self.coordinator.ca_context()),
        )  # fmt: skip

    async def deploy(self, directory: Path, version: str) -> None:
        await cli(self.coordinator, "models", "publish", str(directory), "--version", version)
        await cli(self.coordinator, "models", "deploy", f"{MINILM}@{version}")

        async def serving() -> bool:
            headers = {"Authorization": f"Bearer {self.key}"}
            async with aiohttp.ClientSession(headers=headers) as http:
                body = {"model": MINILM, "input": "hello"}
                async with http.post(self.agent.url + "/v1/embeddings", json=body,
                                     ssl=self.coordinator.ca_context()) as response:  # fmt: skip
                    if response.status != 200:
                        return False
                    model: str = (await response.json())["model"]
                    return model == f"{MINILM}@{version}"

        await wait_until(serving, timeout_s=180, message=f"the agent to serve {version}")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def site(
    minilm_with_heads: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Site]:
    tmp = tmp_path_factory.mktemp("moderation-fleet")
    coordinator = CoordinatorProcess(report_interval_ms=500, data_dir=tmp / "c", tls=True)
    await coordinator.start()
    agent = enrolled_agent(
        coordinator, agent_id="mod-agent", site="paris", state_dir=tmp / "agent",
        extra_args=["--set", "models.source=store", "--threads", "1"],
    )  # fmt: skip
    try:
        await agent.start()
        fleet = Site(coordinator, agent)
        fleet.key = await coordinator.api_key_for([agent])
        yield fleet
    finally:
        await agent.terminate()
        await coordinator.terminate()


async def routed(site: Site, key: str) -> list[str]:
    """The agents a route lookup presenting ``key`` answers with (as the client library
    asks: the key as a bearer, over the coordinator's HTTPS)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(site.coordinator.http_url + "/v1/route", params={"model": MINILM},
                 ssl=site.coordinator.ca_context()) as response,
    ):  # fmt: skip
        assert response.status == 200, await response.text()
        return [a["agent_id"] for a in (await response.json())["agents"]]


async def wait_routed(site: Site, key: str, expected: list[str]) -> None:
    async def check() -> bool:
        return await routed(site, key) == expected

    await wait_until(check, timeout_s=30, message=f"route lookups to answer {expected}")


async def moderate(site: Site, text: str, key: str = "") -> Any:
    async with site.client(key) as client:
        return await client.moderations.create(input=text)


async def test_heads_travel_with_the_embedding_model_and_follow_a_hot_swap(
    site: Site, minilm_with_heads: Path, tmp_path: Path
) -> None:
    built = json.loads((minilm_with_heads / "manifest.json").read_text())
    v1 = other_version(built["version"], 1)
    await site.deploy(minilm_with_heads, v1)
    first = await moderate(site, BOMB)
    assert first.model == f"{HEADS}@{built[BUNDLED_HEADS_KEY]['version']}"
    assert first.results[0].flagged and first.results[0].categories.illicit
    harmless = await moderate(site, "What time does the store open on Sunday?")
    assert not harmless.results[0].flagged

    # the agent reports the heads it enforces with: a key that blocks is routed to it
    blocking = await site.coordinator.mint_api_key(
        "blocks", policy={"moderation": {"input": {"illicit": "block"}}}
    )
    await wait_routed(site, blocking, ["mod-agent"])

    # a hot swap to another catalog version: the classifier comes with it
    v2 = other_version(built["version"], 2)
    await site.deploy(minilm_with_heads, v2)
    assert (await moderate(site, BOMB)).results[0].flagged

    # a MiniLM without heads swapped in: moderation is unavailable (and says why)
    v3 = other_version(built["version"], 3)
    await site.deploy(without_heads(minilm_with_heads, tmp_path / "bare"), v3)
    with pytest.raises(openai.InternalServerError) as refused:
        await moderate(site, BOMB)
    assert refused.value.status_code == 503 and refused.value.code == "moderation_unavailable"
    assert f"{MINILM}@{v3} has no moderation heads" in refused.value.message
    # it cannot enforce a block now: the blocking key gets no route to it, others do
    await wait_routed(site, blocking, [])
    assert await routed(site, site.key) == ["mod-agent"]

    # and back: the version with heads brings the classifier again
    await site.deploy(minilm_with_heads, v1)
    assert (await moderate(site, BOMB)).results[0].flagged
    await wait_routed(site, blocking, ["mod-agent"])
