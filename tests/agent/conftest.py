from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config
from agent.engine.ort_session import SessionConfig
from agent.model_registry import ModelRegistry
from agent.model_store import load_registry

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


@pytest.fixture
async def client(tiny_artifacts: Path) -> AsyncIterator[TestClient]:
    """A fresh agent app per test, serving the tiny model, on a real loopback socket."""
    config = load_config(
        environ={},
        overrides={
            "server": {"max_body_bytes": 64 * 1024},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
        },
    )
    registry = tiny_registry(tiny_artifacts)
    app = create_app(config, registry)
    async with TestClient(TestServer(app)) as c:
        yield c
    await registry.close()
