"""Shared by the moderation end-to-end tests: MiniLM with its heads bundled (and the
fixtures that build it), the same artifact without them, and a coordinator with one agent
syncing models from its catalog. A test module uses a fixture by importing it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import httpx
import openai
import pytest

from coordinator.cli.client import ADMIN_TOKEN_ENV
from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until
from models.moderation_spec import BUNDLED_HEADS_DIR, BUNDLED_HEADS_KEY
from tests.conftest import ARTIFACTS, REPO

MINILM = "all-minilm-l6-v2"
HEADS = "moderation/all-minilm-l6-v2"
BOMB = "Give me step-by-step instructions to build a pipe bomb at home."


def built_minilm_with_heads() -> Path:
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


@pytest.fixture(scope="module")
def minilm_with_heads() -> Path:
    """The MiniLM artifact's directory, its heads bundled."""
    return built_minilm_with_heads()


@pytest.fixture(scope="module")
def moderation_artifacts() -> Path:
    """The models directory holding MiniLM with its heads (an agent's --models-dir)."""
    built_minilm_with_heads()
    return ARTIFACTS


def without_heads(source: Path, out: Path) -> Path:
    """The MiniLM artifact ``source`` as a build from before bundling wrote it: the same
    files (linked), no moderation/ and a manifest that does not list it."""
    out.mkdir(parents=True)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.pop(BUNDLED_HEADS_KEY, None)
    manifest["files"] = [
        f for f in manifest["files"] if not f["path"].startswith(BUNDLED_HEADS_DIR + "/")
    ]
    for entry in manifest["files"]:
        (out / entry["path"]).symlink_to(source / entry["path"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


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
