"""The embedding model's 8-bit products on this CPU: as shipped (ONNX Runtime's 8-bit
``MatMulNBits``) against fp32 on the weights dequantized at load (what the agent runs on an
x86 CPU without VNNI, agent/engine/int8_kernels.py), side by side in one run.

Both through the agent's loader and embedding model (``load_registry``, the default engine
settings: one shared ONNX Runtime pool, one thread per core), one request at a time
without waiting for company (as the moderation check and the semantic cache ask): windows
of 16 and 128 tokens (a short question; a full moderation window), the two variants'
requests interleaved. Also: the agreement of their vectors (cosine) on the same texts, and
the resident memory each load added.

    python -m benchmarks.embedding_kernels [--repeat 40]

Writes ``benchmarks/results/embedding_kernels.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]

import agent.engine.int8_kernels as kernels
from agent.engine.embedder import OnnxEmbeddingModel
from benchmarks.results_file import percentile, target, write_results
from benchmarks.semantic_cache import embedder


def text_of(tokens: int, seed: int) -> list[int]:
    """``tokens`` token ids: [CLS], words of the vocabulary drawn at random, [SEP]."""
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.integers(2000, 29000, size=tokens - 2)]
    return [101, *ids, 102]


async def load(slow: bool) -> tuple[OnnxEmbeddingModel, int]:
    """The embedding model as the agent loads it, its 8-bit products as shipped or in fp32,
    and the resident memory the load added."""
    kernels.slow_8bit_products = lambda flags=None, machine=None: slow
    gc.collect()
    before = psutil.Process().memory_info().rss
    model = await embedder()
    gc.collect()
    return model, psutil.Process().memory_info().rss - before


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args(argv)
    on_this_cpu = kernels.slow_8bit_products()
    shipped, shipped_rss = await load(False)
    fp32, fp32_rss = await load(True)
    variants = {"shipped_8bit": shipped, "fp32_products": fp32}
    figures: dict[str, Any] = {
        "cpu_has_no_8bit_dot_products": on_this_cpu,
        "agent_runs_here": "fp32_products" if on_this_cpu else "shipped_8bit",
        "rss_added_by_load_mib": {
            "shipped_8bit": round(shipped_rss / 2**20, 1),
            "fp32_products": round(fp32_rss / 2**20, 1),
        },
        "per_window_ms": {},
    }
    for tokens in (16, 128):
        times: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(args.repeat + 3):
            ids = text_of(tokens, i)
            for name, model in variants.items():
                started = time.perf_counter()
                await model.embed([ids], wait_for_company=False)
                if i >= 3:  # warm-up
                    times[name].append((time.perf_counter() - started) * 1000)
        figures["per_window_ms"][str(tokens)] = {
            name: {
                "p50": round(percentile(t, 50), 2),
                "p99": round(percentile(t, 99), 2),
            }
            for name, t in times.items()
        }
    cosines = []
    for i in range(50):
        ids = text_of(8 + (i * 7) % 120, 1000 + i)
        a = np.asarray((await shipped.embed([ids])).vectors[0])
        b = np.asarray((await fp32.embed([ids])).vectors[0])
        cosines.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
    figures["cosine_shipped_vs_fp32"] = {
        "min": round(min(cosines), 5),
        "median": round(float(np.median(cosines)), 6),
    }
    for model in variants.values():
        await model.close()
    window = figures["per_window_ms"]["128"]
    speedup = window["shipped_8bit"]["p50"] / window["fp32_products"]["p50"]
    figures["speedup_128_tokens_p50"] = round(speedup, 2)
    print(figures, flush=True)
    faster = "fp32_products" if speedup > 1 else "shipped_8bit"
    targets = {
        "the_agent_runs_the_faster_variant_here": target(
            figures["agent_runs_here"],
            f"== {faster} (faster here)",
            figures["agent_runs_here"] == faster,
        ),
        "cosine_min": target(
            figures["cosine_shipped_vs_fp32"]["min"], ">= 0.999", min(cosines) >= 0.999
        ),
    }
    print(f"-> {write_results('embedding_kernels', figures, targets)}")


if __name__ == "__main__":
    asyncio.run(main())
