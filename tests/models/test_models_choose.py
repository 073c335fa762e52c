"""Which variant ships is a fixed rule: the fewest weight bits that passed the accuracy gate.

Measured speeds never decide. The variants here are made up, with speeds that a speed-based
rule would have followed (fp32 fastest, or the larger quantized variant fastest): the
choice stays the same whatever they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models import build_minilm, build_qwen, build_smollm2
from models.build_minilm import EmbeddingVariant
from models.build_smollm2 import Variant

BITS = {"fp32": 32, "int8": 8, "int4": 4}


def _graph(tmp_path: Path, name: str) -> Path:
    """A stand-in model.onnx whose size follows its bits, as real variants' do."""
    directory = tmp_path / name
    directory.mkdir()
    path = directory / "model.onnx"
    path.write_bytes(b"\0" * BITS[name] * 1000)
    return path


def _passed(name: str, passed: bool) -> dict[str, Any]:
    return {"reference": True, "passed": True} if name == "fp32" else {"passed": passed}


def _llm(tmp_path: Path, speeds: dict[str, float], passed: dict[str, bool]) -> dict[str, Variant]:
    return {
        name: Variant(
            name,
            _graph(tmp_path, name),
            {"method": "made-up", "bits": BITS[name], "block_size": None},
            benchmark={"decode_tokens_per_s": speed, "session_load_s": 0.1},
            accuracy=_passed(name, passed.get(name, True)),
        )
        for name, speed in speeds.items()
    }


def _embedding(tmp_path: Path, speeds: dict[str, float], int8_passed: bool) -> dict[str, Any]:
    return {
        name: EmbeddingVariant(
            name,
            _graph(tmp_path, name),
            {"method": "made-up", "bits": BITS[name], "block_size": None},
            benchmark={"sentences_per_s": speed},
            accuracy=_passed(name, int8_passed),
        )
        for name, speed in speeds.items()
    }


@pytest.mark.parametrize(
    ("speeds", "passed", "shipped"),
    [
        # fp32 twice as fast as both quantized variants (a quiet moment in a loaded run)
        ({"fp32": 200.0, "int8": 100.0, "int4": 100.0}, {}, "int4"),
        # int8 fastest, int4 well behind
        ({"fp32": 100.0, "int8": 200.0, "int4": 120.0}, {}, "int4"),
        # int4 failed the gate: int8 ships even though fp32 is faster
        ({"fp32": 200.0, "int8": 100.0, "int4": 300.0}, {"int4": False}, "int8"),
        # nothing quantized passed: fp32, however slow
        ({"fp32": 10.0, "int8": 200.0, "int4": 300.0}, {"int4": False, "int8": False}, "fp32"),
    ],
)
def test_smollm2_ships_the_fewest_bits_that_passed_whatever_the_speeds(
    tmp_path: Path, speeds: dict[str, float], passed: dict[str, bool], shipped: str
) -> None:
    name, reason = build_smollm2._choose(_llm(tmp_path, speeds, passed), skip_gate=False)
    assert name == shipped, reason
    assert "fastest" not in reason


def test_smollm2_without_the_gate_ships_the_fewest_bits_not_the_fastest(tmp_path: Path) -> None:
    variants = _llm(tmp_path, {"fp32": 50.0, "int8": 300.0, "int4": 100.0}, {})
    for variant in variants.values():
        variant.accuracy = None
    assert build_smollm2._choose(variants, skip_gate=True)[0] == "int4"


@pytest.mark.parametrize(
    ("speeds", "int8_passed", "shipped"),
    [
        ({"fp32": 900.0, "int8": 400.0}, True, "int8"),  # fp32 faster: int8 all the same
        ({"fp32": 400.0, "int8": 900.0}, True, "int8"),
        ({"fp32": 100.0, "int8": 900.0}, False, "fp32"),
    ],
)
def test_minilm_ships_int8_when_it_passed_whatever_the_speeds(
    tmp_path: Path, speeds: dict[str, float], int8_passed: bool, shipped: str
) -> None:
    variants = _embedding(tmp_path, speeds, int8_passed)
    name, reason = build_minilm._choose(variants, skip_gate=False)
    assert name == shipped, reason
    assert "fastest" not in reason


def test_the_rule_is_part_of_the_build_key() -> None:
    """Artifacts chosen by the old (speed) rule are rebuilt, not reused."""
    from models.context import BuildOptions

    options = BuildOptions(out=Path("unused"))
    for module in (build_minilm, build_smollm2, build_qwen):
        rule = module.key_options(options)["ship"]
        assert rule.startswith("fewest weight bits that passed the gate"), module.__name__
