"""A real agent process keeps a flat memory footprint over 2,000 requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import psutil
import pytest

from devtools.fleet import AgentProcess

pytestmark = pytest.mark.slow

TINY = "tiny-llama"


async def test_rss_stays_flat_across_2000_requests(tiny_artifacts: Path) -> None:
    # small caches, so their (bounded) growth is not mistaken for a leak
    args = [
        "--set", "cache.max_bytes=262144",
        "--set", "engine.prefix_cache_bytes=1048576",
        "--threads", "1",
    ]  # fmt: skip
    async with AgentProcess(models_dir=str(tiny_artifacts), serve=[TINY], extra_args=args) as agent:
        process = psutil.Process(agent.pid)
        sem = asyncio.Semaphore(8)

        async def one(http: aiohttp.ClientSession, i: int) -> None:
            body = {
                "model": TINY,
                "messages": [{"role": "user", "content": f"request number {i}"}],
                "max_tokens": 4,
                "temperature": 0 if i % 2 else 0.8,
                "stream": i % 3 == 0,
            }
            async with sem, http.post(agent.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()

        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(one(http, i) for i in range(300)))  # warm-up
            baseline = process.memory_info().rss
            await asyncio.gather(*(one(http, i) for i in range(300, 2300)))
            after = process.memory_info().rss
    growth_mb = (after - baseline) / 2**20
    print(f"RSS {baseline / 2**20:.1f} MiB after warm-up, grew {growth_mb:.1f} MiB")
    assert growth_mb < 20, f"RSS grew {growth_mb:.1f} MiB over 2,000 requests"
