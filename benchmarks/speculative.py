"""Prompt-lookup speculation (issue 30): decode speed with and without, side by side with
llama.cpp's prompt-lookup server, and whether the output stays the same.

Workloads (chat, temperature 0, up to ``--max-tokens`` tokens): ``summarise`` and
``extract`` over a ~600-token document (the first part of the memory-budget docs page),
``code_edit`` (a ~450-token Python file, asked back with one name changed), and
``control``: open-ended chat that repeats nothing. Four servers run at once on the same
cores and take each request in turn (one at a time), so machine noise falls on all four
alike: the agent with speculation off and on (``engine.speculative_tokens``), llama.cpp's
server (llama-cpp-python, the GGUF the ONNX artifact came from) plain and with
``--draft_model prompt-lookup-decoding``. Single-stream decode speed is completion tokens
after the first over the time from the first streamed token to the last; each request is
sent ``--repeats`` times to each server (the servers' order reversed every other time) and
a server's figure is the median over the repeats, so one noisy request does not decide a
ratio (the ratios of each repeat's on and off figures are recorded beside it).

Then at ``--concurrency`` (16) the agent with speculation off and on in turn: aggregate
tokens/s of a wave of the control and of the code edit (``--repeats`` waves each, the
order reversed every other time, the median wave's figure).

Agreement, in process on the same model: each workload's output with speculation against
without, greedy and seeded (two seeds, temperature 0.7): identical or the first
divergence's position and margin (greedy: the top-two logit gap; seeded: the exponential
race's top-two log ratio, in logits / temperature), with the non-speculative choice's
logits computed by a prefill of the common prefix.

    python -m benchmarks.speculative [--model smollm2-135m-instruct] [--threads 2]
        [--max-tokens 192] [--rounds 2] [--repeats 3] [--concurrency 16] [--skip-llamacpp]

``--model qwen2.5-coder-0.5b-instruct`` runs the code edit only (issue 30's second
model). Writes ``benchmarks/results/speculative.json`` (``speculative_<model>.json``).
Targets (issue 30): single-stream decode with speculation at least 1.8x without on each
repetitive workload and at least 1.5x llama.cpp's prompt-lookup figure; the control at
least 0.97x; at c = 16 aggregate at least 1.0x on the control and above 1.0x on the code edit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
import timeit
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openai

from benchmarks.llamacpp_server import LlamaCppServer
from benchmarks.results_file import target, write_results
from benchmarks.serving_vs_llamacpp import QWEN, SMOLLM2, gguf_of, timed_stream
from devtools.fleet import AgentProcess
from devtools.process import REPO_ROOT

# the workloads' texts, pinned: the first paragraphs of docs/operators/memory-budget.md and
# agent/engine/stops.py as of 4d1a769 (read from the live files before: an edit of the
# page at 18:31 changed the summarise and extract prompts between two runs)
DOCUMENT_SOURCE = REPO_ROOT / "benchmarks" / "data" / "speculative" / "document.md"
CODE_SOURCE = REPO_ROOT / "benchmarks" / "data" / "speculative" / "code.py.txt"
REPETITIVE = ("summarise", "extract", "code_edit")
SPECULATIVE_TOKENS = 6


def document() -> str:
    """About 600 tokens of prose (the memory-budget page's first paragraphs, pinned)."""
    return DOCUMENT_SOURCE.read_text().removesuffix("\n")


def workloads(model: str) -> dict[str, list[str]]:
    """Each workload's prompts (one per round, cycled)."""
    doc, code = document(), CODE_SOURCE.read_text()
    edit = [
        f"Here is a Python file:\n\n```python\n{code}```\n\nRename the class StopMatcher to "
        "StopStringMatcher. Answer with the whole edited file only.",
        f"Here is a Python file:\n\n```python\n{code}```\n\nRename the method feed to push "
        "everywhere. Answer with the whole edited file only.",
    ]
    if model == QWEN:
        return {"code_edit": edit}
    return {
        "summarise": [
            f"{doc}\n\nSummarise the text above in a few paragraphs, keeping its own wording.",
            f"{doc}\n\nRewrite the text above as a short briefing for an operator, quoting its "
            "key sentences.",
        ],
        "extract": [
            f"{doc}\n\nList every setting named in the text above, each with the sentence "
            "that describes it, quoted exactly.",
            f"{doc}\n\nQuote, word for word, every sentence of the text above that mentions "
            "memory.",
        ],
        "code_edit": edit,
        "control": [
            "Write a short story about a fox who learns to sail.",
            "Describe your ideal weekend in the mountains, in detail.",
        ],
    }


async def stream_one(
    client: openai.AsyncOpenAI, model: str, text: str, max_tokens: int
) -> dict[str, float]:
    t = await timed_stream(client, model, text, max_tokens, {"cache": False}, include_usage=True)
    first, last = t.first, t.last
    tokens = t.usage_tokens or t.chunks
    return {
        "tokens": tokens,
        "ttft_s": first - t.started,
        "decode_s": last - first,
        "decode_tps": (tokens - 1) / (last - first) if last > first else 0.0,
    }


async def single_stream(
    servers: dict[str, tuple[str, str]], prompts: dict[str, list[str]], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each workload's prompts, every round, ``--repeats`` times, on each server in turn
    (in reverse order every other time, so none always goes first). A server's figure is
    the median over the repeats of its decode tokens/s (each repeat: the tokens after the
    first over the decode time, summed over the rounds)."""
    clients = {
        name: (openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                  timeout=600), model)
        for name, (url, model) in servers.items()
    }  # fmt: skip
    repeats = getattr(args, "repeats", 1)
    runs: dict[str, dict[str, list[list[dict[str, float]]]]] = {
        w: {name: [[] for _ in range(repeats)] for name in servers} for w in prompts
    }
    for round_ in range(args.rounds):
        for workload, texts in prompts.items():
            text = texts[round_ % len(texts)]
            for repeat in range(repeats):
                order = list(clients.items())
                for name, (client, model) in order[:: -1 if repeat % 2 else 1]:
                    run = await stream_one(client, model, text, args.max_tokens)
                    runs[workload][name][repeat].append(run)
                    print(f"  {workload:<9} round {round_} repeat {repeat} {name:<16} "
                          f"{run['tokens']:>4} tokens {run['decode_tps']:7.1f} tok/s",
                          flush=True)  # fmt: skip
    for client, _ in clients.values():
        await client.close()
    figures: dict[str, dict[str, Any]] = {}
    for workload, by_server in runs.items():
        figures[workload] = {}
        for name, by_repeat in by_server.items():
            per_repeat = []
            for rs in by_repeat:
                seconds = sum(r["decode_s"] for r in rs)
                per_repeat.append(sum(r["tokens"] - 1 for r in rs) / seconds if seconds else 0.0)
            first_repeat = by_repeat[0]
            figures[workload][name] = {
                "decode_tokens_per_s": round(float(np.median(per_repeat)), 1),
                "decode_tokens_per_s_by_repeat": [round(v, 1) for v in per_repeat],
                "completion_tokens": [int(r["tokens"]) for r in first_repeat],
                "ttft_s": [round(r["ttft_s"], 3) for rs in by_repeat for r in rs],
            }
    return figures


async def aggregate(url: str, model: str, text: str, n: int, max_tokens: int) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=600)  # fmt: skip
    started = time.perf_counter()
    runs = await asyncio.gather(*(stream_one(client, model, text, max_tokens) for _ in range(n)))
    wall = time.perf_counter() - started
    await client.close()
    tokens = sum(int(r["tokens"]) for r in runs)
    return {"output_tokens": tokens, "wall_s": round(wall, 2),
            "aggregate_tokens_per_s": round(tokens / wall, 1)}  # fmt: skip


async def concurrent_waves(
    urls: dict[str, str], model: str, text: str, args: argparse.Namespace
) -> dict[str, Any]:
    """``--repeats`` waves of ``--concurrency`` requests on each server in turn (the order
    reversed every other time); a server's figures are its median wave's (by aggregate
    tokens/s), with every wave's aggregate beside them."""
    repeats = getattr(args, "repeats", 1)
    by: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
    for repeat in range(repeats):
        for name, url in list(urls.items())[:: -1 if repeat % 2 else 1]:
            by[name].append(await aggregate(url, model, text, args.concurrency, args.max_tokens))
    figures: dict[str, Any] = {}
    for name, waves in by.items():
        ranked = sorted(waves, key=lambda w: w["aggregate_tokens_per_s"])
        figures[name] = {
            **ranked[(len(ranked) - 1) // 2],
            "aggregate_tokens_per_s_by_repeat": [w["aggregate_tokens_per_s"] for w in waves],
        }
    return figures


def agreement(
    model: str, prompts: dict[str, list[str]], args: argparse.Namespace
) -> dict[str, Any]:
    """In process: each workload's first prompt, greedy and two seeds, speculation on vs off."""
    from agent.engine.causal_lm import CausalLM
    from agent.engine.continuous_batcher import BatcherConfig
    from agent.engine.interface import ChatMessage, GenerationRequest, SamplingParams
    from agent.engine.ort_session import SessionConfig, create_session
    from agent.engine.sampling import _seed_entropy
    from agent.engine.text_model import OnnxTextModel
    from agent.model_loader import causal_lm_spec, load_registry
    from models.manifest import load_manifest

    artifacts = Path(args.models_dir)
    directory = artifacts / model
    lm = CausalLM(
        create_session(directory / "model.onnx", SessionConfig(intra_op_threads=args.threads)),
        causal_lm_spec(directory, load_manifest(directory / "manifest.json")),
    )

    async def generate(k: int, text: str, params: SamplingParams) -> tuple[list[int], list[int]]:
        registry = load_registry(
            artifacts, [model], session_config=SessionConfig(intra_op_threads=args.threads),
            max_context_tokens=2048, batcher_config=BatcherConfig(speculative_tokens=k),
        )  # fmt: skip
        engine = registry.text_models[model]
        assert isinstance(engine, OnnxTextModel)
        await engine.start()
        chat = engine.apply_chat_template([ChatMessage(role="user", content=text)])
        prompt = engine.encode(chat)
        request = GenerationRequest("agreement", prompt, params)
        tokens = [t async for o in engine.generate(request) for t in o.token_ids]
        await engine.close()
        return prompt, tokens

    cases: list[dict[str, Any]] = []
    for workload, texts in prompts.items():
        for params in (
            SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
            SamplingParams(temperature=0.7, seed=1, max_tokens=args.max_tokens),
            SamplingParams(temperature=0.7, seed=2, max_tokens=args.max_tokens),
        ):
            prompt, plain = asyncio.run(generate(0, texts[0], params))
            _, spec = asyncio.run(generate(SPECULATIVE_TOKENS, texts[0], params))
            at = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b),
                      None)  # fmt: skip
            case: dict[str, Any] = {"workload": workload, "seed": params.seed,
                                    "identical": plain == spec, "tokens": len(plain)}  # fmt: skip
            if at is not None:
                ids = np.array([prompt + plain[:at]], dtype=np.int64)
                n = ids.shape[1]
                logits = lm.run(lm.new_cache(1), 0, ids, np.array([n]), np.array([[n - 1]]))
                row = logits[0, 0].astype(np.float64)
                if params.greedy:
                    top = np.sort(row)[-2:]
                    margin = float(top[1] - top[0])
                else:
                    assert params.seed is not None
                    probs = np.exp((row - row.max()) / params.temperature)
                    probs /= probs.sum()
                    rng = np.random.default_rng([_seed_entropy(params.seed), at])
                    race = np.sort(probs / rng.standard_exponential(probs.shape[0]))[-2:]
                    margin = math.log(race[1] / race[0])
                case.update(first_divergence=at, margin=round(margin, 3))
            elif len(plain) != len(spec):
                case.update(first_divergence=min(len(plain), len(spec)), margin=None)
            print(f"  agreement {json.dumps(case)}", flush=True)
            cases.append(case)
    lm.close()
    greedy = [c for c in cases if c["seed"] is None]
    seeded = [c for c in cases if c["seed"] is not None]
    return {
        "cases": cases,
        "greedy_identical_share": round(sum(c["identical"] for c in greedy) / len(greedy), 2),
        "seeded_identical_share": round(sum(c["identical"] for c in seeded) / len(seeded), 2),
    }


class PromptLookupLlamaCpp(LlamaCppServer):
    """llama-cpp-python's server with its prompt-lookup draft (``--draft_model``)."""

    def __init__(self, gguf: Path, port: int, threads: int, tokens: int) -> None:
        super().__init__(gguf, port, threads)
        self.args += ["--draft_model", "prompt-lookup-decoding",
                      "--draft_model_num_pred_tokens", str(tokens)]  # fmt: skip


async def serve_and_measure(args: argparse.Namespace) -> dict[str, Any]:
    model = args.model
    prompts = workloads(model)
    base_args = ["--threads", str(args.threads), "--set", "cache.enabled=false",
                 "--set", f"engine.max_running={args.concurrency}"]  # fmt: skip
    on = ["--set", f"engine.speculative_tokens={SPECULATIVE_TOKENS}"]
    figures: dict[str, Any] = {}
    async with (
        AgentProcess(models_dir=args.models_dir, serve=[model], extra_args=base_args) as plain,
        AgentProcess(models_dir=args.models_dir, serve=[model], extra_args=base_args + on) as spec,
    ):
        servers = {"edgefleet": (plain.url, model), "edgefleet_spec": (spec.url, model)}
        llama: list[LlamaCppServer] = []
        stack = contextlib.AsyncExitStack()
        if not args.skip_llamacpp:
            gguf = gguf_of(model)
            llama = [
                LlamaCppServer(gguf, args.llamacpp_port, args.threads),
                PromptLookupLlamaCpp(gguf, args.llamacpp_port + 1, args.threads, 10),
            ]
            for server in llama:
                await stack.enter_async_context(server)
            servers["llamacpp"] = (llama[0].url, model)
            servers["llamacpp_lookup"] = (llama[1].url, model)
            figures["llamacpp_build"] = {
                k: llama[0].build[k] for k in ("llama_cpp_python", "cmake_args")
            }
        try:
            warm = {w: [t[0]] for w, t in list(prompts.items())[:1]}
            warm_args = argparse.Namespace(
                **{**vars(args), "rounds": 1, "repeats": 1, "max_tokens": 16}
            )
            await single_stream(servers, warm, warm_args)  # pages the weights in
            figures["single_stream"] = await single_stream(servers, prompts, args)
        finally:
            await stack.aclose()  # llama.cpp's servers go before the concurrent waves
        waves: dict[str, Any] = {}
        for workload in ("control", "code_edit"):
            if workload not in prompts:
                continue
            text = prompts[workload][0]
            waves[workload] = await concurrent_waves(
                {"edgefleet": plain.url, "edgefleet_spec": spec.url}, model, text, args
            )
            print(f"  c={args.concurrency} {workload}: {json.dumps(waves[workload])}", flush=True)
        figures["concurrent"] = {"concurrency": args.concurrency, "workloads": waves}
    return figures


def ratios_and_targets(figures: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    single = figures["single_stream"]
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for workload, by in single.items():
        ours = by["edgefleet_spec"]["decode_tokens_per_s"]
        r: dict[str, Any] = {"vs_off": round(ours / by["edgefleet"]["decode_tokens_per_s"], 2)}
        if "decode_tokens_per_s_by_repeat" in by["edgefleet"]:  # on / off within each repeat
            r["vs_off_by_repeat"] = [
                round(on / off, 2) if off else 0.0
                for on, off in zip(by["edgefleet_spec"]["decode_tokens_per_s_by_repeat"],
                                   by["edgefleet"]["decode_tokens_per_s_by_repeat"], strict=True)
            ]  # fmt: skip
        if "llamacpp_lookup" in by:
            r["vs_llamacpp_lookup"] = round(ours / by["llamacpp_lookup"]["decode_tokens_per_s"], 2)
            r["llamacpp_lookup_vs_plain"] = round(
                by["llamacpp_lookup"]["decode_tokens_per_s"]
                / by["llamacpp"]["decode_tokens_per_s"],
                2,
            )
        ratios[workload] = r
        if workload in REPETITIVE:
            targets[f"{workload}_decode_vs_off"] = target(r["vs_off"], ">= 1.8", r["vs_off"] >= 1.8)
            if "vs_llamacpp_lookup" in r:
                v = r["vs_llamacpp_lookup"]
                targets[f"{workload}_decode_vs_llamacpp_lookup"] = target(v, ">= 1.5", v >= 1.5)
        else:
            targets[f"{workload}_decode_vs_off"] = target(
                r["vs_off"], ">= 0.97", r["vs_off"] >= 0.97
            )
    for workload, by in figures["concurrent"]["workloads"].items():
        v = round(by["edgefleet_spec"]["aggregate_tokens_per_s"]
                  / by["edgefleet"]["aggregate_tokens_per_s"], 2)  # fmt: skip
        ratios[f"{workload}_c{figures['concurrent']['concurrency']}_aggregate_vs_off"] = v
        bound, met = (">= 1.0", v >= 1.0) if workload == "control" else ("> 1.0", v > 1.0)
        targets[f"{workload}_aggregate_vs_off"] = target(v, bound, met)
    return ratios, targets


def machine_noise() -> dict[str, float]:
    """How busy the shared machine was: ``sum(range(100))``'s best time and the load."""
    best = min(timeit.repeat("sum(range(100))", number=200_000, repeat=5)) / 200_000
    return {"sum_range_100_ns": round(best * 1e9), "load_1min": os.getloadavg()[0]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=SMOLLM2, choices=(SMOLLM2, QWEN))
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--llamacpp-port", type=int, default=8931)
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-agreement", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    noise = {"before": machine_noise()}
    figures = asyncio.run(serve_and_measure(args))
    figures.update(model=args.model, threads=args.threads, max_tokens=args.max_tokens,
                   rounds=args.rounds, repeats=args.repeats,
                   speculative_tokens=SPECULATIVE_TOKENS)  # fmt: skip
    if not args.skip_agreement:
        figures["agreement"] = agreement(args.model, workloads(args.model), args)
    noise["after"] = machine_noise()
    figures["machine_noise"] = noise
    ratios, targets = ratios_and_targets(figures)
    figures["ratios"] = ratios
    figures["run_s"] = round(time.perf_counter() - started)
    name = "speculative" if args.model == SMOLLM2 else f"speculative_{args.model}"
    path = write_results(name, figures, targets)
    print("\nratios:", json.dumps(ratios))
    for key, t in targets.items():
        print(f"  {key}: {t['value']} (target {t['target']}) {'MET' if t['met'] else 'NOT MET'}")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
