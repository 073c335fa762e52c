"""The on-box self-check: the build's accuracy gate recomputed on this machine.

For a text-generation version whose manifest recorded gate figures, the check runs the
gate's own fixed data (``models/data``) through ONNX Runtime on this box: perplexity on
its whole ~800-token text (one prefill pass when the text fits the model's context, so
it compares exactly with what the manifest recorded; windows of the context length when
it does not, as for the 512-token tiny test model) and greedy answers to the first
``prompts`` of its 20 factual prompts (``models.self_check_prompts``; each costs up to 24
decode steps). It passes when all hold:

- perplexity <= 1.15x the manifest's fp32 reference perplexity (the gate's bound);
- perplexity within 2% of the perplexity the manifest recorded for this artifact
  (same graph, same text: a larger gap means the files or the runtime differ);
- correct greedy answers >= the manifest's recorded rate times the prompts asked, rounded
  down, minus 1 (argmax ties can flip one answer across CPUs); with all 20 prompts, also
  >= the gate's minimum when it recorded one.

A version with no recorded figures (the tiny test model, embedding models) is measured
(perplexity, answers) but only checked for a finite perplexity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.engine.memory import trim_heap
from agent.engine.ort_session import SessionConfig, create_session
from edgefleet.contract import SelfCheckResult
from models.manifest import LlmSpec, ModelManifest

if TYPE_CHECKING:
    from models.ort_llm import OrtDecoder

PERPLEXITY_RATIO_MAX = 1.15
PERPLEXITY_RECORDED_TOLERANCE = 0.02
GREEDY_SLACK = 1


def _number(data: Mapping[str, Any] | None, key: str) -> float | None:
    if not isinstance(data, Mapping):
        return None
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _decoder(kind: type[OrtDecoder], onnx_path: Path, spec: LlmSpec, threads: int) -> OrtDecoder:
    """``kind(onnx_path, spec, threads)`` with its session made as the agent makes sessions:
    on the process's shared thread pool when it has one (ONNX Runtime refuses a session of
    its own threads beside a global pool)."""
    decoder = kind.__new__(kind)
    started = time.perf_counter()
    decoder.session = create_session(onnx_path, SessionConfig(intra_op_threads=threads))
    decoder.load_s = time.perf_counter() - started
    decoder.spec = spec
    decoder.output_names = [o.name for o in decoder.session.get_outputs()]
    return decoder


def run_self_check(
    directory: Path, manifest: ModelManifest, threads: int = 1, prompts: int = 20
) -> SelfCheckResult:
    """Measure and judge (blocking: run it in a thread)."""
    started = time.perf_counter()
    if manifest.task != "text-generation" or manifest.llm is None:
        return SelfCheckResult(passed=True, seconds=0.0, detail="")
    from models.gate import LlmGateData, evaluate_llm
    from models.ort_llm import OrtDecoder

    decoder = _decoder(OrtDecoder, directory / manifest.graph.onnx, manifest.llm, threads)
    data = LlmGateData.load()
    data = replace(data, prompts=data.prompts[: max(1, prompts)])
    evaluated = evaluate_llm(
        decoder,
        directory / manifest.tokenizer.file,
        manifest.chat_template or "{{ messages[0]['content'] }}",
        manifest.special_tokens.eos_token_ids,
        data,
        context_length=manifest.context_length,
    )
    del decoder
    trim_heap("self-check session released")  # its freed pages back to the OS
    seconds = time.perf_counter() - started
    accuracy = manifest.accuracy
    reference = accuracy.get("reference_fp32") if isinstance(accuracy, Mapping) else None
    ref_ppl = _number(reference, "perplexity") or _number(accuracy, "perplexity")
    if isinstance(accuracy, Mapping) and accuracy.get("reference") is True:
        ref_ppl = _number(accuracy, "perplexity")
    recorded_ppl = _number(accuracy, "perplexity")
    recorded_correct = _number(accuracy, "factual_correct")
    min_correct = _number(accuracy, "factual_min_correct")
    ppl = evaluated.perplexity
    ratio = ppl / ref_ppl if ref_ppl else 0.0
    failures: list[str] = []
    if not math.isfinite(ppl):
        failures.append("perplexity is not finite")
    if ref_ppl and ratio > PERPLEXITY_RATIO_MAX:
        failures.append(
            f"perplexity {ppl:.3f} is {ratio:.3f}x the fp32 reference {ref_ppl:.3f} "
            f"(at most {PERPLEXITY_RATIO_MAX}x)"
        )
    if recorded_ppl and abs(ppl / recorded_ppl - 1) > PERPLEXITY_RECORDED_TOLERANCE:
        failures.append(
            f"perplexity {ppl:.3f} differs from the recorded {recorded_ppl:.3f} by more than "
            f"{PERPLEXITY_RECORDED_TOLERANCE:.0%}"
        )
    recorded_total = _number(accuracy, "factual_total")
    asked = evaluated.factual_total
    if recorded_correct is not None and recorded_total:
        expected = math.floor(recorded_correct / recorded_total * asked) - GREEDY_SLACK
        if evaluated.factual_correct < expected:
            failures.append(
                f"{evaluated.factual_correct}/{asked} greedy answers correct; the manifest "
                f"recorded {int(recorded_correct)}/{int(recorded_total)} (at least {expected} "
                "expected)"
            )
    below_gate = min_correct is not None and evaluated.factual_correct < min_correct
    if below_gate and asked == recorded_total:
        failures.append(
            f"{evaluated.factual_correct} greedy answers correct, below the gate's "
            f"{int(min_correct or 0)}"
        )
    return SelfCheckResult(
        passed=not failures,
        perplexity=round(ppl, 4),
        perplexity_ratio=round(ratio, 4),
        greedy_matched=evaluated.factual_correct,
        greedy_total=evaluated.factual_total,
        seconds=round(seconds, 3),
        detail="; ".join(failures),
    )
