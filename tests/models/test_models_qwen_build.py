"""The Qwen2.5-Coder target's rules: which variant ships (the fewest weight bits that passed
the gate, never the 2.5 GB fp32 reference), and which layer MatMuls stay 8-bit in its int4
(those holding GGUF tensors of more than 5 bits), read from the real GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models.build_qwen import Variant, _matmuls_over_5_bits, choose
from models.errors import ConversionError
from models.sources import locate_qwen_gguf


def _variants(passed: dict[str, bool], speeds: dict[str, float]) -> dict[str, Variant]:
    def accuracy(name: str) -> dict[str, Any]:
        return {"reference": True, "passed": True} if name == "fp32" else {"passed": passed[name]}

    return {
        name: Variant(
            name,
            Path(f"/nowhere/{name}/model.onnx"),
            {"method": "made-up", "bits": bits, "block_size": None},
            benchmark={"decode_tokens_per_s": speeds[name]},
            accuracy=accuracy(name),
        )
        for name, bits in (("fp32", 32), ("int8", 8), ("int4", 4))
    }


@pytest.mark.parametrize(
    ("passed", "speeds", "shipped"),
    [
        ({"int4": True, "int8": True}, {"fp32": 90.0, "int8": 80.0, "int4": 20.0}, "int4"),
        ({"int4": False, "int8": True}, {"fp32": 90.0, "int8": 20.0, "int4": 80.0}, "int8"),
    ],
)
def test_the_fewest_bits_that_passed_ships_whatever_the_speeds(
    passed: dict[str, bool], speeds: dict[str, float], shipped: str
) -> None:
    chosen, reason = choose(_variants(passed, speeds), skip_gate=False)
    assert chosen == shipped
    assert "speeds recorded, not compared" in reason


def test_nothing_passed_fails_the_build_instead_of_shipping_fp32() -> None:
    variants = _variants({"int4": False, "int8": False}, {"fp32": 1.0, "int8": 1.0, "int4": 1.0})
    with pytest.raises(ConversionError, match="neither int4 nor int8 passed"):
        choose(variants, skip_gate=False)
    assert choose(variants, skip_gate=True)[0] == "int4"


@pytest.mark.slow  # 14 s: quantizes a Qwen-shaped graph
def test_matmuls_holding_q8_0_and_q6_k_tensors_stay_8_bit() -> None:
    nodes = _matmuls_over_5_bits(locate_qwen_gguf().path)
    # attn_v (Q8_0) and ffn_down (Q6_K) in the same 12 of the 24 layers
    layers = ("0", "1", "3", "6", "7", "8", "9", "10", "13", "16", "19", "21")
    assert nodes == tuple(
        sorted(
            f"/model.layers.{i}/{part}/MatMul"
            for i in layers
            for part in ("attn/qkv_proj", "mlp/down_proj")
        )
    )
