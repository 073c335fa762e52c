"""Agents on loopback with overflow targets set directly (as the coordinator's section
would), and the provider fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.auth.keys import KeyTable
from agent.config import load_config
from tests.overflow.overflow_fakes import FakeAnthropic, FakeOpenAI
from tests.overflow.overflow_testing import TINY, AgentFactory


@pytest.fixture
async def make_agent(tiny_artifacts: Path) -> AsyncIterator[AgentFactory]:
    """A fresh agent serving the tiny model on a real loopback socket; keyword arguments
    are config sections; ``keys`` a KeyTable."""
    clients: list[TestClient] = []

    async def start(keys: KeyTable | None = None, **sections: dict[str, Any]) -> TestClient:
        overrides: dict[str, Any] = {
            "server": {"max_body_bytes": 64 * 1024},
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
            "identity": {"site": "lab"},
            "overflow": {"backoff_s": 0.01},
        }
        for name, values in sections.items():
            overrides[name] = {**overrides.get(name, {}), **values}
        app = create_app(load_config(environ={}, overrides=overrides), keys=keys)
        client = TestClient(TestServer(app, host="127.0.0.1", handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


@pytest.fixture
async def openai_fake() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI(api_key="pool-secret-0001")
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def openai_fake2() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI(api_key="pool-secret-0001")
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def anthropic_fake() -> AsyncIterator[FakeAnthropic]:
    fake = FakeAnthropic(api_key="ant-secret-0002")
    await fake.start()
    yield fake
    await fake.close()
