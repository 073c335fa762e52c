"""The on-box self-check on the real SmolLM2 builds: the shipped int4 passes, the int8
variant (perplexity about 1.75x fp32 in its own gate) fails, for the reason recorded.
(A few factual prompts only, to keep the test short; the agent asks 8 by default.)"""

from __future__ import annotations

from pathlib import Path

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
