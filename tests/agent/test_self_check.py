"""The on-box self-check on the real SmolLM2 builds: the shipped int4 passes, the int8
variant (perplexity about 1.75x fp32 in its own gate) fails, for the reason recorded.
(A few factual prompts only, to keep the test short; the agent asks 8 by default.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.sync.self_check import PERPLEXITY_RATIO_MAX, run_self_check
from models.manifest import load_manifest

SMOLLM2 = "smollm2-135m-instruct"


def test_shipped_int4_passes_and_int8_variant_fails(real_artifacts: Path) -> None:
    good_dir = real_artifacts / SMOLLM2
    good = run_self_check(good_dir, load_manifest(good_dir), threads=2, prompts=4)
    recorded = load_manifest(good_dir).accuracy
    assert recorded is not None
    assert good.passed, good.detail
    assert good.detail == ""
    assert abs(good.perplexity / recorded["perplexity"] - 1) <= 0.02
    assert good.perplexity_ratio <= PERPLEXITY_RATIO_MAX
    assert good.greedy_total == 4 and good.greedy_matched >= 4 * 14 // 20 - 1
    assert good.seconds > 0

    bad_dir = real_artifacts / "_variants" / f"{SMOLLM2}-int8"
    bad = run_self_check(bad_dir, load_manifest(bad_dir), threads=2, prompts=2)
    assert not bad.passed
    assert bad.perplexity_ratio > PERPLEXITY_RATIO_MAX
    assert "x the fp32 reference" in bad.detail
    print(f"self-check int4: {good.seconds:.1f} s, int8: {bad.seconds:.1f} s")


@pytest.mark.slow
def test_tiny_model_checks_its_text_in_windows_of_its_context(tiny_artifacts: Path) -> None:
    """The gate's text is longer than the tiny model's 512-token context (its rotary cache
    ends there): the check scores it in windows, every token once, and passes."""
    from tokenizers import Tokenizer

    from models.gate import LlmGateData
    from models.ort_llm import OrtDecoder

    directory = tiny_artifacts / "tiny-llama"
    manifest = load_manifest(directory)
    assert manifest.llm is not None
    ids = (
        Tokenizer.from_file(str(directory / manifest.tokenizer.file))
        .encode(LlmGateData.load().text, add_special_tokens=False)
        .ids
    )
    assert len(ids) > manifest.context_length

    result = run_self_check(directory, manifest, threads=2, prompts=2)
    assert result.passed, result.detail
    assert 1 < result.perplexity < 1e6 and result.greedy_total == 2

    decoder = OrtDecoder(directory / manifest.graph.onnx, manifest.llm, 2)
    nll, count = decoder.negative_log_likelihood(ids, manifest.context_length)
    assert count == len(ids) - 1
    assert math.exp(nll / count) == pytest.approx(result.perplexity, rel=1e-3)
    # Windows start at the previous window's last token: the same sums as separate passes.
    head, head_n = decoder.negative_log_likelihood(ids[:200])
    tail, tail_n = decoder.negative_log_likelihood(ids[199:300])
    both, both_n = decoder.negative_log_likelihood(ids[:300], 200)
    assert both_n == head_n + tail_n == 299
    assert abs(both - (head + tail)) < 1e-6 * abs(both)
    # A text that fits its window is one pass, as the build measured it.
    assert decoder.negative_log_likelihood(ids[:300], 512) == decoder.negative_log_likelihood(
        ids[:300]
    )
    with pytest.raises(ValueError, match="at least 2 tokens"):
        decoder.negative_log_likelihood(ids, 1)
