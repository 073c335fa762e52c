"""The embedding model's short path: short text (the semantic cache's last user message) is
tokenised on the calling coroutine, without a hop to a worker thread and back; long text
still goes to a worker thread, off the event loop."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.engine.embed_batcher import EmbeddingBatchConfig
from agent.engine.embedder import INLINE_TOKENIZE_CHARS, OnnxEmbeddingModel
from agent.engine.ort_session import SessionConfig
from agent.model_loader import load_registry

EMBEDDER = "all-minilm-l6-v2"


async def test_short_text_is_tokenised_on_the_loop_and_long_text_on_a_thread(
    real_artifacts: Path,
) -> None:
    registry = load_registry(
        real_artifacts,
        [EMBEDDER],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
        embedding_batch_config=EmbeddingBatchConfig(),
    )
    model = registry.embedding_models[EMBEDDER]
    assert isinstance(model, OnnxEmbeddingModel)
    seen: list[int] = []
    tokenise = model._ids_for_all

    def recording(inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        seen.append(threading.get_ident())
        return tokenise(inputs)

    model._ids_for_all = recording  # type: ignore[method-assign]
    await model.start()
    try:
        loop_thread = threading.get_ident()
        short_text = "How do I reset my password?"
        short = await model.embed([short_text], wait_for_company=False)
        assert seen == [loop_thread]
        # two inputs together past the bound: a thread (the bound counts every input)
        half = "x" * (INLINE_TOKENIZE_CHARS // 2 + 1)  # one word: one unknown token
        both = await model.embed([half, half])
        assert len(seen) == 2 and seen[1] != loop_thread
        # the same vector on either path
        padded = await model.embed([short_text, "x" * (INLINE_TOKENIZE_CHARS + 1)])
        assert len(seen) == 3 and seen[2] != loop_thread
        assert np.allclose(short.vectors[0], padded.vectors[0], atol=1e-5)
        assert len(both.vectors) == 2
    finally:
        await model.close()
