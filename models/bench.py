"""Batch-1 speed of an exported graph through a plain onnxruntime loop."""

from __future__ import annotations

import logging
import time
from typing import Any

from models.ort_llm import OrtDecoder

__all__ = ["decode_benchmark", "embedding_benchmark"]

log = logging.getLogger(__name__)


def decode_benchmark(
    decoder: OrtDecoder, prompt: list[int], new_tokens: int = 64, repeats: int = 2
) -> dict[str, Any]:
    """Greedy decode of exactly ``new_tokens`` tokens (EOS ignored), best of ``repeats``.

    ``decode_tokens_per_s`` counts the tokens after the first (which comes from prefill)
    over the decode time; ``prefill_s`` is the prompt pass + first token.
    """
    decoder.greedy(prompt[:8], 4, stop_at_eos=False)  # warm-up
    runs = []
    for _ in range(repeats):
        gen = decoder.greedy(prompt, new_tokens, stop_at_eos=False)
        runs.append(gen)
    best = max(runs, key=lambda g: g.decode_steps / g.decode_s)
    figures = {
        "decode_tokens_per_s": round(best.decode_steps / best.decode_s, 2),
        "decode_tokens_per_s_runs": [round(g.decode_steps / g.decode_s, 2) for g in runs],
        "prefill_s": round(best.prefill_s, 4),
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "session_load_s": round(decoder.load_s, 3),
        "batch_size": 1,
    }
    log.info(
        "decode %.1f tok/s (runs %s), prefill %.3fs, load %.2fs",
        figures["decode_tokens_per_s"],
        figures["decode_tokens_per_s_runs"],
        best.prefill_s,
        decoder.load_s,
    )
    return figures


def embedding_benchmark(
    session: Any, encode: Any, sentences: list[str], load_s: float
) -> dict[str, Any]:
    """Sentences per second at batch 1 over ``sentences`` (after one warm-up)."""
    encode(session, sentences[:1])
    t0 = time.perf_counter()
    for sentence in sentences:
        encode(session, [sentence])
    seconds = time.perf_counter() - t0
    return {
        "sentences_per_s": round(len(sentences) / seconds, 1),
        "batch_size": 1,
        "session_load_s": round(load_s, 3),
    }
