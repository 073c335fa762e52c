"""Embeddings under attack: a poisoned token id fails its own request only (400 naming the
input, no ONNX Runtime text), the queue is bounded (429 + Retry-After), and a large text
input is tokenized off the event loop. How long those take is measured by
``python -m benchmarks.responsiveness``."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config
from agent.engine.embed_batcher import DynamicEmbeddingBatcher, EmbeddingBatchConfig, Vectors
from agent.errors import OverloadedError
from tests.agent.loop_probe import gc_frozen, healthz_while

EMBEDDER = "all-minilm-l6-v2"
HONEST = [f"Sentence number {i} about the weather in spring." for i in range(10)]


@pytest.fixture
async def client(real_artifacts: Path) -> TestClient:
    config = load_config(
        environ={},
        overrides={
            "models": {"dir": str(real_artifacts), "serve": [EMBEDDER]},
            # a long wait for company, so the poison and the honest inputs share a call
            "embeddings": {"max_queue_delay_us": 50_000},
        },
    )
    c = TestClient(TestServer(create_app(config)))
    await c.start_server()
    yield c  # type: ignore[misc]
    await c.close()


async def test_an_out_of_vocabulary_token_id_fails_its_own_request_only(
    client: TestClient,
) -> None:
    async def post(payload: object) -> tuple[int, dict[str, object]]:
        response = await client.post("/v1/embeddings", json=payload)
        return response.status, await response.json()

    honest = [post({"model": EMBEDDER, "input": text}) for text in HONEST]
    poison = post({"model": EMBEDDER, "input": [[101, 7592, 102], [101, 10**6, 102]]})
    *answers, (status, body) = await asyncio.gather(*honest, poison)
    served = sum(s == 200 for s, _ in answers)
    print(f"honest requests served: {served} of {len(answers)}; poison: {status}")
    assert served == len(answers)
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict)
    assert error["param"] == "input"
    assert "input[1]" in error["message"] and "1000000" in error["message"]
    assert "onnxruntime" not in str(body).lower() and "gather" not in str(body).lower()
    negative = await post({"model": EMBEDDER, "input": [101, -5, 102]})
    assert negative[0] == 400


def _vectors(batch: list[list[int]]) -> Vectors:
    if any(t < 0 for ids in batch for t in ids):
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Gather idx out of range")
    return np.ones((len(batch), 4), dtype=np.float32)


async def test_a_failed_call_is_rerun_input_by_input() -> None:
    """Defence in depth: an input that slips past validation fails alone."""
    with ThreadPoolExecutor(1) as pool:
        batcher = DynamicEmbeddingBatcher(
            _vectors, pool, EmbeddingBatchConfig(max_batch_size=32, max_queue_delay_us=50_000)
        )
        await batcher.start()
        good = [batcher.embed([[1, 2, 3]]) for _ in range(10)]
        results = await asyncio.gather(*good, batcher.embed([[1, -1]]), return_exceptions=True)
        await batcher.close()
    assert all(isinstance(r, np.ndarray) for r in results[:10])
    assert isinstance(results[10], RuntimeError)


async def test_a_full_queue_refuses_at_once_and_serves_what_it_holds() -> None:
    release = threading.Event()

    def slow(batch: list[list[int]]) -> Vectors:
        release.wait(60)
        return np.ones((len(batch), 4), dtype=np.float32)

    with ThreadPoolExecutor(1) as pool:
        batcher = DynamicEmbeddingBatcher(
            slow, pool, EmbeddingBatchConfig(max_batch_size=2, max_queue_delay_us=0, max_queue=4)
        )
        await batcher.start()
        first = asyncio.ensure_future(batcher.embed([[1], [2]]))  # running
        await asyncio.sleep(0.1)
        queued = asyncio.ensure_future(batcher.embed([[1], [2], [3], [4]]))  # fills the queue
        await asyncio.sleep(0.05)
        # Refused at once: in the request's first step, before it waits for anything (room,
        # a timer), while the running call holds (for 60 s, until released below). How long
        # a refusal takes: python -m benchmarks.responsiveness.
        refusal = batcher.embed([[5]])
        try:
            with pytest.raises(OverloadedError) as refused:
                refusal.send(None)
            assert not first.done() and not queued.done()
        finally:
            refusal.close()
            release.set()
        assert refused.value.retry_after >= 1 and "queue is full" in str(refused.value)
        assert len(await first) == 2 and len(await queued) == 4
        assert len(await batcher.embed([[6]])) == 1  # room again
        await batcher.close()


async def test_a_full_queue_is_429_with_retry_after(real_artifacts: Path) -> None:
    config = load_config(
        environ={},
        overrides={
            "models": {"dir": str(real_artifacts), "serve": [EMBEDDER]},
            "embeddings": {"max_queue": 8},
        },
    )
    async with TestClient(TestServer(create_app(config))) as c:
        response = await c.post("/v1/embeddings", json={"model": EMBEDDER, "input": ["x"] * 9})
        assert response.status == 400  # more than the queue can ever hold
        texts = [["some words here"] * 8 for _ in range(12)]
        answers = await asyncio.gather(
            *(c.post("/v1/embeddings", json={"model": EMBEDDER, "input": t}) for t in texts)
        )
        statuses = [a.status for a in answers]
        assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses
        busy = answers[statuses.index(429)]
        assert busy.headers["Retry-After"] == "1"
        assert "queue is full" in (await busy.json())["error"]["message"]


async def test_a_large_text_input_does_not_stall_the_event_loop(client: TestClient) -> None:
    """Tokenizing ~1 MB of text takes a while; /healthz keeps answering meanwhile."""
    big = "lorem ipsum dolor sit amet " * 38_000  # ~1 MB: refused for length, after tokenizing
    with gc_frozen():
        request = asyncio.ensure_future(
            client.post("/v1/embeddings", json={"model": EMBEDDER, "input": big})
        )
        longest_gap, answered, took = await healthz_while(request, client)
        response = await request
    print(
        f"1 MB input refused in {took * 1000:.0f} ms; {answered} /healthz answered meanwhile, "
        f"the longest gap {longest_gap * 1000:.0f} ms"
    )
    assert response.status in (400, 413)
    # On the event loop, or on a thread holding the GIL (tokenizers' encode does, encode_batch
    # does not), /healthz would wait out the whole tokenization (the request's time; seen:
    # 95-99%); off it, /healthz keeps answering: the longest gap is a fraction (2-6% here).
    assert answered >= 2
    assert longest_gap < took / 2, (longest_gap, took)
