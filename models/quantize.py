"""Quantize exported ONNX graphs with onnxruntime.quantization.

- :func:`quantize_int8_dynamic`: dynamic int8 weights (activations quantized at run time),
  per tensor or per channel, optionally limited to some operator types.
- :func:`quantize_nbits`: 4-bit block-wise weights (MatMulNBits), and 4-bit Gather for the
  token embedding when asked.
- :func:`quantize_int4_llm`: a decoder's 4-bit layers and 8-bit head, then
  :func:`finish_llm_graph`.
- :func:`finish_llm_graph`: the post-pass every LLM graph gets before it ships: the token
  embedding stored 8-bit (:func:`quantize_embedding_8bit`) and the weights written as external
  data (:func:`save_external_data`), which ONNX Runtime memory-maps instead of copying.

The first two read ``src`` and write a single-file graph ``dst``; the post-pass writes ``dst``
plus ``dst.data``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from models._quiet import quiet
from models.errors import ConversionError

__all__ = [
    "EMBEDDING_ZERO_POINT",
    "EXTERNAL_DATA_SUFFIX",
    "finish_llm_graph",
    "output_matmul",
    "quantize_embedding_8bit",
    "quantize_int4_llm",
    "quantize_int8_dynamic",
    "quantize_nbits",
    "save_external_data",
    "token_embedding_gather",
]

log = logging.getLogger(__name__)

EXTERNAL_DATA_SUFFIX = ".data"  # model.onnx -> model.onnx.data (what onnx_files lists)
PAGE = 4096  # every external tensor starts on a page of its own
EMBEDDING_ZERO_POINT = 128  # uint8 q + 128 holds a signed int8 q exactly
# Block scales tried before plain rounding, largest |q| first: a GGUF Q8_0 block stores
# d * q with |q| <= 127 and its largest |q| exactly 127; Q5_0 and Q4_0 blocks reach -16 and
# -8. The first candidate whose fp16 scale reproduces every value of a block is used.
_GRID_STEPS = {"q8_0": 127, "q5_0": 16, "q4_0": 8}


def quantize_int8_dynamic(
    src: Path,
    dst: Path,
    *,
    per_channel: bool,
    op_types: tuple[str, ...] | None = None,
    nodes: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Dynamic int8 quantization; returns the manifest's quantization details."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with quiet():
        from onnxruntime.quantization import (
            QuantType,
            quantize_dynamic,
        )

        try:
            quantize_dynamic(
                model_input=str(src),
                model_output=str(dst),
                per_channel=per_channel,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=list(op_types) if op_types else None,
                nodes_to_quantize=list(nodes) if nodes else None,
                use_external_data_format=False,
                # shape inference cannot type the outputs of contrib ops (attention)
                extra_options={"DefaultTensorType": 1},  # onnx.TensorProto.FLOAT
            )
        except Exception as exc:  # library boundary
            raise ConversionError(f"int8 quantization of {src} failed: {exc}") from exc
    return {
        "method": "dynamic-int8-per-channel" if per_channel else "dynamic-int8-per-tensor",
        "bits": 8,
        "block_size": None,
        "weight_type": "int8",
        "per_channel": per_channel,
        "op_types": list(op_types) if op_types else "default",
    }


def quantize_nbits(
    src: Path,
    dst: Path,
    *,
    bits: int = 4,
    block_size: int = 32,
    symmetric: bool = True,
    quantize_gather: bool = True,
    accuracy_level: int | None = None,
    exclude_nodes: tuple[str, ...] = (),
    exclude_extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """4-bit block-wise weight-only quantization (MatMulNBits, GatherBlockQuantized).

    ``exclude_nodes`` are reported in the details; ``exclude_extra`` are excluded silently
    (e.g. the hundreds of small correction MatMuls of :mod:`models.block_offsets`).
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    op_types: tuple[str, ...] = ("MatMul", "Gather") if quantize_gather else ("MatMul",)
    with quiet():
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            MatMulNBitsQuantizer,
        )

        try:
            model = onnx.load(str(src))
            quantizer = MatMulNBitsQuantizer(
                model,
                bits=bits,
                block_size=block_size,
                is_symmetric=symmetric,
                accuracy_level=accuracy_level,
                nodes_to_exclude=sorted(set(exclude_nodes) | set(exclude_extra)),
                op_types_to_quantize=op_types,
                quant_axes=(("MatMul", 0), ("Gather", 1)),
            )
            quantizer.process()
            quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
        except Exception as exc:  # library boundary
            raise ConversionError(f"4-bit quantization of {src} failed: {exc}") from exc
    counts = _op_counts(dst)
    log.info(
        "%d-bit graph: %d MatMulNBits, %d GatherBlockQuantized, %d MatMul left",
        bits,
        counts.get("MatMulNBits", 0),
        counts.get("GatherBlockQuantized", 0),
        counts.get("MatMul", 0),
    )
    return {
        "method": "matmul-nbits",
        "bits": bits,
        "block_size": block_size,
        "symmetric": symmetric,
        "accuracy_level": accuracy_level,
        "op_types": list(op_types),
        "excluded_nodes": list(exclude_nodes),
        "quantized_ops": {k: counts.get(k, 0) for k in ("MatMulNBits", "GatherBlockQuantized")},
    }


def _op_counts(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def output_matmul(path: Path, output: str = "logits") -> str:
    """Name of the MatMul node that produces ``output`` (the LM head), directly or via a cast."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    node = producers.get(output)
    while node is not None and node.op_type != "MatMul":
        node = producers.get(node.input[0]) if node.op_type in ("Cast", "Identity") else None
    if node is None:
        raise ConversionError(f"{path}: no MatMul produces {output!r}")
    return str(node.name)


def quantize_int4_llm(
    src: Path,
    dst: Path,
    *,
    symmetric: bool,
    block_size: int = 32,
    accuracy_level: int | None = 4,
    exact_q4_1: bool = True,
) -> dict[str, Any]:
    """4-bit decoder: MatMulNBits for every layer MatMul, the embedding kept fp32, and the
    LM head as weight-only 8-bit MatMulNBits.

    With ``exact_q4_1`` the GGUF Q4_1 block minimums are first moved into a small
    correction (see :mod:`models.block_offsets`; weight-only 8-bit in the end), so
    asymmetric 4-bit weights reproduce the source weights exactly. Measured on SmolLM2-135M
    (perplexity relative to fp32): plain round-to-nearest 1.21x (4-bit head) / 1.14x (int8
    head); exact Q4_1 + int8 head 1.004x. ``accuracy_level=4`` (int8 activations inside
    MatMulNBits) decoded ~1.4x faster than fp32 compute at +0.4% perplexity.
    """
    from models.block_offsets import absorb_block_offsets

    dst.parent.mkdir(parents=True, exist_ok=True)
    head = output_matmul(src)
    exclude: tuple[str, ...] = (head,)
    details: dict[str, Any] = {}
    source = src
    if exact_q4_1:
        source = dst.with_name(dst.stem + ".offsets.onnx")
        absorbed = absorb_block_offsets(src, source, block=block_size, exclude=(head,))
        exclude += tuple(absorbed["correction_matmuls"])
        details["q4_1_block_offsets"] = {
            "rewritten_matmuls": absorbed["rewritten"],
            "not_on_q4_1_grid": absorbed["skipped"],
        }
    tmp = dst.with_name(dst.stem + ".nbits.onnx")
    details = {
        **quantize_nbits(
            source,
            tmp,
            block_size=block_size,
            symmetric=symmetric,
            # The token embedding stays fp32: a Gather is a lookup, so quantizing it saves
            # disk and memory but no time, and both 4-bit and fp16 embeddings cost accuracy
            # here (measured: 13-14/20 factual answers and "capital of France" wrong, against
            # 15/20 and right with fp32; perplexity 1.027x against 1.018x).
            quantize_gather=False,
            accuracy_level=accuracy_level,
            exclude_nodes=(head,),
            exclude_extra=exclude,
        ),
        **details,
    }
    # The LM head: weight-only 8-bit with int8 compute per row block. Dynamic int8 (one
    # activation scale for the whole input) made a row's logits depend on the other rows of
    # the call: batched decode differed from decoding alone (max logit difference 0.57).
    # Weight-only int8 is batch-invariant (difference 0.0) and closer to fp32 (perplexity
    # 1.007x against 1.018x). The Q4_1 correction MatMuls go 8-bit in the same pass: in fp32
    # they were 13 MB read per decoded token and ~8% of batch-1 decode time; at 8 bits their
    # rounding is under 1/250 of a correction that is itself at most half a Q4_1 step
    # (perplexity 13.02 against 13.09 with fp32 corrections, 15.57 without them).
    quantize_nbits(
        tmp,
        dst,
        bits=8,
        block_size=block_size,
        symmetric=True,
        quantize_gather=False,
        accuracy_level=4,
    )
    tmp.unlink()
    if source != src:
        source.unlink()
    details["lm_head"] = {"node": head, "method": "matmul-nbits-8bit-accuracy-level-4"}
    if exact_q4_1:
        details["q4_1_block_offsets"]["corrections"] = "matmul-nbits-8bit-accuracy-level-4"
    return {**details, **finish_llm_graph(dst, dst)}


def finish_llm_graph(src: Path, dst: Path, *, embedding_8bit: bool = True) -> dict[str, Any]:
    """The post-pass of every decoder graph the pipeline ships: the token embedding stored
    8-bit (:func:`quantize_embedding_8bit`) unless ``embedding_8bit`` is false, and every
    weight written to ``dst.data`` (:func:`save_external_data`). ``src`` may be ``dst``.

    Measured on SmolLM2-135M int4 (ONNX Runtime 1.32, one session, idle): the fp32 embedding
    inside the graph file was 113 MB of the ~230 MiB the session added to the process; the
    8-bit table is 28 MB + 3.5 MB of scales, and memory-mapped weights are resident only
    where touched (a gathered row, or a weight until MatMulNBits has prepacked its copy).
    Prepacking stays on: without it the 8-bit head ran 12x slower.
    """
    import onnx

    with quiet():
        try:
            model = onnx.load(str(src))
        except Exception as exc:  # library boundary
            raise ConversionError(f"cannot read {src}: {exc}") from exc
    details: dict[str, Any] = {}
    if embedding_8bit:
        details["token_embedding"] = quantize_embedding_8bit(model)
    else:
        details["token_embedding"] = {"method": "none"}
    details["external_data"] = save_external_data(model, dst)
    return details


def token_embedding_gather(graph: Any, indices: str = "input_ids") -> Any | None:
    """The Gather node that looks ``indices`` up in a 2-D float initializer (row axis 0),
    or None."""
    from onnx import TensorProto

    inits = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.input) != 2 or node.input[1] != indices:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        table = inits.get(node.input[0])
        if table is None or axis != 0:
            continue
        if table.data_type == TensorProto.FLOAT and len(table.dims) == 2:
            return node
    return None


def quantize_embedding_8bit(
    model: Any, *, block_size: int = 32, indices: str = "input_ids"
) -> dict[str, Any]:
    """Replace the token embedding's Gather in ``model`` (in place) by
    ``com.microsoft.GatherBlockQuantized`` with bits=8: per row, blocks of ``block_size``
    values as ``(q8 - 128) * scale`` (uint8 data, fp32 scales, zero points 128).

    A block that already lies on a GGUF grid (Q8_0, Q5_0, Q4_0: an fp16 step d times small
    integers) gets that step as its scale and is reproduced exactly: SmolLM2's table, a
    dequantized Q8_0 tensor, comes back bit for bit. Any other block is rounded to 255 levels
    of its largest magnitude (error at most that / 254). Returns the manifest's details.
    """
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    node = token_embedding_gather(graph, indices)
    if node is None:
        raise ConversionError(f"no Gather of {indices!r} in a 2-D float table to quantize")
    inits = {init.name: init for init in graph.initializer}
    table_name = node.input[0]
    table = numpy_helper.to_array(inits[table_name]).astype(np.float32, copy=False)
    rows, width = table.shape
    if width % block_size:
        raise ConversionError(
            f"embedding width {width} is not a multiple of the block size {block_size}"
        )
    blocks = width // block_size
    data = np.empty((rows, width), dtype=np.uint8)
    scales = np.empty((rows, blocks), dtype=np.float32)
    grid_blocks = dict.fromkeys((*_GRID_STEPS, "zero", "rounded"), 0)
    max_error = 0.0
    chunk = max(1, (1 << 22) // width)  # ~16 MB of fp32 rows at a time
    for start in range(0, rows, chunk):
        x = table[start : start + chunk].reshape(-1, blocks, block_size)
        q, scale, counts = _q8_blocks(x)
        data[start : start + chunk] = (q + EMBEDDING_ZERO_POINT).astype(np.uint8).reshape(-1, width)
        scales[start : start + chunk] = scale
        for key, count in counts.items():
            grid_blocks[key] += count
        error = np.abs(q * scale[..., None] - x)
        max_error = max(max_error, float(error.max()) if error.size else 0.0)
    base = table_name
    q_name, s_name, z_name = f"{base}_Q8", f"{base}_scales", f"{base}_zero_points"
    new_node = helper.make_node(
        "GatherBlockQuantized",
        [q_name, node.input[1], s_name, z_name],
        list(node.output),
        name=node.name,
        domain="com.microsoft",
        bits=8,
        block_size=block_size,
        gather_axis=0,
        quantize_axis=1,
    )
    position = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(position, new_node)
    still_used = any(table_name in n.input for n in graph.node)
    if not still_used:
        graph.initializer.remove(inits[table_name])
    graph.initializer.extend([
        numpy_helper.from_array(data, q_name),
        numpy_helper.from_array(scales, s_name),
        numpy_helper.from_array(
            np.full((rows, blocks), EMBEDDING_ZERO_POINT, dtype=np.uint8), z_name
        ),
    ])  # fmt: skip
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    exact = grid_blocks["rounded"] == 0
    log.info(
        "token embedding %s [%d x %d] -> GatherBlockQuantized 8-bit: %d of %d blocks on a "
        "GGUF grid, max abs error %.3g%s",
        table_name, rows, width, rows * blocks - grid_blocks["rounded"], rows * blocks,
        max_error, " (exact)" if exact else "",
    )  # fmt: skip
    return {
        "node": node.name,
        "method": "gather-block-quantized-8bit",
        "block_size": block_size,
        "zero_point": EMBEDDING_ZERO_POINT,
        "blocks": grid_blocks,
        "exact": exact,
        "max_abs_error": max_error,
        "fp32_table_kept": still_used,
    }


def _q8_blocks(x: Any) -> tuple[Any, Any, dict[str, int]]:
    """Signed 8-bit values and fp32 scales of ``x`` [n, blocks, block]: per block the first
    GGUF grid that reproduces it exactly, else round-to-nearest over its largest value."""
    import numpy as np

    amax = np.abs(x).max(axis=-1)
    q = np.zeros(x.shape, dtype=np.float32)
    scale = np.zeros(amax.shape, dtype=np.float32)
    done = amax == 0
    counts = {"zero": int(done.sum())}
    for key, step in _GRID_STEPS.items():
        d = (amax.astype(np.float64) / step).astype(np.float16).astype(np.float32)
        safe = np.where(d > 0, d, 1.0).astype(np.float32)
        candidate = np.rint(x / safe[..., None])
        fits = (
            (d > 0)
            & (np.abs(candidate).max(axis=-1) <= 127)
            & np.all(candidate * safe[..., None] == x, axis=-1)
            & ~done
        )
        q[fits], scale[fits] = candidate[fits], d[fits]
        counts[key] = int(fits.sum())
        done |= fits
    rest = ~done
    plain = (amax / 127.0).astype(np.float32)
    safe = np.where(plain > 0, plain, 1.0).astype(np.float32)
    rounded = np.clip(np.rint(x / safe[..., None]), -127, 127)
    q[rest], scale[rest] = rounded[rest], plain[rest]
    counts["rounded"] = int(rest.sum())
    return q, scale, counts


def save_external_data(model: Any, dst: Path, *, min_bytes: int = 1024) -> dict[str, Any]:
    """Write ``model`` as ``dst`` (the graph) and ``dst.data`` (every initializer of at least
    ``min_bytes``), deterministically: tensors in graph order, each starting on a 4 KiB page.
    ONNX Runtime maps each tensor on its own; a page shared by two mappings is one the
    kernel will not reclaim on request (``agent.engine.memory.release_mapped_weights``).
    ``dst.data``'s name is stored relative, so the two files move together."""
    from onnx.external_data_helper import set_external_data

    data_path = dst.with_name(dst.name + EXTERNAL_DATA_SUFFIX)
    dst.parent.mkdir(parents=True, exist_ok=True)
    offset = external = 0
    tmp = data_path.with_name(data_path.name + ".tmp")
    with open(tmp, "wb") as fh:
        for tensor in model.graph.initializer:
            if not tensor.HasField("raw_data") or len(tensor.raw_data) < min_bytes:
                continue
            raw = tensor.raw_data
            pad = -offset % PAGE
            fh.write(b"\0" * pad)
            offset += pad
            fh.write(raw)
            set_external_data(tensor, data_path.name, offset, len(raw))
            tensor.ClearField("raw_data")
            offset += len(raw)
            external += 1
    tmp.replace(data_path)
    try:
        dst.write_bytes(model.SerializeToString())
    except ValueError as exc:  # protobuf's 2 GB limit, with every large tensor outside
        raise ConversionError(f"cannot write {dst}: {exc}") from exc
    return {
        "file": data_path.name,
        "tensors": external,
        "bytes": offset,
        "min_tensor_bytes": min_bytes,
        "alignment": PAGE,
    }
