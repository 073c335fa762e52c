"""On the real SmolLM2: does a resumed generation reproduce the uninterrupted one bit for bit?

Measured (see the report of issue 8): prefilling prompt + delivered ids gives logits that
differ from the decode path's by up to ~1.0 (greedy continuations identical for 8 of 24
cuts), so a continuation is replayed through the decode path instead, one token per step;
that gives the decode path's logits exactly, and the engine's resumed output is identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from agent.engine.causal_lm import CausalLM
from agent.engine.interface import GenerationRequest, SamplingParams
from agent.engine.ort_session import SessionConfig, create_session
from agent.model_loader import causal_lm_spec, load_registry
from models.manifest import load_manifest

LLM = "smollm2-135m-instruct"
PROMPT = "<|im_start|>user\nWrite a short story about a cat.<|im_end|>\n<|im_start|>assistant\n"


def test_replaying_delivered_ids_through_decode_gives_the_decode_logits_bit_for_bit(
    real_artifacts: Path,
) -> None:
    directory = real_artifacts / LLM
    spec = causal_lm_spec(directory, load_manifest(directory / "manifest.json"))
    lm = CausalLM(create_session(directory / "model.onnx", SessionConfig()), spec)
    ids = list(Tokenizer.from_file(str(directory / "tokenizer.json")).encode(PROMPT).ids)
    one = np.zeros((1, 1), np.int64)

    def prefill(tokens: list[int]) -> tuple[object, np.ndarray]:
        cache = lm.new_cache(1)
        n = len(tokens)
        return cache, lm.run(cache, 0, np.array([tokens]), np.array([n]), np.array([[n - 1]]))[0, 0]

    def step(cache: object, token: int) -> np.ndarray:
        n = int(cache.lengths[0]) + 1  # type: ignore[attr-defined]
        return lm.run(cache, 0, np.array([[token]]), np.array([n]), one)[0, 0]  # type: ignore[arg-type]

    cache, logits = prefill(ids)
    generated, decode_logits = [], []
    for _ in range(20):
        decode_logits.append(logits)
        generated.append(int(logits.argmax()))
        logits = step(cache, generated[-1])
    for cut in (1, 7, 13):
        replay, logits = prefill(ids)
        for token in generated[:cut]:
            logits = step(replay, token)
        np.testing.assert_array_equal(logits, decode_logits[cut])
        _, prefilled = prefill(ids + generated[:cut])
        # reported, not asserted equal: the prompt kernel rounds differently
        diff = float(np.abs(prefilled - decode_logits[cut]).max())
        print(f"cut {cut}: prefilled ids vs decode path, logits max |diff| {diff:.3f}")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.9, seed=4, max_tokens=24),
    ],
    ids=["greedy", "seeded"],
)
async def test_engine_resumed_output_equals_uninterrupted(
    real_artifacts: Path, params: SamplingParams
) -> None:
    registry = load_registry(
        real_artifacts, [LLM], session_config=SessionConfig(), max_context_tokens=512
    )
    await registry.start()
    model = registry.text_model(LLM)
    prompt = model.encode(PROMPT)

    async def run(request: GenerationRequest) -> list[int]:
        return [t async for out in model.generate(request) for t in out.token_ids]

    try:
        whole = await run(GenerationRequest("a", prompt, params))
        for cut in (1, 9, 17):
            rest = SamplingParams(**{**params.__dict__, "max_tokens": 24 - cut})
            resumed = await run(
                GenerationRequest("b", prompt, rest, continuation_token_ids=whole[:cut])
            )
            assert whole[:cut] + resumed == whole, cut
    finally:
        await registry.close()
