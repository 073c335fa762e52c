"""A 1 MB prompt is tokenized off the event loop, which keeps serving (/healthz) meanwhile."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config

LLM = "smollm2-135m-instruct"
BIG = "lorem ipsum dolor sit amet " * 38_000  # ~1 MB


@pytest.fixture
async def client(real_artifacts: Path) -> AsyncIterator[TestClient]:
    config = load_config(
        environ={},
        overrides={
            "server": {"max_body_bytes": 2 << 20},
            "models": {"dir": str(real_artifacts), "serve": [LLM]},
        },
    )
    async with TestClient(TestServer(create_app(config))) as c:
        yield c


async def _longest_stall_s(during: asyncio.Future[object], client: TestClient) -> float:
    """The longest the event loop (which serves /healthz too) went without a turn."""
    longest, last = 0.0, time.monotonic()
    while not during.done():
        await asyncio.sleep(0.005)
        longest = max(longest, time.monotonic() - last - 0.005)
        last = time.monotonic()
    assert (await client.get("/healthz")).status == 200
    return longest


async def test_a_1mb_prompt_does_not_stall_healthz(client: TestClient) -> None:
    # What is measured is tokenization on or off the loop, not a collection of whatever
    # earlier tests left in this (multi-GB) pytest process: freeze that out of the GC.
    gc.collect()
    gc.freeze()
    try:
        await _each_endpoint(client)
    finally:
        gc.unfreeze()


async def _each_endpoint(client: TestClient) -> None:
    for path, body in [
        ("/v1/chat/completions", {"model": LLM, "messages": [{"role": "user", "content": BIG}]}),
        ("/v1/completions", {"model": LLM, "prompt": BIG}),
    ]:
        request = asyncio.ensure_future(client.post(path, json=body))
        await asyncio.sleep(0)
        longest = await _longest_stall_s(request, client)
        response = await request
        print(f"{path}: longest event-loop stall (1 MB prompt): {longest * 1000:.0f} ms")
        assert response.status == 400  # over the context, found after tokenizing
        assert "context" in (await response.json())["error"]["message"]
        assert longest < 0.15
