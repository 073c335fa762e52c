"""The accuracy gate: compare a quantized variant with the fp32 export, through ONNX Runtime.

LLM: perplexity on ``data/perplexity.txt`` (must be <= 1.15x fp32) and correct answers on
``data/factual_prompts.json`` (must be >= fp32's count - 2). Embeddings: cosine between the
quantized and fp32 pooled, normalised embeddings of ``data/embedding_sentences.json``
(must be >= 0.98 for every sentence).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from models.errors import ConversionError
from models.ort_llm import OrtDecoder

__all__ = [
    "COSINE_MIN",
    "FACTUAL_SLACK",
    "PERPLEXITY_RATIO_MAX",
    "EmbeddingGateData",
    "LlmEval",
    "LlmGateData",
    "embedding_gate",
    "evaluate_llm",
    "llm_gate",
]

log = logging.getLogger(__name__)

DATA_DIR: Final = Path(__file__).resolve().parent / "data"
PERPLEXITY_RATIO_MAX: Final = 1.15
FACTUAL_SLACK: Final = 2
COSINE_MIN: Final = 0.98


@dataclass(frozen=True)
class FactualPrompt:
    prompt: str
    accept: tuple[str, ...]  # any of these, case-insensitive, counts as correct


@dataclass(frozen=True)
class LlmGateData:
    """The fixed evaluation inputs for language models."""

    text: str
    prompts: tuple[FactualPrompt, ...]
    max_new_tokens: int

    @classmethod
    def load(cls, data_dir: Path = DATA_DIR) -> LlmGateData:
        try:
            text = (data_dir / "perplexity.txt").read_text(encoding="utf-8")
            raw = json.loads((data_dir / "factual_prompts.json").read_text(encoding="utf-8"))
            prompts = tuple(FactualPrompt(p["prompt"], tuple(p["accept"])) for p in raw["prompts"])
            return cls(text=text, prompts=prompts, max_new_tokens=int(raw["max_new_tokens"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConversionError(f"gate data in {data_dir} is unreadable: {exc}") from exc


@dataclass(frozen=True)
class EmbeddingGateData:
    sentences: tuple[str, ...]

    @classmethod
    def load(cls, data_dir: Path = DATA_DIR) -> EmbeddingGateData:
        try:
            raw = json.loads((data_dir / "embedding_sentences.json").read_text(encoding="utf-8"))
            return cls(sentences=tuple(str(s) for s in raw["sentences"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConversionError(f"gate data in {data_dir} is unreadable: {exc}") from exc


@dataclass(frozen=True)
class LlmEval:
    """One variant's numbers on the LLM gate data."""

    perplexity: float
    perplexity_tokens: int
    factual_correct: int
    factual_total: int
    answers: tuple[str, ...]  # decoded greedy answers, in prompt order
    correct: tuple[bool, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "perplexity": round(self.perplexity, 4),
            "perplexity_tokens": self.perplexity_tokens,
            "factual_correct": self.factual_correct,
            "factual_total": self.factual_total,
        }


def render_chat(template: str, user_text: str) -> str:
    """Apply a chat template the way the agent does (sandboxed jinja2)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": user_text}], add_generation_prompt=True
    )


def evaluate_llm(
    decoder: OrtDecoder,
    tokenizer_file: Path,
    chat_template: str,
    eos_ids: tuple[int, ...],
    data: LlmGateData,
    context_length: int | None = None,
) -> LlmEval:
    """Perplexity and factual answers of one graph. With ``context_length`` the
    perplexity text is scored in windows that fit it (one pass when it fits whole)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = tokenizer.encode(data.text, add_special_tokens=False).ids
    nll, count = decoder.negative_log_likelihood(ids, context_length)
    perplexity = math.exp(nll / count)
    answers: list[str] = []
    correct: list[bool] = []
    for item in data.prompts:
        prompt_ids = tokenizer.encode(
            render_chat(chat_template, item.prompt), add_special_tokens=False
        ).ids
        generation = decoder.greedy(prompt_ids, data.max_new_tokens, eos_ids)
        answer = tokenizer.decode(generation.tokens, skip_special_tokens=True)
        answers.append(answer)
        correct.append(any(a.lower() in answer.lower() for a in item.accept))
    return LlmEval(
        perplexity=perplexity,
        perplexity_tokens=count,
        factual_correct=sum(correct),
        factual_total=len(correct),
        answers=tuple(answers),
        correct=tuple(correct),
    )


def llm_gate(reference: LlmEval, candidate: LlmEval) -> dict[str, Any]:
    """Gate verdict for ``candidate`` against the fp32 ``reference``."""
    ratio = candidate.perplexity / reference.perplexity
    ppl_ok = ratio <= PERPLEXITY_RATIO_MAX
    factual_ok = candidate.factual_correct >= reference.factual_correct - FACTUAL_SLACK
    return {
        **candidate.as_json(),
        "reference_fp32": reference.as_json(),
        "perplexity_ratio": round(ratio, 4),
        "perplexity_ratio_max": PERPLEXITY_RATIO_MAX,
        "perplexity_passed": ppl_ok,
        "factual_min_correct": reference.factual_correct - FACTUAL_SLACK,
        "factual_passed": factual_ok,
        "passed": ppl_ok and factual_ok,
    }


def embedding_gate(
    reference: npt.NDArray[np.float32], candidate: npt.NDArray[np.float32]
) -> dict[str, Any]:
    """Cosine per sentence between normalised embeddings (rows) of fp32 and a candidate."""
    ref = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    cand = candidate / np.linalg.norm(candidate, axis=1, keepdims=True)
    cosines = (ref * cand).sum(axis=1)
    cos_min = float(cosines.min())
    return {
        "cosine_min": round(cos_min, 5),
        "cosine_mean": round(float(cosines.mean()), 5),
        "cosine_threshold": COSINE_MIN,
        "sentences": len(cosines),
        "passed": cos_min >= COSINE_MIN,
    }
