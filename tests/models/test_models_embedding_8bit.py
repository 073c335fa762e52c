"""The decoder post-pass: the token embedding stored 8-bit, the weights as external data.

A table made of GGUF-style blocks (Q8_0, Q5_0, Q4_0: an fp16 step times small integers)
comes back exactly from ``GatherBlockQuantized``; other blocks within half an 8-bit step.
The weights leave the graph file for ``model.onnx.data``, which the artifact lists, hashes
and covers in its version; the shipped SmolLM2 table equals the fp32 variant's exactly.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from models.artifact import graph_io, install_dir, onnx_files
from models.errors import ConversionError, IntegrityError
from models.manifest import load_manifest, manifest_from_dict, verify_files
from tests.models.test_models_manifest import valid_llm

BLOCK = 32


def _blocks(rng: np.random.Generator, rows: int, kind: str) -> np.ndarray:
    """``rows`` rows of 4 blocks as a GGUF tensor of ``kind`` dequantizes to (or random)."""
    shape = (rows, 4, BLOCK)
    d = rng.uniform(1e-3, 2e-2, size=(rows, 4, 1)).astype(np.float16).astype(np.float32)
    if kind == "q8_0":  # d = amax / 127: the largest |q| is 127
        q = rng.integers(-127, 128, size=shape)
        q[..., 0] = rng.choice([-127, 127], size=(rows, 4))
    elif kind == "q5_0":  # d = max / -16: q in -16..15, -16 reached
        q = rng.integers(-16, 16, size=shape)
        q[..., 0] = -16
    elif kind == "q4_0":
        q = rng.integers(-8, 8, size=shape)
        q[..., 0] = -8
    else:
        return rng.standard_normal(shape).astype(np.float32).reshape(rows, 4 * BLOCK) * 0.05
    return (d * q.astype(np.float32)).reshape(rows, 4 * BLOCK)


def _table() -> tuple[np.ndarray, dict[str, int]]:
    rng = np.random.default_rng(7)
    kinds = {"q8_0": 40, "q5_0": 12, "q4_0": 8, "random": 4}
    table = np.concatenate([_blocks(rng, rows, kind) for kind, rows in kinds.items()])
    table[-1, :BLOCK] = 0.0  # an all-zero block
    return table, kinds


def _decoder_graph(path: Path, table: np.ndarray) -> np.ndarray:
    """``embeddings = Gather(table, input_ids)``, then a MatMul by a second weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width = table.shape[1]
    weight = np.random.default_rng(1).standard_normal((width, 50)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node(
                "Gather",
                ["embed.weight", "input_ids"],
                ["embeddings"],
                name="/model/embed_tokens/Gather",
            ),
            helper.make_node("MatMul", ["embeddings", "w"], ["logits"], name="/head/MatMul"),
        ],
        "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [
            helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["b", "s", width]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 50]),
        ],
        [numpy_helper.from_array(table, "embed.weight"), numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return weight


def _run(path: Path, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    embeddings, logits = session.run(["embeddings", "logits"], {"input_ids": ids})
    return np.asarray(embeddings), np.asarray(logits)


def test_embedding_becomes_gather_block_quantized_8bit_and_grids_come_back_exactly(
    tmp_path: Path,
) -> None:
    import onnx
    from onnx import numpy_helper

    from models.quantize import finish_llm_graph

    table, kinds = _table()
    weight = _decoder_graph(tmp_path / "src" / "model.onnx", table)
    details = finish_llm_graph(tmp_path / "src" / "model.onnx", tmp_path / "out" / "model.onnx")

    graph = onnx.load(str(tmp_path / "out" / "model.onnx")).graph
    (node,) = [n for n in graph.node if n.name == "/model/embed_tokens/Gather"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain) == ("GatherBlockQuantized", "com.microsoft")
    assert attrs == {"bits": 8, "block_size": BLOCK, "gather_axis": 0, "quantize_axis": 1}
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert "embed.weight" not in inits  # the fp32 table is gone
    assert inits[node.input[0]].dtype == np.uint8
    assert (inits[node.input[3]] == 128).all()

    emb = details["token_embedding"]
    rows = {k: v * 4 for k, v in kinds.items()}
    blocks = emb["blocks"]
    assert (blocks["q8_0"], blocks["zero"], blocks["rounded"]) == (
        rows["q8_0"],
        1,
        rows["random"] - 1,
    )
    # a Q4_0 block (step d, |q| <= 8) is also on the Q5_0 candidate's grid (step d / 2)
    assert blocks["q5_0"] + blocks["q4_0"] == rows["q5_0"] + rows["q4_0"]
    assert emb["exact"] is False

    ids = np.arange(table.shape[0], dtype=np.int64)[None, :]
    embeddings, logits = _run(tmp_path / "out" / "model.onnx", ids)
    grid_rows = sum(kinds.values()) - kinds["random"]
    np.testing.assert_array_equal(embeddings[0, :grid_rows], table[:grid_rows])  # bit for bit
    amax = np.abs(table[grid_rows:].reshape(-1, 4, BLOCK)).max(axis=-1, keepdims=True)
    error = np.abs(embeddings[0, grid_rows:] - table[grid_rows:]).reshape(-1, 4, BLOCK)
    assert (error <= amax / 254 * 1.0001).all()
    assert error.max() > 0 and emb["max_abs_error"] == pytest.approx(error.max(), rel=1e-5)
    np.testing.assert_allclose(logits[0], embeddings[0] @ weight, rtol=1e-4, atol=1e-4)


def test_weights_go_to_external_data_on_pages(tmp_path: Path) -> None:
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from models.quantize import finish_llm_graph

    table, _ = _table()
    table = np.tile(table, (40, 1))  # a table over 64 KiB: page-aligned
    _decoder_graph(tmp_path / "src" / "model.onnx", table)
    out = tmp_path / "out" / "model.onnx"
    details = finish_llm_graph(tmp_path / "src" / "model.onnx", out)

    data = out.with_name("model.onnx.data")
    assert onnx_files(out.parent) == [out, data]
    assert details["external_data"]["file"] == "model.onnx.data"
    assert details["external_data"]["bytes"] == data.stat().st_size
    graph = onnx.load(str(out), load_external_data=False).graph
    external = {t.name: ExternalDataInfo(t) for t in graph.initializer if uses_external_data(t)}
    assert len(external) == details["external_data"]["tensors"] == 4  # data, scales, zp, w
    assert all(info.location == "model.onnx.data" for info in external.values())
    assert all(i.offset % 4096 == 0 for i in external.values())  # a page each
    assert out.stat().st_size < 4096  # the graph file holds no weights

    # the location is relative: the pair moves together, and runs the same
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in onnx_files(out.parent):
        shutil.move(path, moved / path.name)
    ids = np.array([[0, 5, 7]], dtype=np.int64)
    np.testing.assert_array_equal(_run(moved / "model.onnx", ids)[0][0], table[[0, 5, 7]])


def _stage(tmp_path: Path, name: str) -> tuple[Path, Path]:
    from models.quantize import finish_llm_graph

    table, _ = _table()
    _decoder_graph(tmp_path / "src" / "model.onnx", table)
    staging = tmp_path / name
    finish_llm_graph(tmp_path / "src" / "model.onnx", staging / "model.onnx")
    (staging / "tokenizer.json").write_text("{}", encoding="utf-8")
    return staging, tmp_path / f"{name}-final"


def test_the_artifact_lists_hashes_and_versions_the_external_data(tmp_path: Path) -> None:
    staging, final = _stage(tmp_path, "staging")
    manifest = replace(manifest_from_dict(valid_llm()), graph=graph_io(staging / "model.onnx"))
    written = install_dir(staging, final, manifest)

    listed = {f.path: f for f in written.files}
    data = final / "model.onnx.data"
    assert listed["model.onnx.data"].size == data.stat().st_size
    verify_files(load_manifest(final), final)
    # the version covers the weights: another table, another version
    staging2, final2 = _stage(tmp_path / "two", "staging")
    onnx_path = tmp_path / "two" / "src" / "model.onnx"
    _decoder_graph(onnx_path, _table()[0] * 2)
    from models.quantize import finish_llm_graph

    finish_llm_graph(onnx_path, staging2 / "model.onnx")
    assert install_dir(staging2, final2, manifest).version != written.version

    # tampered weights fail verification
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=r"model\.onnx\.data"):
        verify_files(load_manifest(final), final)
    data.unlink()
    with pytest.raises(IntegrityError, match=r"model\.onnx\.data: missing"):
        verify_files(load_manifest(final), final, check_hash=False)


def test_an_artifact_without_its_external_data_is_refused(tmp_path: Path) -> None:
    staging, final = _stage(tmp_path, "staging")
    (staging / "model.onnx.data").unlink()
    manifest = replace(manifest_from_dict(valid_llm()), graph=graph_io(staging / "model.onnx"))
    with pytest.raises(ConversionError, match=r"external data 'model\.onnx\.data'"):
        install_dir(staging, final, manifest)


def test_shipped_smollm2_embedding_is_8bit_and_equals_the_fp32_table(
    real_artifacts: Path,
) -> None:
    """The shipped int4 graph's token embedding is GatherBlockQuantized bits=8, its weights
    are listed external data, and its table dequantizes to the fp32 variant's exactly (the
    GGUF's Q8_0 table, losslessly)."""
    import onnx
    from onnx import numpy_helper

    shipped = real_artifacts / "smollm2-135m-instruct"
    manifest = load_manifest(shipped)
    assert {"model.onnx", "model.onnx.data"} <= {f.path for f in manifest.files}
    verify_files(manifest, shipped)
    details = manifest.quantization.details["token_embedding"]
    assert details["exact"] is True and details["method"] == "gather-block-quantized-8bit"

    graph = onnx.load(str(shipped / "model.onnx")).graph
    (node,) = [n for n in graph.node if n.name == "/model/embed_tokens/Gather"]
    assert (node.op_type, node.domain) == ("GatherBlockQuantized", "com.microsoft")
    inits = {i.name: i for i in graph.initializer}
    q = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
    scales = numpy_helper.to_array(inits[node.input[2]])
    zero = numpy_helper.to_array(inits[node.input[3]]).astype(np.float32)
    rows, blocks = scales.shape
    table = ((q.reshape(rows, blocks, -1) - zero[..., None]) * scales[..., None]).reshape(rows, -1)

    fp32 = real_artifacts / "_variants" / "smollm2-135m-instruct-fp32" / "model.onnx"
    reference = next(
        numpy_helper.to_array(i)
        for i in onnx.load(str(fp32)).graph.initializer
        if i.name == "model.embed_tokens.weight"
    )
    np.testing.assert_array_equal(table, reference)
