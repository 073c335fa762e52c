"""The engine on the tiny random model: KV cache, determinism, stops, usage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.engine.causal_lm import CausalLM
from agent.engine.interface import GenerationOutput, GenerationRequest, SamplingParams
from agent.engine.ort_session import SessionConfig, create_session
from agent.engine.text_codec import TextCodec
from agent.model_registry import ModelRegistry
from agent.model_store import causal_lm_spec
from models.manifest import load_manifest

TINY = "tiny-llama"
MakeRegistry = Callable[[], ModelRegistry]


def _lm(artifacts: Path) -> CausalLM:
    directory = artifacts / TINY
    spec = causal_lm_spec(directory, load_manifest(directory / "manifest.json"))
    return CausalLM(create_session(directory / "model.onnx", SessionConfig()), spec)


def test_kv_cache_decode_matches_full_recompute(tiny_artifacts: Path) -> None:
    lm = _lm(tiny_artifacts)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, lm.spec.vocab_size, size=(1, 24)).astype(np.int64)
    ones = np.ones((1, 24), dtype=np.int64)
    full, _ = lm.run_batch(tokens, ones, lm.empty_past(), all_logits=True)
    # prefill 10 tokens, then decode the other 14 one at a time against the cache
    logits, past = lm.run_batch(tokens[:, :10], ones[:, :10], lm.empty_past())
    np.testing.assert_allclose(logits[0], full[0, 9], rtol=1e-4, atol=1e-4)
    for i in range(10, 24):
        logits, past = lm.run_batch(tokens[:, i : i + 1], ones[:, : i + 1], past)
        np.testing.assert_allclose(logits[0], full[0, i], rtol=1e-4, atol=1e-4)
    assert past[0].shape()[2] == 24  # the cache holds every token once


def test_padded_rows_decode_like_unpadded_ones(tiny_artifacts: Path) -> None:
    lm = _lm(tiny_artifacts)
    rng = np.random.default_rng(1)
    short, long = (rng.integers(0, lm.spec.vocab_size, size=(1, n)) for n in (5, 12))
    alone, _ = lm.run_batch(short, np.ones((1, 5), dtype=np.int64), lm.empty_past())
    padded = np.concatenate([np.zeros((1, 7), dtype=np.int64), short], axis=1)
    mask = np.concatenate([np.zeros((1, 7)), np.ones((1, 5))], axis=1).astype(np.int64)
    both, _ = lm.run_batch(
        np.concatenate([padded, long]), np.concatenate([mask, np.ones((1, 12), np.int64)]),
        lm.empty_past(2),
    )  # fmt: skip
    np.testing.assert_allclose(both[0], alone[0], rtol=1e-4, atol=1e-4)


async def _run(make: MakeRegistry, prompt: str, params: SamplingParams) -> list[GenerationOutput]:
    registry = make()
    model = registry.text_model(TINY)
    ids = model.encode(prompt)
    outs = [o async for o in model.generate(GenerationRequest("t", ids, params))]
    await registry.close()
    return outs


def _text(outs: list[GenerationOutput]) -> str:
    return "".join(o.text for o in outs)


async def test_greedy_is_deterministic_and_counts_tokens(
    tiny_artifacts: Path, make_tiny_registry: MakeRegistry
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    a = await _run(make_tiny_registry, "Once upon a time", params)
    b = await _run(make_tiny_registry, "Once upon a time", params)
    assert _text(a) == _text(b) != ""
    assert [o.completion_tokens for o in a] == list(range(1, 13))
    assert a[-1].finish_reason == "length"
    assert a[-1].prompt_tokens == len(
        TextCodec(
            tiny_artifacts / TINY / "tokenizer.json", chat_template=None, add_special_tokens=False
        ).encode("Once upon a time")
    )


async def test_same_seed_same_output_other_seed_differs(make_tiny_registry: MakeRegistry) -> None:
    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=16)

    first = _text(await _run(make_tiny_registry, "Hello", params(42)))
    again = _text(await _run(make_tiny_registry, "Hello", params(42)))
    other = _text(await _run(make_tiny_registry, "Hello", params(43)))
    assert first == again
    assert first != other


async def test_stop_string_cuts_output_and_finishes_with_stop(
    make_tiny_registry: MakeRegistry,
) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=20)
    full = _text(await _run(make_tiny_registry, "The weather", greedy))
    stop = full[len(full) // 2 : len(full) // 2 + 4]
    assert len(stop) == 4
    outs = await _run(
        make_tiny_registry,
        "The weather",
        SamplingParams(temperature=0.0, max_tokens=20, stop=(stop,)),
    )
    assert _text(outs) == full[: full.index(stop)]
    assert outs[-1].finish_reason == "stop"
    assert outs[-1].completion_tokens < 20


async def test_top_k_one_equals_greedy(make_tiny_registry: MakeRegistry) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    top1 = SamplingParams(temperature=0.7, top_k=1, seed=1, max_tokens=8)
    assert _text(await _run(make_tiny_registry, "abc", greedy)) == _text(
        await _run(make_tiny_registry, "abc", top1)
    )
