"""The streamed-request timing shared by benchmarks/serving_vs_llamacpp and
benchmarks/speculative, and the speculative benchmark's repeats: against a real HTTP
server streaming chat chunks as the agent and llama.cpp's server do."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks.serving_vs_llamacpp import SMOLLM2, one_request, timed_stream
from benchmarks.speculative import (
    concurrent_waves,
    document,
    single_stream,
    stream_one,
    workloads,
)


class ChunkServer:
    """Streams ``chunks`` text chunks ``gap_s`` apart (after a role-only chunk), and a
    usage chunk when asked; records each request's body and arrival."""

    def __init__(
        self, name: str, log: list[str], chunks: int = 5, gaps_s: list[float] | None = None
    ):
        self.name, self.log, self.chunks = name, log, chunks
        self.gaps_s = gaps_s or [0.02]  # per request, cycled
        self.bodies: list[dict[str, Any]] = []

    def chunk(self, delta: dict[str, str], usage: dict[str, int] | None = None) -> bytes:
        choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": choices, "usage": usage}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n".encode()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        gap = self.gaps_s[len(self.bodies) % len(self.gaps_s)]
        self.bodies.append(body)
        self.log.append(self.name)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(self.chunk({"role": "assistant"}))
        for i in range(self.chunks):
            await asyncio.sleep(gap)
            await response.write(self.chunk({"content": f"t{i} "}))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 3, "completion_tokens": self.chunks + 2,
                     "total_tokens": self.chunks + 5}  # fmt: skip
            await response.write(self.chunk({}, usage))
        await response.write(b"data: [DONE]\n\n")
        return response


async def serve(server: ChunkServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.handle)
    test_server = TestServer(app)
    await test_server.start_server()
    try:
        yield str(test_server.make_url("")).rstrip("/")
    finally:
        await test_server.close()


@pytest.fixture
async def one() -> AsyncIterator[tuple[ChunkServer, openai.AsyncOpenAI]]:
    server = ChunkServer("a", [])
    async for url in serve(server):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        yield server, client
        await client.close()


async def test_timed_stream_times_text_chunks_and_reads_usage_when_asked(
    one: tuple[ChunkServer, openai.AsyncOpenAI],
) -> None:
    server, client = one
    t = await timed_stream(client, "m", "hi", 9, {"cache": False})
    assert (t.chunks, t.usage_tokens) == (5, 0)  # the role-only chunk is not text
    assert t.started < t.first < t.last and t.last - t.first >= 4 * 0.02 * 0.9
    assert "stream_options" not in server.bodies[0]
    assert server.bodies[0]["max_tokens"] == 9 and server.bodies[0]["cache"] is False
    assert server.bodies[0]["temperature"] == 0 and server.bodies[0]["stream"] is True
    t = await timed_stream(client, "m", "hi", 9, {}, include_usage=True)
    assert (t.chunks, t.usage_tokens) == (5, 7)


async def test_both_benchmarks_derive_their_figures_from_it(
    one: tuple[ChunkServer, openai.AsyncOpenAI],
) -> None:
    server, client = one
    r = await one_request(client, "m", 3, 16, "shared")
    assert server.bodies[-1]["min_tokens"] == 16  # serving_vs_llamacpp asks exactly 16
    assert r["chunks"] == 5 and 0 < r["ttft"] < r["end"]
    assert r["decode_tps"] == pytest.approx(4 / (r["end"] - r["ttft"]))
    s = await stream_one(client, "m", "hi", 16)
    assert "min_tokens" not in server.bodies[-1]
    assert s["tokens"] == 7  # the usage chunk's count, not the chunks'
    assert s["decode_tps"] == pytest.approx(6 / s["decode_s"])


async def test_single_stream_alternates_the_order_and_takes_the_median_repeat() -> None:
    log: list[str] = []
    # server b's second request is slow: the median over 3 repeats ignores it
    a, b = ChunkServer("a", log), ChunkServer("b", log, gaps_s=[0.02, 0.2, 0.02])
    async for url_a in serve(a):
        async for url_b in serve(b):
            args = argparse.Namespace(rounds=1, repeats=3, max_tokens=8)
            figures = await single_stream(
                {"a": (url_a, "m"), "b": (url_b, "m")}, {"w": ["hi"]}, args
            )
    assert log == ["a", "b", "b", "a", "a", "b"]
    fig = figures["w"]["b"]
    slow, fast = sorted(fig["decode_tokens_per_s_by_repeat"])[0], fig["decode_tokens_per_s"]
    assert fig["decode_tokens_per_s_by_repeat"][1] == slow and fast > 3 * slow
    assert fast == pytest.approx(sorted(fig["decode_tokens_per_s_by_repeat"])[1], abs=0.1)
    assert fig["completion_tokens"] == [7] and len(fig["ttft_s"]) == 3


async def test_concurrent_waves_alternate_the_order_and_take_the_median_wave() -> None:
    log: list[str] = []
    # server b's second wave (requests 3 and 4) is slow: the median wave ignores it
    a, b = ChunkServer("a", log), ChunkServer("b", log, gaps_s=[0.02, 0.02, 0.2, 0.2, 0.02, 0.02])
    async for url_a in serve(a):
        async for url_b in serve(b):
            args = argparse.Namespace(repeats=3, concurrency=2, max_tokens=8)
            figures = await concurrent_waves({"a": url_a, "b": url_b}, "m", "hi", args)
    assert log == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    by_repeat = figures["b"]["aggregate_tokens_per_s_by_repeat"]
    assert len(by_repeat) == 3 and by_repeat[1] == min(by_repeat)
    assert by_repeat[1] * 3 < figures["b"]["aggregate_tokens_per_s"] == sorted(by_repeat)[1]
    assert figures["b"]["output_tokens"] == 2 * 7  # usage counts, both requests


def test_the_workload_texts_are_pinned() -> None:
    """The document and the code file are the benchmark's own copies (the texts of the
    runs from 16:19 on), not the live docs page and source file others edit."""
    doc = document()
    assert hashlib.md5(doc.encode()).hexdigest() == "1bad68563a80df5b3b47bf74cc8db758"
    assert doc.startswith("# Several models on one box") and len(doc) == 2609
    prompts = workloads(SMOLLM2)
    assert prompts["extract"][0].startswith(doc) and "class StopMatcher" in prompts["code_edit"][0]
