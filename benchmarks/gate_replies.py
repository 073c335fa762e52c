"""Greedy replies unchanged: the accuracy gate's fixed prompts through two agents, one
serving an earlier build of a model, one this build, side by side.

Issue 25 stored SmolLM2's token embedding 8-bit and its weights as external data; the
replies a user gets must not change. Each of the gate's factual prompts
(``models/data/factual_prompts.json``) goes through ``/v1/chat/completions``
(temperature 0, the gate's ``max_new_tokens``) of a real agent serving ``--model`` from
``--before-dir`` (an older checkout's ``models/artifacts``), then of one serving it from
``--models-dir``; the answers are compared character for character.

    python -m benchmarks.gate_replies --before-dir DIR [--model smollm2-135m-instruct]

Target: every reply identical. Writes ``benchmarks/results/gate_replies_<model>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import openai

from benchmarks.results_file import target, write_results
from devtools.fleet import AgentProcess
from devtools.process import REPO_ROOT
from models.gate import LlmGateData
from models.manifest import load_manifest


async def replies(models_dir: Path, model: str, data: LlmGateData, threads: int) -> list[str]:
    """The model's greedy reply to each gate prompt, from a real agent over HTTP."""
    out: list[str] = []
    async with (
        AgentProcess(
            models_dir=str(models_dir),
            serve=[model],
            extra_args=["--threads", str(threads), "--set", "cache.enabled=false"],
        ) as agent,
        openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key="unused", max_retries=0, timeout=300
        ) as client,
    ):
        for item in data.prompts:
            reply = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": item.prompt}],
                temperature=0,
                max_tokens=data.max_new_tokens,
            )
            out.append(reply.choices[0].message.content or "")
    return out


async def run(args: argparse.Namespace) -> int:
    before_dir, after_dir = Path(args.before_dir), Path(args.models_dir)
    data = LlmGateData.load()
    versions = {
        "before": load_manifest(before_dir / args.model).version,
        "after": load_manifest(after_dir / args.model).version,
    }
    if versions["before"] == versions["after"]:
        raise SystemExit(
            f"both directories hold {args.model} {versions['after']}: nothing to compare"
        )
    before = await replies(before_dir, args.model, data, args.threads)
    after = await replies(after_dir, args.model, data, args.threads)
    rows: list[dict[str, Any]] = []
    for item, old, new in zip(data.prompts, before, after, strict=True):
        rows.append({"prompt": item.prompt, "before": old, "after": new, "same": old == new})
        print(f"{'same' if old == new else 'DIFF'}  {item.prompt[:60]}", flush=True)
    same = sum(r["same"] for r in rows)
    figures = {"model": args.model, "versions": versions, "identical": same,
               "prompts": len(rows), "rows": rows}  # fmt: skip
    targets = {"identical_replies": target(same, f"== {len(rows)}", same == len(rows))}
    path = write_results(f"gate_replies_{args.model}", figures, targets)
    print(f"{same}/{len(rows)} replies identical ({versions['before']} -> {versions['after']})")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gate_replies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--before-dir", required=True, help="an older build's artifacts")
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--threads", type=int, default=2)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
