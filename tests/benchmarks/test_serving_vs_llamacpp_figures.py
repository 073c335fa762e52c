"""benchmarks/serving_vs_llamacpp's --model: which results file, which targets (no server:
waves as the benchmark records them)."""

from __future__ import annotations

from typing import Any

from benchmarks.serving_vs_llamacpp import (
    DEFAULT_CONCURRENCY,
    QWEN,
    SMOLLM2,
    model_targets,
    results_name,
    ttft_p50,
)


def test_smollm2_keeps_its_results_file_and_qwen_gets_its_own() -> None:
    assert results_name(SMOLLM2, "shared") == "serving_vs_llamacpp"
    assert results_name(SMOLLM2, "distinct") == "serving_vs_llamacpp_distinct"
    assert results_name(QWEN, "shared") == "serving_vs_llamacpp_qwen2.5-coder-0.5b-instruct"
    assert results_name(QWEN, "distinct") == (
        "serving_vs_llamacpp_qwen2.5-coder-0.5b-instruct_distinct"
    )
    assert DEFAULT_CONCURRENCY[SMOLLM2] == [1, 4, 16, 32]
    assert DEFAULT_CONCURRENCY[QWEN] == [1, 4, 16]  # issue 25's c = 1, 4, 16


def wave(aggregate: float, ttft: float, decode: float = 50.0) -> dict[str, Any]:
    return {
        "aggregate_tokens_per_s": aggregate,
        "ttft_p50_s": ttft,
        "decode_tokens_per_s_p50": decode,
    }


def test_qwen_targets_are_the_aggregate_ratios_at_1_and_16() -> None:
    ours = {"1": wave(30.0, 0.2), "4": wave(90.0, 0.4), "16": wave(150.0, 1.5)}
    theirs = {"1": wave(30.0, 0.3), "4": wave(31.0, 2.0), "16": wave(50.0, 20.0)}
    ratios = {"1": 1.0, "4": 2.9, "16": 3.0}
    targets = model_targets(QWEN, ours, theirs, ratios)
    assert targets == {
        "aggregate_ratio_c1": {"value": 1.0, "target": ">= 1.0", "met": True},
        "aggregate_ratio_c16": {"value": 3.0, "target": ">= 3.0", "met": True},
    }
    missed = model_targets(QWEN, ours, theirs, {"1": 0.99, "16": 2.5})
    assert [t["met"] for t in missed.values()] == [False, False]
    # a run without c = 16 records only what it measured
    assert list(model_targets(QWEN, ours, theirs, {"1": 1.2})) == ["aggregate_ratio_c1"]
    assert ttft_p50(ours, theirs)["16"] == {"edgefleet": 1.5, "llamacpp": 20.0}


def test_smollm2_targets_are_unchanged() -> None:
    ours = {"1": wave(100.0, 0.04, decode=110.0), "16": wave(600.0, 0.5)}
    theirs = {"1": wave(80.0, 0.05, decode=100.0), "16": wave(110.0, 16.0)}
    targets = model_targets(SMOLLM2, ours, theirs, {"1": 1.25, "16": 5.45})
    assert set(targets) == {
        "single_stream_decode_ratio", "ttft_p50_c1_s", "aggregate_ratio_c16", "ttft_p50_c16_s",
    }  # fmt: skip
    assert targets["single_stream_decode_ratio"] == {"value": 1.1, "target": ">= 1.0", "met": True}
    assert targets["ttft_p50_c1_s"]["target"] == "<= llama.cpp's 0.05"
    assert all(t["met"] for t in targets.values())


def test_memory_targets_idle_rss_beside_llamacpps_and_smollm2s_extra() -> None:
    from benchmarks.serving_vs_llamacpp import memory_targets

    # the model's share loaded and idle is judged; after the run (prefix cache full) shown
    ours = {"rss_mib": 250.0, "extra_rss_loaded_idle_mib": 120.0, "extra_rss_mib": 170.0}
    theirs = {"rss_mib": 260.0, "peak_rss_mib": 300.0}
    assert memory_targets(SMOLLM2, ours, theirs) == {
        "idle_rss_mib": {"value": 250.0, "target": "<= llama.cpp's 260.0", "met": True},
        "extra_rss_loaded_idle_mib": {"value": 120.0, "target": "<= 130.0", "met": True},
    }
    heavy = memory_targets(
        SMOLLM2, {**ours, "rss_mib": 270.0, "extra_rss_loaded_idle_mib": 131.0}, theirs
    )
    assert [t["met"] for t in heavy.values()] == [False, False]
    # Qwen: beside llama.cpp only; nothing measured, nothing claimed
    assert list(memory_targets(QWEN, ours, theirs)) == ["idle_rss_mib"]
    assert memory_targets(QWEN, None, theirs) == {}
