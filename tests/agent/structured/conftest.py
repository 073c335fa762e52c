from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config

REAL = "smollm2-135m-instruct"


@pytest.fixture
async def real_client(real_artifacts: Path) -> AsyncIterator[TestClient]:
    """An agent app serving the real quantized SmolLM2 on a loopback socket."""
    overrides = {
        "models": {"dir": str(real_artifacts), "serve": [REAL]},
        "engine": {"max_context_tokens": 1024, "default_max_tokens": 128},
    }
    app = create_app(load_config(environ={}, overrides=overrides))
    client = TestClient(TestServer(app, handler_cancellation=True))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
async def client(make_client: Any) -> TestClient:
    """The tiny model with room for tool blocks in the prompt and schemas in the body."""
    return await make_client(
        server={"max_body_bytes": 1 << 20},
        engine={"max_context_tokens": 1024, "default_max_tokens": 64},
    )
