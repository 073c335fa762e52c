"""Single-stream decode tokens/s and time to first token of the shipped LLM, over HTTP.

Starts one agent process serving the shipped ``smollm2-135m-instruct`` artifact, sends
sequential streamed chat requests with the ``openai`` SDK, and writes
``benchmarks/results/single_stream.json``.

    python -m benchmarks.single_stream [--requests 8] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import openai

from benchmarks.results_file import percentile, target, write_results
from devtools.fleet import AgentProcess
from models.manifest import load_manifest

LLM = "smollm2-135m-instruct"
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a large city, with many details.",
    "Write a long letter to a friend about a summer spent in the mountains.",
]


async def measure(url: str, requests: int, max_tokens: int) -> dict[str, object]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    ttfts, decode_rates, prompt_tokens, completion_tokens = [], [], [], []
    # warm-up: first-run allocations are not what a user sees in steady state
    await client.chat.completions.create(
        model=LLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    for i in range(requests):
        started = time.perf_counter()
        first: float | None = None
        last = started
        stream = await client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = now
                last = now
            if chunk.usage is not None:
                usage = chunk.usage
        assert first is not None and usage is not None, "stream produced no tokens"
        ttfts.append(first - started)
        decode = "n/a"  # one token (or one chunk): no decode rate for this request
        if usage.completion_tokens > 1 and last > first:
            decode_rates.append((usage.completion_tokens - 1) / (last - first))
            decode = f"{decode_rates[-1]:.1f} tok/s"
        prompt_tokens.append(usage.prompt_tokens)
        completion_tokens.append(usage.completion_tokens)
        print(
            f"  request {i + 1}/{requests}: ttft {ttfts[-1] * 1000:.0f} ms, "
            f"{usage.completion_tokens} tokens, decode {decode}",
            flush=True,
        )
    await client.close()
    return {
        "requests": requests,
        "max_tokens": max_tokens,
        "prompt_tokens_mean": statistics.mean(prompt_tokens),
        "completion_tokens_mean": statistics.mean(completion_tokens),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "decode_tokens_per_s_p50": percentile(decode_rates, 50),
        "decode_tokens_per_s_mean": statistics.mean(decode_rates),
    }


async def run(args: argparse.Namespace) -> int:
    manifest = load_manifest(Path(args.models_dir) / LLM)
    async with AgentProcess(models_dir=args.models_dir, serve=[LLM]) as agent:
        print(f"agent {agent.url} serving {LLM} {manifest.version}", flush=True)
        figures = await measure(agent.url, args.requests, args.max_tokens)
    figures["variant"] = manifest.variant
    figures["version"] = manifest.version
    figures["artifact_bytes"] = sum(f.size for f in manifest.files)
    decode = float(figures["decode_tokens_per_s_p50"])  # type: ignore[arg-type]
    ttft = float(figures["ttft_p50_s"])  # type: ignore[arg-type]
    targets = {
        # what the plain ONNX Runtime loop reached on this machine class (MODELS-NOTES.md)
        "decode_tokens_per_s_p50": target(decode, ">= 30", decode >= 30),
        "ttft_p50_s": target(ttft, "<= 0.5", ttft <= 0.5),
    }
    path = write_results("single_stream", figures, targets)
    print(json.dumps(figures, indent=2))
    print(f"decode p50 {decode:.1f} tok/s, TTFT p50 {ttft * 1000:.0f} ms -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.single_stream", description=__doc__)
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
