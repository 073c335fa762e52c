"""Q4_1 block offsets: the rewrite is exact, and asymmetric 4-bit then reproduces the weights."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np


def _q4_1_weight(rng: np.random.Generator, k: int, n: int, block: int = 32) -> np.ndarray:
    """A [k, n] weight whose blocks of 32 along k are d*q + m, as GGUF Q4_1 stores them."""
    q = rng.integers(0, 16, size=(k // block, block, n)).astype(np.float32)
    q[:, 0, :], q[:, 1, :] = 0, 15  # Q4_1 blocks span their full range
    d = rng.uniform(0.001, 0.02, size=(k // block, 1, n)).astype(np.float32)
    m = rng.uniform(-0.15, 0.05, size=(k // block, 1, n)).astype(np.float32)
    return (q * d + m).reshape(k, n)


def _graph(path: Path, weight: np.ndarray) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"], name="/layer/MatMul")],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "s", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))


def _run(path: Path, a: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"a": a})
    return np.asarray(y)


def test_rewrite_is_exact_and_4bit_reproduces_q4_1(tmp_path: Path) -> None:
    importlib.import_module("onnx_ir")
    from models.block_offsets import absorb_block_offsets
    from models.quantize import quantize_nbits

    rng = np.random.default_rng(0)
    weight = _q4_1_weight(rng, 128, 16)
    a = rng.standard_normal((2, 3, 128)).astype(np.float32)
    expected = a @ weight
    _graph(tmp_path / "fp32.onnx", weight)

    info = absorb_block_offsets(tmp_path / "fp32.onnx", tmp_path / "offsets.onnx")
    assert info["rewritten"] == 1 and info["skipped"] == 0
    np.testing.assert_allclose(_run(tmp_path / "offsets.onnx", a), expected, rtol=1e-4, atol=1e-4)

    exclude = tuple(info["correction_matmuls"])
    quantize_nbits(
        tmp_path / "offsets.onnx", tmp_path / "exact.onnx", symmetric=False, exclude_extra=exclude
    )
    quantize_nbits(tmp_path / "fp32.onnx", tmp_path / "plain.onnx", symmetric=False)
    exact_err = np.abs(_run(tmp_path / "exact.onnx", a) - expected).max()
    plain_err = np.abs(_run(tmp_path / "plain.onnx", a) - expected).max()
    assert exact_err < 1e-3
    assert plain_err > 10 * exact_err


def test_weights_off_the_grid_are_left_alone(tmp_path: Path) -> None:
    from models.block_offsets import absorb_block_offsets

    weight = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    _graph(tmp_path / "fp32.onnx", weight)
    info = absorb_block_offsets(tmp_path / "fp32.onnx", tmp_path / "out.onnx")
    assert info == {"rewritten": 0, "skipped": 1, "correction_matmuls": []}
