"""Embeddings on the real quantized MiniLM: dynamic batching and the HTTP contract."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.config import load_config
from agent.engine.embedder import OnnxEmbeddingModel
from agent.engine.ort_session import SessionConfig
from agent.model_loader import load_registry

EMBEDDER = "all-minilm-l6-v2"
SENTENCES = [
    "The cat sat on the mat.",
    "A dog barked at the mailman this morning.",
    "Interest rates rose again in the spring.",
    "She planted tomatoes and basil in the garden.",
    "The train to Lyon leaves at nine.",
    "Photosynthesis turns light into chemical energy.",
]


def embedder(artifacts: Path, **batch: int) -> OnnxEmbeddingModel:
    from agent.engine.embed_batcher import EmbeddingBatchConfig

    registry = load_registry(
        artifacts,
        [EMBEDDER],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
        embedding_batch_config=EmbeddingBatchConfig(**batch),
    )
    model = registry.embedding_models[EMBEDDER]
    assert isinstance(model, OnnxEmbeddingModel)
    return model


async def test_concurrent_requests_are_batched_with_the_same_vectors(
    real_artifacts: Path,
) -> None:
    model = embedder(real_artifacts, max_batch_size=8, max_queue_delay_us=20_000)
    await model.start()
    alone = [(await model.embed([s])).vectors[0] for s in SENTENCES]
    assert model.batcher.batch_sizes[-len(SENTENCES) :] == [1] * len(SENTENCES)
    together = await asyncio.gather(*(model.embed([s]) for s in SENTENCES))
    assert max(model.batcher.batch_sizes[-3:]) > 1  # requests shared ONNX Runtime calls
    # int8 dynamic quantization scales activations per ONNX Runtime call, so a vector
    # computed in company is close to, not bit-equal with, the one computed alone
    for one, batched in zip(alone, together, strict=True):
        assert float(np.dot(one, batched.vectors[0])) > 0.98  # the accuracy gate's bar
    await model.close()


async def test_batch_size_cap_splits_large_requests(real_artifacts: Path) -> None:
    model = embedder(real_artifacts, max_batch_size=4, max_queue_delay_us=0)
    await model.start()
    result = await model.embed(SENTENCES * 2)
    assert len(result.vectors) == 12
    assert max(model.batcher.batch_sizes) <= 4
    await model.close()


@pytest.fixture
async def client(real_artifacts: Path) -> TestClient:
    config = load_config(
        environ={}, overrides={"models": {"dir": str(real_artifacts), "serve": [EMBEDDER]}}
    )
    c = TestClient(TestServer(create_app(config)))
    await c.start_server()
    yield c  # type: ignore[misc]
    await c.close()


async def test_http_embeddings_float_base64_tokens_and_usage(client: TestClient) -> None:
    floats = await (
        await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": SENTENCES[:2]})
    ).json()
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert floats["usage"]["prompt_tokens"] == floats["usage"]["total_tokens"] > 10
    encoded = await (
        await client.post(
            "/v1/embeddings",
            json={"model": EMBEDDER, "input": SENTENCES[0], "encoding_format": "base64"},
        )
    ).json()
    single = await (
        await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": SENTENCES[0]})
    ).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, single["data"][0]["embedding"], atol=1e-6)
    by_ids = await client.post(
        "/v1/embeddings", json={"model": EMBEDDER, "input": [101, 7592, 102]}
    )
    assert by_ids.status == 200
    bad_dim = await client.post(
        "/v1/embeddings", json={"model": EMBEDDER, "input": "x", "dimensions": 12}
    )
    assert bad_dim.status == 400
    assert (await bad_dim.json())["error"]["param"] == "dimensions"
