from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config
from agent.engine.ort_session import SessionConfig
from agent.model_loader import load_registry
from agent.model_registry import ModelRegistry

TINY = "tiny-llama"


def tiny_registry(artifacts: Path, max_context_tokens: int = 256) -> ModelRegistry:
    return load_registry(
        artifacts,
        [TINY],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=max_context_tokens,
    )


@pytest.fixture
def make_tiny_registry(tiny_artifacts: Path) -> Callable[[], ModelRegistry]:
    """Builds a registry serving the tiny model (a fresh one per call)."""
    return lambda: tiny_registry(tiny_artifacts)


ClientFactory = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def make_client(tiny_artifacts: Path) -> AsyncIterator[ClientFactory]:
    """Starts a fresh agent app serving the tiny model on a real loopback socket.

    Keyword arguments are config sections, e.g. ``engine={"max_running": 1}``.
    """
    clients: list[TestClient] = []

    async def start(**sections: dict[str, Any]) -> TestClient:
        overrides: dict[str, Any] = {
            "server": {"max_body_bytes": 64 * 1024},
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
        }
        for name, values in sections.items():
            overrides[name] = {**overrides.get(name, {}), **values}
        app = create_app(load_config(environ={}, overrides=overrides))
        client = TestClient(TestServer(app, handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient:
    """A fresh agent app per test, serving the tiny model."""
    return await make_client()
