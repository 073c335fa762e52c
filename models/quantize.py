"""Quantize exported ONNX graphs with onnxruntime.quantization.

- :func:`quantize_int8_dynamic`: dynamic int8 weights (activations quantized at run time),
  per tensor or per channel, optionally limited to some operator types.
- :func:`quantize_nbits`: 4-bit block-wise weights (MatMulNBits), and 4-bit Gather for the
  token embedding when asked.

Both read ``src`` and write a single-file graph ``dst`` (external data when over 2 GB).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from models._quiet import quiet
from models.errors import ConversionError

__all__ = ["output_matmul", "quantize_int4_llm", "quantize_int8_dynamic", "quantize_nbits"]

log = logging.getLogger(__name__)


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
    return details
