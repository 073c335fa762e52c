"""Tool calls and structured outputs through LangChain, on a real shipped model.

Starts an agent serving ``--model`` (the shipped artifact, API keys on: a keys file made
with ``python -m agent keys add``) and talks to it as an app developer's LangChain code
would: ``ChatOpenAI(base_url=<agent>/v1, temperature=0)``. On the fixed prompts of
``benchmarks/data/tool_prompts.json`` (written before anything was tuned; 30 that need one
of five tools, 30 that need none), one at a time:

1. ``bind_tools(TOOLS).invoke(prompt)`` (``tool_choice`` left to the model: auto). A tool
   prompt's answer is scored ``right_tool`` (every call parsed, names a tool offered, has
   arguments valid for that tool's JSON schema, and names the tool the prompt needs),
   ``wrong_tool``, ``malformed`` (arguments LangChain could not parse, an unknown tool,
   arguments that fail the tool's schema, or a call cut by the token limit, which the agent
   returns as text starting with ``<tool_call>``) or ``no_call``; a no-tool prompt's is
   ``no_call`` or ``called`` (any call at all, well formed, cut or not).
2. ``with_structured_output(Schema, method="json_schema", include_raw=True).invoke(prompt)``
   with a small pydantic schema per prompt set (:class:`ToolRequest` for the tool prompts:
   which tool and its subject; :class:`Reply` for the others: topic and a short answer):
   parsed into the schema or not (an answer cut by the token limit is not).

Targets (issue 25): right tool on at least 80% of the tool prompts, a call on at most 10%
of the no-tool prompts, structured output parsed on all 60.

    python -m benchmarks.tool_calls --model NAME [--models-dir DIR] [--threads 2]

Writes ``benchmarks/results/tool_calls_<NAME>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema_rs
from pydantic import BaseModel, Field

from agent.structured.tool_calls import CALL_OPEN
from benchmarks.results_file import percentile, target, write_results
from devtools.fleet import AgentProcess
from devtools.process import REPO_ROOT
from models.manifest import load_manifest

PROMPTS_FILE = Path(__file__).resolve().parent / "data" / "tool_prompts.json"
DEFAULT_MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 256  # per answer, both kinds: a tool call's arguments or a structured reply

RIGHT_TOOL_TARGET = 0.8
NO_TOOL_CALLED_TARGET = 0.1

# "error": the request itself failed (an HTTP error, or the client raised): neither right
# nor a call
Outcome = Literal["right_tool", "wrong_tool", "malformed", "no_call", "called", "error"]


@dataclass(frozen=True)
class PromptSet:
    """The fixed prompts: ``tools`` in OpenAI's function format; ``tool_prompts`` pairs
    (prompt, the tool it needs); ``no_tool_prompts`` pairs (prompt, its kind)."""

    tools: list[dict[str, Any]]
    tool_prompts: list[tuple[str, str]]
    no_tool_prompts: list[tuple[str, str]]

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}


def load_prompts(path: Path = PROMPTS_FILE) -> PromptSet:
    data = json.loads(path.read_text())
    prompts = PromptSet(
        tools=data["tools"],
        tool_prompts=[(p["prompt"], p["tool"]) for p in data["tool_prompts"]],
        no_tool_prompts=[(p["prompt"], p["kind"]) for p in data["no_tool_prompts"]],
    )
    unknown = {tool for _, tool in prompts.tool_prompts} - set(prompts.tool_names)
    if unknown:
        raise ValueError(f"{path}: tool prompts name tools that are not offered: {unknown}")
    return prompts


class ToolRequest(BaseModel):
    """The structured-output schema for the tool prompts."""

    intent: Literal[
        "get_weather",
        "convert_currency",
        "create_ticket",
        "get_order_status",
        "create_calendar_event",
    ] = Field(description="Which service the request is for")
    subject: str = Field(
        description="What it is about: a city, an amount, a problem, an order number or an event",
        max_length=120,
    )


class Reply(BaseModel):
    """The structured-output schema for the no-tool prompts."""

    topic: str = Field(description="The topic of the message in a few words", max_length=60)
    answer: str = Field(description="A one-sentence reply", max_length=300)


def score_tool_answer(
    expected: str | None,
    tool_calls: Sequence[dict[str, Any]],
    invalid_tool_calls: Sequence[dict[str, Any]],
    parameters: dict[str, dict[str, Any]],
    content: str = "",
) -> Outcome:
    """How one ``bind_tools`` answer (an AIMessage's ``tool_calls``, ``invalid_tool_calls``
    and text ``content``) scores: ``expected`` is the tool the prompt needs, None for a
    prompt that needs none (then any call at all is ``called``).

    A call the agent could not finish (cut by the token limit) comes back as text that
    starts with ``<tool_call>`` and no ``tool_calls``: an attempted call, so ``malformed``
    on a tool prompt and ``called`` on a no-tool prompt, not ``no_call``."""
    attempted = content.lstrip().startswith(CALL_OPEN)
    if not tool_calls and not invalid_tool_calls and not attempted:
        return "no_call"
    if expected is None:
        return "called"
    if invalid_tool_calls or attempted:
        return "malformed"
    for call in tool_calls:
        schema = parameters.get(call.get("name", ""))
        if schema is None or not jsonschema_rs.validator_for(schema).is_valid(call.get("args")):
            return "malformed"
    if any(call["name"] != expected for call in tool_calls):
        return "wrong_tool"
    return "right_tool"


def _latency(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    values = [r["latency_s"] for r in rows]
    if not values:
        return {}
    return {
        "p50_s": round(percentile(values, 50), 3),
        "p90_s": round(percentile(values, 90), 3),
        "max_s": round(max(values), 3),
    }


def figures_and_targets(
    tool_rows: Sequence[dict[str, Any]],
    no_tool_rows: Sequence[dict[str, Any]],
    structured_rows: Sequence[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The results file's figures and targets from the per-prompt rows (each with
    ``outcome`` or ``parsed``, and ``latency_s``)."""
    right = sum(r["outcome"] == "right_tool" for r in tool_rows)
    called = sum(r["outcome"] == "called" for r in no_tool_rows)
    parsed = sum(bool(r["parsed"]) for r in structured_rows)
    right_share = right / len(tool_rows) if tool_rows else 0.0
    called_share = called / len(no_tool_rows) if no_tool_rows else 0.0
    figures: dict[str, Any] = {
        "tool_prompts": {
            "prompts": len(tool_rows),
            "outcomes": dict(Counter(r["outcome"] for r in tool_rows)),
            "right_tool": right,
            "right_tool_share": round(right_share, 3),
            "by_tool": {
                tool: {
                    "prompts": sum(r["tool"] == tool for r in tool_rows),
                    "right_tool": sum(
                        r["tool"] == tool and r["outcome"] == "right_tool" for r in tool_rows
                    ),
                }
                for tool in sorted({r["tool"] for r in tool_rows})
            },
            "latency": _latency(tool_rows),
        },
        "no_tool_prompts": {
            "prompts": len(no_tool_rows),
            "called": called,
            "called_share": round(called_share, 3),
            "called_by_kind": dict(
                Counter(r["kind"] for r in no_tool_rows if r["outcome"] == "called")
            ),
            "latency": _latency(no_tool_rows),
        },
        "structured_output": {
            "prompts": len(structured_rows),
            "parsed": parsed,
            # a figure, not a target: the tool prompts' structured intent naming their tool
            "intent_matches_tool": sum(
                r.get("intent_matches_tool") is True for r in structured_rows
            ),
            "latency": _latency(structured_rows),
        },
    }
    total = len(structured_rows)
    targets = {
        "tool_prompts_right_tool_share": target(
            round(right_share, 3), f">= {RIGHT_TOOL_TARGET}", right_share >= RIGHT_TOOL_TARGET
        ),
        "no_tool_prompts_called_share": target(
            round(called_share, 3),
            f"<= {NO_TOOL_CALLED_TARGET}",
            called_share <= NO_TOOL_CALLED_TARGET,
        ),
        "structured_output_parsed": target(
            parsed, f"== {total} (all prompts)", total > 0 and parsed == total
        ),
    }
    return figures, targets


def add_key(keys_file: Path) -> str:
    """A new API key in ``keys_file`` (``python -m agent keys add``): its secret."""
    done = subprocess.run(
        [sys.executable, "-m", "agent", "keys", "add", "--file", str(keys_file),
         "--name", "tool-calls-benchmark"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def code_state() -> dict[str, Any]:
    """The commit measured, and whether the working tree had changes on top of it (the
    agent and the artifact are what the tree held when the run started)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD"), "changed_files": len(changed)}


def _text(content: Any, limit: int = 200) -> str:
    text = content if isinstance(content, str) else json.dumps(content)
    return text[:limit]


async def bind_tools_rows(
    llm: Any, prompts: PromptSet, items: Sequence[tuple[str, str | None, str]]
) -> list[dict[str, Any]]:
    """One ``bind_tools(...).ainvoke`` per (prompt, expected tool or None, kind)."""
    bound = llm.bind_tools(prompts.tools)
    rows = []
    for i, (prompt, expected, kind) in enumerate(items, 1):
        started = time.perf_counter()
        try:
            message = await bound.ainvoke(prompt)
        except Exception as exc:  # the client's or the server's failure: recorded, not fatal
            rows.append({
                "prompt": prompt,
                "tool" if expected else "kind": expected or kind,
                "outcome": "error",
                "error": f"{type(exc).__name__}: {exc}"[:300],
                "latency_s": round(time.perf_counter() - started, 3),
            })  # fmt: skip
            print(f"  bind_tools {i:>2}/{len(items)} error      {exc!r:.80}", flush=True)
            continue
        latency = time.perf_counter() - started
        text = message.content if isinstance(message.content, str) else ""
        outcome = score_tool_answer(
            expected, message.tool_calls, message.invalid_tool_calls, prompts.parameters, text
        )
        usage = message.usage_metadata or {}
        row: dict[str, Any] = {
            "prompt": prompt,
            "tool" if expected else "kind": expected or kind,
            "outcome": outcome,
            "calls": [{"name": c["name"], "args": c["args"]} for c in message.tool_calls],
            "invalid_calls": [
                {"name": c.get("name"), "args": c.get("args"), "error": c.get("error")}
                for c in message.invalid_tool_calls
            ],
            "text": _text(message.content),
            "finish_reason": message.response_metadata.get("finish_reason"),
            "completion_tokens": usage.get("output_tokens"),
            "latency_s": round(latency, 3),
        }
        rows.append(row)
        print(f"  bind_tools {i:>2}/{len(items)} {outcome:<10} {latency:5.2f}s  {prompt[:60]}",
              flush=True)  # fmt: skip
    return rows


async def structured_rows(
    llm: Any, items: Sequence[tuple[str, type[BaseModel], str | None]]
) -> list[dict[str, Any]]:
    """One ``with_structured_output(schema).ainvoke`` per (prompt, schema, expected tool)."""
    rows = []
    for i, (prompt, schema, expected) in enumerate(items, 1):
        structured = llm.with_structured_output(schema, method="json_schema", include_raw=True)
        started = time.perf_counter()
        try:
            result = await structured.ainvoke(prompt)
        except Exception as exc:
            # the openai SDK's parse raises for an answer cut by the token limit
            # (LengthFinishReasonError, which carries the completion) and on content that
            # does not validate: a failure to parse, recorded
            latency = time.perf_counter() - started
            completion = getattr(exc, "completion", None)
            choice = completion.choices[0] if completion is not None else None
            row: dict[str, Any] = {
                "prompt": prompt,
                "schema": schema.__name__,
                "parsed": False,
                "value": None,
                "error": f"{type(exc).__name__}: {exc}"[:300],
                "raw": _text(choice.message.content or "", 400) if choice else None,
                "finish_reason": choice.finish_reason if choice else None,
                "completion_tokens": completion.usage.completion_tokens
                if completion is not None and completion.usage
                else None,
                "latency_s": round(latency, 3),
            }
        else:
            latency = time.perf_counter() - started
            parsed, raw, error = result["parsed"], result["raw"], result["parsing_error"]
            row = {
                "prompt": prompt,
                "schema": schema.__name__,
                "parsed": parsed is not None,
                "value": parsed.model_dump() if parsed is not None else None,
                "error": str(error)[:300] if error is not None else None,
                "raw": _text(raw.content, 400) if parsed is None else None,
                "finish_reason": raw.response_metadata.get("finish_reason"),
                "completion_tokens": (raw.usage_metadata or {}).get("output_tokens"),
                "latency_s": round(latency, 3),
            }
        if expected is not None:
            value = row["value"]
            row["intent_matches_tool"] = value is not None and value["intent"] == expected
        rows.append(row)
        print(f"  structured {i:>2}/{len(items)} {'parsed' if row['parsed'] else 'FAILED':<10} "
              f"{latency:5.2f}s  {prompt[:60]}", flush=True)  # fmt: skip
    return rows


async def run(args: argparse.Namespace) -> int:
    from langchain_openai import ChatOpenAI

    prompts = load_prompts(Path(args.prompts))
    manifest = load_manifest(Path(args.models_dir) / args.model)
    keys_dir = Path(tempfile.mkdtemp(prefix="edgefleet-tool-calls-"))
    keys_file = keys_dir / "keys.json"
    api_key = add_key(keys_file)
    agent_args = ["--threads", str(args.threads), "--set", f"auth.keys_file={keys_file}",
                  "--set", "cache.enabled=false"]  # fmt: skip
    print(f"edgefleet agent: {args.model} {manifest.version} ({manifest.variant}), "
          f"{args.threads} threads, API keys on", flush=True)  # fmt: skip
    code = code_state()
    started = time.perf_counter()
    async with AgentProcess(
        models_dir=args.models_dir, serve=[args.model], extra_args=agent_args
    ) as agent:
        llm = ChatOpenAI(
            model=args.model,
            base_url=agent.url + "/v1",
            api_key=api_key,  # type: ignore[arg-type]
            temperature=0,
            max_completion_tokens=args.max_tokens,
            max_retries=0,
            timeout=600,
        )
        await llm.ainvoke("Hello")  # warm-up (pages the weights in)
        print("bind_tools on the tool prompts", flush=True)
        tool_rows = await bind_tools_rows(
            llm, prompts, [(p, tool, "tool") for p, tool in prompts.tool_prompts]
        )
        print("bind_tools on the no-tool prompts", flush=True)
        no_tool_rows = await bind_tools_rows(
            llm, prompts, [(p, None, kind) for p, kind in prompts.no_tool_prompts]
        )
        print("with_structured_output on all prompts", flush=True)
        structured = await structured_rows(
            llm,
            [(p, ToolRequest, tool) for p, tool in prompts.tool_prompts]
            + [(p, Reply, None) for p, _ in prompts.no_tool_prompts],
        )
    figures, targets = figures_and_targets(tool_rows, no_tool_rows, structured)
    figures = {
        "model": args.model,
        "variant": manifest.variant,
        "version": manifest.version,
        "code": code,
        "threads": args.threads,
        "max_completion_tokens": args.max_tokens,
        "client": "langchain-openai ChatOpenAI, temperature 0, one request at a time",
        "structured_method": "json_schema",
        "prompts_file": str(Path(args.prompts).resolve().relative_to(REPO_ROOT)),
        "wall_s": round(time.perf_counter() - started, 1),
        **figures,
        "rows": {
            "bind_tools_tool": tool_rows,
            "bind_tools_no_tool": no_tool_rows,
            "structured": structured,
        },
    }
    path = write_results(f"tool_calls_{args.model}", figures, targets)
    print(f"\ntool prompts: {figures['tool_prompts']['outcomes']}")
    print(f"no-tool prompts called: {figures['no_tool_prompts']['called']}/{len(no_tool_rows)}")
    for name, t in targets.items():
        print(f"  {name}: {t['value']} (target {t['target']}) {'MET' if t['met'] else 'NOT MET'}")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tool_calls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a shipped model's name")
    parser.add_argument("--models-dir", default="models/artifacts")
    parser.add_argument("--prompts", default=str(PROMPTS_FILE))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
