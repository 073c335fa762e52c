"""Concurrent serving throughput and latency: edgefleet's agent vs llama.cpp, same model.

Both serve ``--model`` (ours: the shipped ONNX artifact; llama.cpp: the GGUF it was
converted from) on the same cores, one after the other: ``smollm2-135m-instruct`` (the
default) or ``qwen2.5-coder-0.5b-instruct``. At each concurrency a wave of
streamed chat requests (~100-token prompts, exactly 128 output tokens via ``min_tokens``,
temperature 0) is sent over HTTP with the ``openai`` SDK.

Prompts: ``shared`` (the default) are one story that ends in a different number, so they
share their first ~100 tokens, as chat requests share a system prompt; both servers reuse
the shared part (llama.cpp keeps its last prompt's cache, edgefleet its prefix cache).
``distinct`` puts the number first, so nothing past the chat template is shared and every
prompt is prefilled in full: the cold-prefill picture.

    python -m benchmarks.serving_vs_llamacpp [--model NAME] [--prompts shared|distinct]
        [--concurrency 1 4 16 32] [--threads 2]

Targets: SmolLM2's (single-stream decode at least llama.cpp's, TTFT p50 at c = 1 at most
llama.cpp's, aggregate at c = 16 at least 3x, TTFT p50 at c = 16 at most 2 s); Qwen's
(issue 25): aggregate tokens/s at least 1.0x llama.cpp's at c = 1 and at least 3x at c = 16
(its default concurrencies: 1 4 16).

Memory (issue 25): each server's resident set (``VmRSS``) once idle after its last wave
(``IDLE_S`` later: the agent frees its key/value slots, trims the heap and unmaps the
weight pages serving read when idle) and its peak (``VmHWM``), and the same agent serving
only the tiny test model (``tiny-llama``, a few MiB; an agent will not start with no
model), so the model's own share is the difference: once loaded and warmed up (one
request, then idle), and after the run, when the prefix cache holds what the waves left
(its bytes read from the agent's ``edgefleet_agent_kv_cache_bytes``; llama.cpp's 2048-token
context, its cache, is inside its resident set from the start). Targets: the agent idle
after the run at most llama.cpp's RSS idle (both models) and SmolLM2's extra RSS loaded and
idle at most 130 MiB.

Writes ``benchmarks/results/serving_vs_llamacpp.json`` (``..._distinct.json``) for SmolLM2,
``serving_vs_llamacpp_<model>.json`` (``..._<model>_distinct.json``) for another model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai

from benchmarks.llamacpp_server import LlamaCppServer
from benchmarks.results_file import percentile, target, write_results
from devtools.fleet import AgentProcess
from devtools.process import REPO_ROOT
from models.manifest import load_manifest

SMOLLM2 = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"
MODELS = (SMOLLM2, QWEN)
DEFAULT_CONCURRENCY = {SMOLLM2: [1, 4, 16, 32], QWEN: [1, 4, 16]}
STORY = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after many "
    "winters of salt and wind. Every evening the keeper climbed the spiral stairs, counted "
    "the steps out of habit, and lit the great lamp that warned ships away from the rocks. "
    "One night, as a storm rolled in from the west, he noticed a small light bobbing on the "
    "water, far too close to the shore. Write what happens next, in detail. Story number"
)


def prompt(i: int, prompts: str) -> str:
    """Prompt ``i`` of the ``shared`` or ``distinct`` set (see the module docstring)."""
    if prompts == "distinct":
        return f"Story number {i}. {STORY.removesuffix(' Story number')}"
    return f"{STORY} {i}."


@dataclass
class StreamTiming:
    """One streamed chat completion as a client saw it (``time.perf_counter`` seconds)."""

    started: float  # the request sent
    first: float  # the first chunk with text
    last: float  # the last chunk with text
    chunks: int  # chunks with text
    usage_tokens: int  # the usage chunk's completion tokens (0: none asked or sent)


async def timed_stream(
    client: openai.AsyncOpenAI,
    model: str,
    text: str,
    max_tokens: int,
    extra_body: dict[str, Any],
    include_usage: bool = False,
) -> StreamTiming:
    """Streams one greedy chat completion of ``text`` and times its text chunks (this
    benchmark's and ``benchmarks.speculative``'s one timing loop)."""
    started = time.perf_counter()
    first = last = None
    chunks = 0
    usage = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=extra_body,
        stream_options={"include_usage": True} if include_usage else openai.omit,
    )
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
    assert first is not None and last is not None, "no tokens streamed"
    return StreamTiming(started, first, last, chunks, usage)


async def one_request(
    client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int, prompts: str
) -> dict[str, float]:
    t = await timed_stream(client, model, prompt(i, prompts), max_tokens,
                           {"min_tokens": max_tokens, "cache": False})  # fmt: skip
    chunks, first, last = t.chunks, t.first, t.last
    return {
        "ttft": first - t.started,
        "chunks": chunks,
        "decode_tps": (chunks - 1) / (last - first) if chunks > 1 and last > first else 0.0,
        "end": last - t.started,
    }


async def wave(
    url: str, model: str, concurrency: int, max_tokens: int, base: int, prompts: str
) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=600)  # fmt: skip
    requests = 5 if concurrency == 1 else concurrency
    results: list[dict[str, float]] = []
    started = time.perf_counter()
    if concurrency == 1:
        for i in range(requests):
            results.append(await one_request(client, model, base + i, max_tokens, prompts))
    else:
        results = await asyncio.gather(
            *(one_request(client, model, base + i, max_tokens, prompts) for i in range(requests))
        )
    wall = time.perf_counter() - started
    await client.close()
    tokens = sum(r["chunks"] for r in results)
    ttfts = [r["ttft"] for r in results]
    return {
        "requests": requests,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "aggregate_tokens_per_s": round(tokens / wall, 2),
        "ttft_p50_s": round(percentile(ttfts, 50), 3),
        "ttft_p99_s": round(percentile(ttfts, 99), 3),
        "decode_tokens_per_s_p50": round(percentile([r["decode_tps"] for r in results], 50), 2),
    }


async def scrape_steps(url: str) -> dict[str, float]:
    """Sums and counts of the agent's engine step histogram, by part."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("edgefleet_agent_step_seconds_sum") or line.startswith(
            "edgefleet_agent_step_seconds_count"
        ):
            name, value = line.rsplit(" ", 1)
            part = name.split('part="')[1].split('"')[0]
            kind = "sum" if "_sum" in name else "count"
            found[f"{part}_{kind}"] = float(value)
        elif line.startswith('edgefleet_agent_kv_cache_bytes{part="prefix"}'):
            found["prefix_cache_bytes"] = float(line.rsplit(" ", 1)[1])
    return found


IDLE_S = 5.0  # after the last wave, before the idle resident set is read
EXTRA_RSS_TARGET_MIB = {SMOLLM2: 130.0}


def memory_mib(pid: int) -> dict[str, float]:
    """A process's resident set now and at its peak (MiB), from /proc/PID/status."""
    fields = {"VmRSS:": "rss_mib", "VmHWM:": "peak_rss_mib"}
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition("\t")
        if name in fields:
            out[fields[name]] = round(int(rest.split()[0]) / 1024, 1)
    return out


async def idle_memory(pid: int) -> dict[str, float]:
    await asyncio.sleep(IDLE_S)
    return memory_mib(pid)


BASELINE_MODEL = "tiny-llama"  # the test suite's random model: 2 layers, a few MiB


async def agent_without_models(args: argparse.Namespace) -> dict[str, float]:
    """An agent's resident set with next to no model: serving the tiny test model (an agent
    refuses to start with none), idle after one request."""
    if not (Path(args.models_dir) / BASELINE_MODEL / "manifest.json").exists():
        raise SystemExit(
            f"{BASELINE_MODEL} is not in {args.models_dir}: python -m models build "
            f"--only {BASELINE_MODEL} (the agent's own memory is measured with it)"
        )
    async with AgentProcess(
        models_dir=args.models_dir,
        serve=[BASELINE_MODEL],
        extra_args=["--threads", str(args.threads), "--set", "cache.enabled=false"],
    ) as agent:
        async with openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key="unused", max_retries=0
        ) as client:
            await client.completions.create(model=BASELINE_MODEL, prompt="Hello", max_tokens=8)
        return await idle_memory(agent.pid)


def profile(
    before: dict[str, float], after: dict[str, float], client_tpot: float
) -> dict[str, float]:
    steps = after["total_count"] - before["total_count"]
    if steps <= 0:
        return {}
    per = {p: (after[f"{p}_sum"] - before[f"{p}_sum"]) / steps for p in ("ort", "sample", "total")}
    return {
        "steps": steps,
        "step_ms": round(per["total"] * 1000, 2),
        "ort_ms": round(per["ort"] * 1000, 2),
        "sampling_ms": round(per["sample"] * 1000, 2),
        "scheduling_ms": round((per["total"] - per["ort"] - per["sample"]) * 1000, 2),
        # what a streaming client sees per token beyond one engine step: HTTP, SSE, SDK
        "http_ms_per_token": round(max(0.0, client_tpot - per["total"]) * 1000, 2),
    }


def gguf_of(model: str) -> Path:
    """The GGUF ``model``'s shipped artifact was converted from (imported here: a source's
    locator is only needed, and only has to exist, for the model asked for)."""
    if model == QWEN:
        from models.sources import locate_qwen_gguf

        return locate_qwen_gguf().path
    from models.sources import SMOLLM2 as SMOLLM2_GGUF
    from models.sources import locate

    return locate(SMOLLM2_GGUF).path


def results_name(model: str, prompts: str) -> str:
    """SmolLM2's file keeps its name (``serving_vs_llamacpp[_distinct]``); another model's
    is named after it."""
    name = "serving_vs_llamacpp" + ("" if model == SMOLLM2 else f"_{model}")
    return name + ("" if prompts == "shared" else f"_{prompts}")


def model_targets(
    model: str, ours: dict[str, Any], theirs: dict[str, Any], ratios: dict[str, float]
) -> dict[str, Any]:
    """The targets for ``model`` from the waves at each concurrency (keys "1", "16", ...):
    the ones measured are recorded, met or not."""
    targets: dict[str, Any] = {}
    if model == QWEN:  # issue 25
        if "1" in ratios:
            targets["aggregate_ratio_c1"] = target(ratios["1"], ">= 1.0", ratios["1"] >= 1.0)
        if "16" in ratios:
            targets["aggregate_ratio_c16"] = target(ratios["16"], ">= 3.0", ratios["16"] >= 3.0)
        return targets
    if "1" in ours:
        single = ours["1"]["decode_tokens_per_s_p50"] / theirs["1"]["decode_tokens_per_s_p50"]
        targets["single_stream_decode_ratio"] = target(round(single, 2), ">= 1.0", single >= 1.0)
        ttft1, ttft1_l = ours["1"]["ttft_p50_s"], theirs["1"]["ttft_p50_s"]
        targets["ttft_p50_c1_s"] = target(ttft1, f"<= llama.cpp's {ttft1_l}", ttft1 <= ttft1_l)
    if "16" in ours:
        targets["aggregate_ratio_c16"] = target(ratios["16"], ">= 3.0", ratios["16"] >= 3.0)
        ttft16 = ours["16"]["ttft_p50_s"]
        targets["ttft_p50_c16_s"] = target(ttft16, "<= 2.0", ttft16 <= 2.0)
    return targets


def memory_targets(
    model: str, ours: dict[str, float] | None, theirs: dict[str, float] | None
) -> dict[str, Any]:
    """Issue 25's memory targets, when both sides' idle resident sets were read."""
    if not ours or not theirs:
        return {}
    targets: dict[str, Any] = {}
    rss, rss_l = ours["rss_mib"], theirs["rss_mib"]
    targets["idle_rss_mib"] = target(rss, f"<= llama.cpp's {rss_l}", rss <= rss_l)
    limit = EXTRA_RSS_TARGET_MIB.get(model)
    if limit is not None and "extra_rss_loaded_idle_mib" in ours:
        extra = ours["extra_rss_loaded_idle_mib"]
        targets["extra_rss_loaded_idle_mib"] = target(extra, f"<= {limit}", extra <= limit)
    return targets


def ttft_p50(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, dict[str, float]]:
    """TTFT p50 at each concurrency, ours beside llama.cpp's (seconds)."""
    return {
        c: {"edgefleet": ours[c]["ttft_p50_s"], "llamacpp": theirs[c]["ttft_p50_s"]}
        for c in ours
        if c in theirs
    }


async def run(args: argparse.Namespace) -> int:
    model = args.model
    args.concurrency = args.concurrency or DEFAULT_CONCURRENCY[model]
    manifest = load_manifest(Path(args.models_dir) / model)
    gguf = gguf_of(model)
    ours: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    agent_args = ["--threads", str(args.threads),
                  "--set", f"engine.max_running={max(args.concurrency)}",
                  "--set", "cache.enabled=false"]  # fmt: skip
    for item in args.agent_set:
        agent_args += ["--set", item]
    bare = await agent_without_models(args)
    print(f"edgefleet agent without a model: {json.dumps(bare)}", flush=True)
    print(f"edgefleet agent: {model} {manifest.version}, {args.threads} threads", flush=True)
    async with AgentProcess(
        models_dir=args.models_dir, serve=[model], extra_args=agent_args
    ) as agent:
        await wave(agent.url, model, 1, 64, 10_000, args.prompts)  # warm-up (pages the weights in)
        loaded = await idle_memory(agent.pid)  # the model loaded, warmed up, idle
        for c in args.concurrency:
            before = await scrape_steps(agent.url)
            ours[str(c)] = await wave(agent.url, model, c, args.max_tokens, 1000 * c, args.prompts)
            after = await scrape_steps(agent.url)
            tpot = 1 / ours[str(c)]["decode_tokens_per_s_p50"] if ours[str(c)][
                "decode_tokens_per_s_p50"] else 0.0  # fmt: skip
            ours[str(c)]["profile"] = profile(before, after, tpot)
            print(f"  ours  c={c:<3} {json.dumps(ours[str(c)])}", flush=True)
        memory = await idle_memory(agent.pid)
        memory["without_model_rss_mib"] = bare["rss_mib"]
        memory["loaded_idle_rss_mib"] = loaded["rss_mib"]
        memory["extra_rss_loaded_idle_mib"] = round(loaded["rss_mib"] - bare["rss_mib"], 1)
        memory["extra_rss_mib"] = round(memory["rss_mib"] - bare["rss_mib"], 1)
        prefix = (await scrape_steps(agent.url)).get("prefix_cache_bytes", 0.0)
        memory["prefix_cache_mib"] = round(prefix / (1 << 20), 1)
        ours["memory"] = memory
        print(f"  ours  memory {json.dumps(memory)}", flush=True)
    if args.skip_llamacpp:
        print("--skip-llamacpp: no comparison, results not written")
        return 0
    print(f"llama.cpp server: {gguf.name}, {args.threads} threads", flush=True)
    async with LlamaCppServer(gguf, args.llamacpp_port, args.threads) as server:
        llamacpp_build = {
            k: server.build[k] for k in ("llama_cpp_python", "cmake_args", "amx_probe")
        }
        await wave(server.url, model, 1, 64, 10_000, args.prompts)  # warm-up
        for c in args.concurrency:
            theirs[str(c)] = await wave(
                server.url, model, c, args.max_tokens, 1000 * c, args.prompts
            )
            print(f"  llama c={c:<3} {json.dumps(theirs[str(c)])}", flush=True)
        theirs["memory"] = await idle_memory(server.pid)
        print(f"  llama memory {json.dumps(theirs['memory'])}", flush=True)

    ratios = {
        str(c): round(
            ours[str(c)]["aggregate_tokens_per_s"] / theirs[str(c)]["aggregate_tokens_per_s"], 2
        )
        for c in args.concurrency
    }
    memories = {"edgefleet": ours.pop("memory"), "llamacpp": theirs.pop("memory")}
    figures: dict[str, Any] = {
        "model": model,
        "variant": manifest.variant,
        "version": manifest.version,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "prompts": args.prompts,
        "edgefleet": ours,
        "llamacpp": theirs,
        "llamacpp_build": llamacpp_build,  # what its venv was compiled for (llamacpp_build.py)
        "aggregate_ratio_vs_llamacpp": ratios,
        "memory_mib": memories,
    }
    if model != SMOLLM2:  # SmolLM2's file keeps its fields
        figures["gguf"] = gguf.name
        figures["ttft_p50_s"] = ttft_p50(ours, theirs)
    targets = model_targets(model, ours, theirs, ratios)
    targets.update(memory_targets(model, memories["edgefleet"], memories["llamacpp"]))
    path = write_results(results_name(model, args.prompts), figures, targets)
    print("\nratios (ours / llama.cpp, aggregate tokens/s):", ratios)
    for name, t in targets.items():
        print(f"  {name}: {t['value']} (target {t['target']}) {'MET' if t['met'] else 'NOT MET'}")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serving_vs_llamacpp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--prompts", choices=["shared", "distinct"], default="shared")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="default: 1 4 16 32 for SmolLM2, 1 4 16 for Qwen",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llamacpp-port", type=int, default=8765)
    parser.add_argument(
        "--agent-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="extra agent config for this run, e.g. engine.max_batched_tokens=512",
    )
    parser.add_argument("--skip-llamacpp", action="store_true", help="measure the agent only")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
