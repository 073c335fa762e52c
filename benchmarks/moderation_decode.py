"""What output checking costs while decoding (issue 28): decode tokens/s at c = 1 and
c = 16 and the first visible token of a buffered stream, with content safety on and off.

Two agent processes in turn, the same SmolLM2 artifact, API keys on (a keys file with one
key that says nothing: the defaults flag every category in both directions, streams
buffered): one whose MiniLM brought its moderation heads (every output window checked and
held back until it passes), one whose MiniLM did not (no classifier: nothing checked).
Streamed chat completions of harmless prompts, ``max_tokens`` each, temperature 0, the
response cache off (the prompts repeat).
Writes ``benchmarks/results/moderation_decode.json``.

    python -m benchmarks.moderation_decode [--max-tokens 96] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from benchmarks.results_file import percentile, target, write_results
from devtools.fleet import AgentProcess
from models.moderation_spec import BUNDLED_HEADS_DIR, BUNDLED_HEADS_KEY

LLM = "smollm2-135m-instruct"
MINILM = "all-minilm-l6-v2"
WINDOW = 32  # output tokens held back at most (agent/moderation/gate.py STEP_TOKENS)
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a large city, with many details.",
    "Write a long letter to a friend about a summer spent in the mountains.",
]


def models_dir(artifacts: Path, out: Path, *, heads: bool) -> Path:
    """SmolLM2 and MiniLM linked from ``artifacts``; without ``heads``, MiniLM as a build
    from before bundling wrote it (its manifest does not list moderation/)."""
    out.mkdir(parents=True)
    (out / LLM).symlink_to((artifacts / LLM).resolve())
    if heads:
        (out / MINILM).symlink_to((artifacts / MINILM).resolve())
        return out
    source = (artifacts / MINILM).resolve()
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.pop(BUNDLED_HEADS_KEY, None)
    manifest["files"] = [
        f for f in manifest["files"] if not f["path"].startswith(BUNDLED_HEADS_DIR + "/")
    ]
    (out / MINILM).mkdir()
    for entry in manifest["files"]:
        (out / MINILM / entry["path"]).symlink_to(source / entry["path"])
    (out / MINILM / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


async def one(client: openai.AsyncOpenAI, i: int, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first visible text, seconds in all, completion tokens)."""
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=LLM, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - started
    return (first if first is not None else total), total, tokens


async def measure(url: str, key: str, max_tokens: int, rounds: int) -> dict[str, Any]:
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=key, max_retries=0, timeout=600
    ) as client:
        await one(client, 0, 8)  # warm-up
        firsts: list[float] = []
        c1_tokens, c1_seconds = 0, 0.0
        for i in range(rounds):
            first, total, tokens = await one(client, i, max_tokens)
            firsts.append(first)
            c1_tokens += tokens
            c1_seconds += total
        started = time.perf_counter()
        done = await asyncio.gather(*(one(client, i, max_tokens) for i in range(16)))
        wall = time.perf_counter() - started
    return {
        "c1_tokens_per_s": round(c1_tokens / c1_seconds, 2),
        "c1_first_visible_p50_ms": round(statistics.median(firsts) * 1000, 1),
        "c1_first_visible_max_ms": round(max(firsts) * 1000, 1),
        "c16_tokens_per_s": round(sum(t for _, _, t in done) / wall, 2),
        "c16_first_visible_p50_ms": round(percentile([f for f, _, _ in done], 50) * 1000, 1),
        "c16_completion_tokens": sum(t for _, _, t in done),
    }


async def run(args: argparse.Namespace) -> int:
    artifacts = Path(args.artifacts)
    figures: dict[str, Any] = {"max_tokens": args.max_tokens, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="edgefleet-moderation-decode-") as tmp:
        keys = Path(tmp) / "keys.json"
        key = subprocess.run(
            [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys), "--name", "b"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        for mode, heads in (("checked", True), ("unchecked", False)):
            directory = models_dir(artifacts, Path(tmp) / mode, heads=heads)
            agent = AgentProcess(
                models_dir=str(directory), serve=[LLM, MINILM],
                # the response cache off: repeated prompts would be answered from it
                extra_args=["--set", f"auth.keys_file={keys}", "--threads", str(args.threads),
                            "--set", "cache.enabled=false"],
            )  # fmt: skip
            async with agent:
                unavailable = any("moderation unavailable" in line for line in agent.log)
                assert unavailable != heads, f"{mode}: the agent's classifier is not as meant"
                print(f"{mode}: agent {agent.url} ...", file=sys.stderr, flush=True)
                figures[mode] = await measure(agent.url, key, args.max_tokens, args.rounds)
                print(f"  {figures[mode]}", file=sys.stderr, flush=True)
    on, off = figures["checked"], figures["unchecked"]
    drop1 = 1 - on["c1_tokens_per_s"] / off["c1_tokens_per_s"]
    drop16 = 1 - on["c16_tokens_per_s"] / off["c16_tokens_per_s"]
    delay = on["c1_first_visible_p50_ms"] - off["c1_first_visible_p50_ms"]
    window_ms = WINDOW * 1000 / off["c1_tokens_per_s"]
    figures["decode_drop_c1"] = round(drop1, 4)
    figures["decode_drop_c16"] = round(drop16, 4)
    figures["first_visible_delay_ms"] = round(delay, 1)
    figures["window_decode_ms"] = round(window_ms, 1)
    targets = {
        "decode_drop_c16": target(round(drop16, 4), "<= 0.15", drop16 <= 0.15),
        "first_visible_delay_ms": target(
            round(delay, 1), f"<= one window's decode ({window_ms:.0f} ms)", delay <= window_ms
        ),
    }
    path = write_results("moderation_decode", figures, targets)
    print(json.dumps({"figures": figures, "targets": targets}, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", default="models/artifacts")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=4, help="sequential requests at c = 1")
    parser.add_argument("--threads", type=int, default=2)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
