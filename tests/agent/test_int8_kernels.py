"""8-bit matrix products in fp32 on CPUs without 8-bit dot products (agent/engine/int8_kernels):
which CPUs, the rewrite's arithmetic (against ONNX Runtime's own MatMulNBits computing in
fp32), and the real embedding model through the agent's loader."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

import agent.engine.int8_kernels as kernels
import agent.engine.ort_session as ort_session
from agent.engine.int8_kernels import (
    cpu_flags,
    eight_bit_as_fp32,
    graph_for_this_cpu,
    slow_8bit_products,
)
from agent.engine.ort_session import SessionConfig
from agent.model_loader import load_registry

K, N = 70, 48  # K not a multiple of the block: the last block is padded


def test_cpu_flags_and_which_cpus_are_slow() -> None:
    info = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t: x\n"
    assert cpu_flags(info) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags("no flags here") == frozenset()
    avx2 = frozenset({"sse2", "avx", "avx2", "fma"})
    assert slow_8bit_products(avx2, "x86_64")  # AMD Zen 2/3, Intel before VNNI
    assert not slow_8bit_products(avx2 | {"avx512f", "avx512_vnni"}, "x86_64")
    assert not slow_8bit_products(avx2 | {"avx_vnni"}, "x86_64")  # Alder Lake
    assert not slow_8bit_products(avx2 | {"amx_int8"}, "AMD64")
    assert not slow_8bit_products(frozenset({"asimd", "asimddp"}), "aarch64")
    assert not slow_8bit_products(frozenset({"sse2"}), "x86_64")  # nothing measured there


def quantized(tmp_path: Path, symmetric: bool, bias: bool) -> Path:
    """A MatMul of fp32 weights quantized to 8-bit MatMulNBits with fp32 compute
    (accuracy_level 0), with an optional bias input, saved."""
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(K, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    quantizer = MatMulNBitsQuantizer(
        model, bits=8, block_size=32, is_symmetric=symmetric, accuracy_level=0
    )
    quantizer.process()
    out = quantizer.model.model
    (node,) = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
    assert bool(symmetric) == (len(node.input) < 4 or not node.input[3])
    if bias:
        node.input.extend([""] * (5 - len(node.input)) + ["bias"])
        values = rng.normal(size=N).astype(np.float32)
        out.graph.initializer.append(numpy_helper.from_array(values, "bias"))
    path = tmp_path / f"q{int(symmetric)}{int(bias)}.onnx"
    onnx.save(out, str(path))
    return path


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_the_rewrite_computes_what_matmulnbits_computes(
    tmp_path: Path, symmetric: bool, bias: bool
) -> None:
    path = quantized(tmp_path, symmetric, bias)
    rewritten = eight_bit_as_fp32(path)
    assert rewritten is not None
    ops = [n.op_type for n in onnx.load_from_string(rewritten).graph.node]
    assert "MatMulNBits" not in ops and ops.count("MatMul") == 1
    assert ops.count("Add") == int(bias)
    x = np.random.default_rng(1).normal(size=(5, K)).astype(np.float32)
    expected = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    got = ort.InferenceSession(rewritten).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_graph_without_8_bit_products_is_not_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = quantized(tmp_path, True, False)
    model = onnx.load(str(path))
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "bits":
                attr.i = 4  # as if 4-bit (the LLMs' weights): left as shipped
    four = tmp_path / "four.onnx"
    onnx.save(model, str(four))
    assert eight_bit_as_fp32(four) is None
    monkeypatch.setattr(kernels, "slow_8bit_products", lambda: True)
    with graph_for_this_cpu(four) as given:
        assert given == four
    with graph_for_this_cpu(path) as given:
        assert given != path and given.exists()
        assert "MatMulNBits" not in {n.op_type for n in onnx.load(str(given)).graph.node}
    assert not given.exists()  # a temporary file, removed once the session is made
    monkeypatch.setattr(kernels, "slow_8bit_products", lambda: False)
    with graph_for_this_cpu(path) as given:
        assert given == path


@pytest.mark.real_models
def test_the_embedding_model_is_loaded_in_fp32_where_int8_is_slow(
    real_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent's loader: only the embedding model's graph goes through the choice,
    and the fp32 products give the 8-bit graph's embeddings (cosine >= 0.999)."""
    asked: list[Path] = []

    def spy(path: Path) -> AbstractContextManager[Path]:
        asked.append(path)
        return kernels.graph_for_this_cpu(path)

    monkeypatch.setattr(ort_session, "graph_for_this_cpu", spy)
    vectors = {}
    for slow in (False, True):
        monkeypatch.setattr(kernels, "slow_8bit_products", lambda slow=slow: slow)
        registry = load_registry(
            real_artifacts,
            ["all-minilm-l6-v2", "smollm2-135m-instruct"],
            session_config=SessionConfig(intra_op_threads=1),
            max_context_tokens=512,
        )
        model = registry.embedding_models["all-minilm-l6-v2"]
        session = model._session  # type: ignore[attr-defined]
        names = {i.name for i in session.get_inputs()}
        ids = np.array([[101, 7592, 1010, 2088, 999, 2129, 2024, 2017, 102]], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        vectors[slow] = session.run(None, feed)[0].mean(axis=1)[0]
    assert [p.parent.name for p in asked] == ["all-minilm-l6-v2"] * 2  # not the LLM's
    a, b = vectors[False], vectors[True]
    assert not np.array_equal(a, b)  # another computation ...
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.999  # ... the same vector


def test_the_fp32_graph_needs_no_writable_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent image's root file system is read-only (its runbook test found the embedding
    model missing when the graph went to a temporary file): on Linux the graph is an
    anonymous memory file; where no file can be written at all, the graph as shipped."""
    path = quantized(tmp_path, True, False)
    monkeypatch.setattr(kernels, "slow_8bit_products", lambda: True)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))  # no temporary directory
    monkeypatch.setattr(kernels.tempfile, "tempdir", None)
    with graph_for_this_cpu(path) as given:
        assert str(given).startswith("/proc/self/fd/")
        x = np.ones((2, K), np.float32)
        got = ort.InferenceSession(str(given)).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ort.InferenceSession(str(path)).run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)  # fmt: skip

    def unwritable(*args: object) -> Path:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(kernels, "_scratch_file", unwritable)
    with graph_for_this_cpu(path) as given:
        assert given == path


def test_without_the_onnx_package_the_graph_runs_as_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent images install no onnx package (it is in the convert extra): the embedding
    model loaded nowhere in them when the rewrite needed it (the runbook test)."""
    path = quantized(tmp_path, True, False)
    monkeypatch.setattr(kernels, "slow_8bit_products", lambda: True)
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx: ImportError
    with graph_for_this_cpu(path) as given:
        assert given == path
