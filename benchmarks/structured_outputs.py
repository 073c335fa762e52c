"""Structured outputs on the real model: validity, throughput cost, mask time, tool choice.

Runs an agent serving SmolLM2-135M-Instruct and, in one sitting:

1. validity: the 30 schemas of ``benchmarks/structured_schemas.py`` as ``response_format``
   json_schema requests (max_tokens 512, temperature 0, compact JSON): how many outputs
   parse and validate (an output cut by max_tokens is a failure);
2. throughput: the same requests constrained and unconstrained (the unconstrained copy
   asks for exactly as many tokens, via min_tokens), at concurrency 1 and 16: aggregate
   decode tokens/s and their ratio (target >= 0.9);
3. mask time: every output's tokens replayed through the agent's own grammar matcher
   (``agent.structured``, llguidance) in this process, timing each token's mask: p50/p99;
   the same paths through outlines-core (index build and mask time) for the comparison that
   chose llguidance;
4. tool choice with ``tool_choice: auto`` on 20 prompts whose right answer is known (10
   should call a tool, 10 should answer in text): a figure to report, not a target;
5. llama.cpp's server (llama-cpp-python) on the same schemas and GGUF, unless
   ``--skip-llamacpp``: it takes a schema as ``response_format: {"type": "json_object",
   "schema": ...}`` and converts it to its own GBNF grammar.

    python -m benchmarks.structured_outputs [--schemas 30] [--skip-llamacpp]

Writes ``benchmarks/results/structured_outputs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema_rs
import numpy as np

from agent.engine.text_codec import load_tokenizer
from agent.structured.grammar import GrammarCompiler, closed_objects
from agent.structured.spec import parse_response_format
from benchmarks.llamacpp_server import LlamaCppServer
from benchmarks.results_file import percentile, target, write_results
from benchmarks.structured_schemas import SCHEMAS, TOOL_PROMPTS, TOOLS
from devtools.fleet import AgentProcess
from devtools.process import REPO_ROOT
from models.manifest import load_manifest

LLM = "smollm2-135m-instruct"
MAX_TOKENS = 512


def schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def valid(schema: dict[str, Any], text: str, finish: str) -> bool:
    if finish != "stop":
        return False  # cut by max_tokens: a failure
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return bool(jsonschema_rs.validator_for(schema).is_valid(value))


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        data: dict[str, Any] = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {data}")
        return data


def chat_body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": LLM,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


async def timed_wave(
    http: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[list[dict[str, Any]], float]:
    """Responses in order and the wall time, ``concurrency`` requests in flight at most."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            return await post(http, url, body)

    started = time.perf_counter()
    replies = await asyncio.gather(*(one(b) for b in bodies))
    return list(replies), time.perf_counter() - started


async def wave_tokens(
    http: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[int, float]:
    replies, wall = await timed_wave(http, url, bodies, concurrency)
    return sum(r["usage"]["completion_tokens"] for r in replies), wall


async def agent_side(url: str, schemas: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        await post(http, url, chat_body("Hello", max_tokens=16, cache=False))  # warm-up
        constrained = [
            chat_body(prompt, response_format=schema_format(name, schema), cache=False,
                      return_token_ids=True)
            for name, prompt, schema in schemas
        ]  # fmt: skip
        # validity, one at a time (grammars compiled on first use: counted in this wave)
        replies, wall = await timed_wave(http, url, constrained, 1)
        rows = []
        for (name, _, schema), reply in zip(schemas, replies, strict=True):
            choice = reply["choices"][0]
            rows.append({
                "schema": name,
                "valid": valid(schema, choice["message"]["content"], choice["finish_reason"]),
                "finish_reason": choice["finish_reason"],
                "completion_tokens": reply["usage"]["completion_tokens"],
                "token_ids": choice["token_ids"],
            })  # fmt: skip
        out["validity"] = rows
        throughput: dict[str, Any] = {}
        for c in (1, 16):
            # constrained first; then the same prompts unconstrained, each asking for exactly
            # as many tokens as its constrained twin produced in this wave (outputs batched
            # 16 at a time may differ from single ones: batch numerics move greedy paths)
            waves: dict[str, float] = {}
            replies, wall = await timed_wave(http, url, constrained, c)
            lengths = [r["usage"]["completion_tokens"] for r in replies]
            free = [
                chat_body(prompt, max_tokens=n, min_tokens=n, cache=False)
                for (_, prompt, _), n in zip(schemas, lengths, strict=True)
            ]
            waves["constrained_valid"] = sum(
                valid(
                    schema, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]
                )
                for (_, _, schema), r in zip(schemas, replies, strict=True)
            )
            for label, (tokens, took) in (
                ("constrained", (sum(lengths), wall)),
                ("unconstrained", await wave_tokens(http, url, free, c)),
            ):
                waves[f"{label}_tokens"] = tokens
                waves[f"{label}_wall_s"] = round(took, 3)
                waves[f"{label}_tokens_per_s"] = round(tokens / took, 2)
            waves["ratio"] = round(
                waves["constrained_tokens_per_s"] / waves["unconstrained_tokens_per_s"], 3
            )
            throughput[str(c)] = waves
            print(f"  c={c}: {json.dumps(waves)}", flush=True)
        out["throughput"] = throughput
        # tool choice with auto
        tool_rows = []
        for prompt, should_call in TOOL_PROMPTS:
            reply = await post(
                http,
                url,
                chat_body(prompt, tools=TOOLS, tool_choice="auto", max_tokens=128, cache=False),
            )
            choice = reply["choices"][0]
            called = choice["finish_reason"] == "tool_calls"
            tool_rows.append({"prompt": prompt, "should_call": should_call, "called": called})
        out["tool_choice"] = tool_rows
    return out


def mask_times(tokenizer_file: Path, eos: list[int], schemas: list[Any], rows: list[Any],
               outlines_schemas: int) -> dict[str, Any]:  # fmt: skip
    """Each output's tokens replayed through llguidance (the agent's matcher) and, for the
    first ``outlines_schemas`` schemas, outlines-core, timing each token's mask."""
    tokenizer = load_tokenizer(tokenizer_file)
    compiler = GrammarCompiler(tokenizer.to_str(), eos, tokenizer.get_vocab_size(True))
    llg_ms: list[float] = []
    llg_cpu_ms: list[float] = []  # the thread's CPU time: without preemption on a busy machine
    compile_s: list[float] = []
    for (name, _, schema), row in zip(schemas, rows, strict=True):
        spec = parse_response_format(schema_format(name, schema))
        assert spec is not None
        compiled = compiler.compile_now(spec)
        compile_s.append(compiled.compile_s)
        matcher = compiled.new_matcher()
        for token in row["token_ids"]:
            c0, t0 = time.thread_time(), time.perf_counter()
            matcher.allowed()
            llg_ms.append((time.perf_counter() - t0) * 1000)
            llg_cpu_ms.append((time.thread_time() - c0) * 1000)
            matcher.advance(token)
    figures: dict[str, Any] = {
        "llguidance": {
            "tokens": len(llg_ms),
            "mask_ms_p50": round(percentile(llg_ms, 50), 4),
            "mask_ms_p99": round(percentile(llg_ms, 99), 4),
            "mask_ms_max": round(max(llg_ms), 4),
            "mask_cpu_ms_p50": round(percentile(llg_cpu_ms, 50), 4),
            "mask_cpu_ms_p99": round(percentile(llg_cpu_ms, 99), 4),
            "compile_s_p50": round(percentile(compile_s, 50), 4),
            "compile_s_max": round(max(compile_s), 4),
        }
    }
    figures["outlines_core"] = outlines_times(tokenizer_file, schemas, rows, outlines_schemas)
    return figures


def outlines_times(
    tokenizer_file: Path, schemas: list[Any], rows: list[Any], count: int
) -> dict[str, Any]:
    import outlines_core  # the comparison only: the agent never imports it

    data = json.loads(tokenizer_file.read_text())
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):  # GPT-2's byte-to-character table, reversed below
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    to_byte = {chr(c): b for b, c in zip(printable, chars, strict=True)}
    special = {t["id"] for t in data["added_tokens"]}
    vocab: dict[bytes, list[int]] = {}
    for text, i in data["model"]["vocab"].items():
        if i in special or any(ch not in to_byte for ch in text):
            continue
        vocab.setdefault(bytes(to_byte[ch] for ch in text), []).append(i)
    vocabulary = outlines_core.Vocabulary(2, vocab)
    size = (len(data["model"]["vocab"]) + 31) // 32
    mask = np.zeros(size, dtype=np.int32)
    build_s: list[float] = []
    ms: list[float] = []
    for (_, _, schema), row in list(zip(schemas, rows, strict=True))[:count]:
        regex = outlines_core.json_schema.build_regex_from_schema(
            json.dumps(closed_objects(schema)), whitespace_pattern=""
        )
        t0 = time.perf_counter()
        guide = outlines_core.Guide(outlines_core.Index(regex, vocabulary))
        build_s.append(time.perf_counter() - t0)
        for token in row["token_ids"]:
            if guide.is_finished():
                break
            t0 = time.perf_counter()
            guide.write_mask_into(mask.ctypes.data, mask.size, 4)
            ms.append((time.perf_counter() - t0) * 1000)
            guide.advance(token, return_tokens=False)
    return {
        "schemas": count,
        "tokens": len(ms),
        "index_build_s_p50": round(percentile(build_s, 50), 3) if build_s else None,
        "index_build_s_max": round(max(build_s), 3) if build_s else None,
        "mask_ms_p50": round(percentile(ms, 50), 4) if ms else None,
        "mask_ms_p99": round(percentile(ms, 99), 4) if ms else None,
    }


async def llamacpp_side(gguf: Path, port: int, threads: int, schemas: list[Any]) -> dict[str, Any]:
    """The schemas through llama.cpp's server, one at a time. A request that brings the
    server down (seen: its GBNF conversion of some string patterns) counts as a failure and
    the server is started again for the next schema."""
    rows = []
    tokens = 0
    busy = 0.0  # time spent in answered requests (tokens/s over these)
    server = LlamaCppServer(gguf, port, threads)
    await server.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
            await post(http, server.url, chat_body("Hello", max_tokens=16))  # warm-up
            for name, prompt, schema in schemas:
                body = chat_body(prompt, response_format={"type": "json_object", "schema": schema})
                started = time.perf_counter()
                try:
                    reply = await post(http, server.url, body)
                except (aiohttp.ClientError, RuntimeError) as exc:
                    error = f"{type(exc).__name__}: {exc}"[:200]
                    rows.append({"schema": name, "finish_reason": None, "valid": False,
                                 "completion_tokens": 0, "error": error})  # fmt: skip
                    await server.kill()  # whatever state it is in: a fresh one for the next
                    server = LlamaCppServer(gguf, port, threads)
                    await server.start()
                    continue
                busy += time.perf_counter() - started
                choice = reply["choices"][0]
                text = choice["message"]["content"] or ""
                n = reply["usage"]["completion_tokens"]
                tokens += n
                rows.append({"schema": name, "finish_reason": choice["finish_reason"],
                             "valid": valid(schema, text, choice["finish_reason"]),
                             "completion_tokens": n})  # fmt: skip
    finally:
        await server.kill()
    return {
        "build": {k: server.build[k] for k in ("llama_cpp_python", "cmake_args", "amx_probe")},
        "request_form": 'response_format {"type": "json_object", "schema": ...} (its GBNF)',
        "valid": sum(r["valid"] for r in rows),
        "schemas": len(rows),
        "server_crashes": sum("error" in r for r in rows),
        "tokens_per_s_c1": round(tokens / busy, 2) if busy else None,
        "rows": rows,
    }


async def run(args: argparse.Namespace) -> int:
    from models.sources import SMOLLM2, locate

    directory = Path(args.models_dir) / LLM
    manifest = load_manifest(directory)
    schemas = SCHEMAS[: args.schemas]
    agent_args = ["--threads", str(args.threads), "--set", "engine.max_running=16",
                  "--set", "cache.enabled=false"]  # fmt: skip
    print(f"edgefleet agent: {LLM} {manifest.version}, {len(schemas)} schemas", flush=True)
    async with AgentProcess(
        models_dir=args.models_dir, serve=[LLM], extra_args=agent_args
    ) as agent:
        ours = await agent_side(agent.url, schemas)
    rows = ours["validity"]
    masks = mask_times(
        directory / manifest.tokenizer.file,
        list(manifest.special_tokens.eos_token_ids),
        schemas,
        rows,
        args.outlines_schemas,
    )
    print(f"  masks: {json.dumps(masks)}", flush=True)
    llama: dict[str, Any] | None = None
    if not args.skip_llamacpp:
        print("llama.cpp server: same schemas, same GGUF", flush=True)
        llama = await llamacpp_side(locate(SMOLLM2).path, args.llamacpp_port, args.threads, schemas)
    n_valid = sum(r["valid"] for r in rows)
    tools = ours["tool_choice"]
    right = sum(r["called"] == r["should_call"] for r in tools)
    figures: dict[str, Any] = {
        "model": LLM,
        "version": manifest.version,
        "threads": args.threads,
        "max_tokens": MAX_TOKENS,
        "validity": {
            "schemas": len(rows),
            "valid": n_valid,
            "cut_by_max_tokens": sum(r["finish_reason"] == "length" for r in rows),
            "mean_completion_tokens": round(
                sum(r["completion_tokens"] for r in rows) / len(rows), 1
            ),
            "rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in rows],
        },
        "throughput": ours["throughput"],
        "mask": masks,
        "tool_choice_auto": {
            "prompts": len(tools),
            "right": right,
            "called_when_it_should": sum(r["called"] and r["should_call"] for r in tools),
            "should_call": sum(r["should_call"] for r in tools),
            "text_when_it_should": sum(not r["called"] and not r["should_call"] for r in tools),
            "should_answer_in_text": sum(not r["should_call"] for r in tools),
            "rows": tools,
        },
        "llamacpp": llama,
    }
    tp = ours["throughput"]
    p99 = masks["llguidance"]["mask_ms_p99"]
    targets = {
        "validity": target(n_valid / len(rows), "== 1.0", n_valid == len(rows)),
        "throughput_ratio_c1": target(tp["1"]["ratio"], ">= 0.9", tp["1"]["ratio"] >= 0.9),
        "throughput_ratio_c16": target(tp["16"]["ratio"], ">= 0.9", tp["16"]["ratio"] >= 0.9),
        "mask_ms_p99": target(p99, "report (llguidance, one token's mask)", True),
    }
    path = write_results("structured_outputs", figures, targets)
    print(f"validity: {n_valid}/{len(rows)}; tool choice right: {right}/{len(tools)}")
    if llama:
        print(f"llama.cpp validity: {llama['valid']}/{llama['schemas']}")
    for name, t in targets.items():
        print(f"  {name}: {t['value']} (target {t['target']}) {'MET' if t['met'] else 'NOT MET'}")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.structured_outputs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--schemas", type=int, default=len(SCHEMAS), help="first N schemas")
    parser.add_argument(
        "--outlines-schemas",
        type=int,
        default=10,
        help="schemas also timed with outlines-core (its index builds are slow)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llamacpp-port", type=int, default=8766)
    parser.add_argument("--skip-llamacpp", action="store_true", help="measure the agent only")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
