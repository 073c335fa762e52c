"""Make 4-bit re-quantization of GGUF Q4_1 weights exact.

SmolLM2's layer weights arrive as GGUF Q4_1: per block of 32 input features, ``w = d*q + m``
with ``q`` in 0..15 and a float minimum ``m``. MatMulNBits stores ``(q - zp) * scale`` with an
integer ``zp``, so ``m`` is generally not representable and plain round-to-nearest adds a
second rounding error on top of Q4_1's.

Rewrite each such MatMul ``Y = A @ W`` as ``Y = A @ W' + blocksum(A) @ R`` where
``W' = d * (q - zp)`` with ``zp = round(-m / d)`` and ``R = m + d * zp`` (one float per block
and output column). ``W'`` lies exactly on the asymmetric 4-bit grid that the MatMulNBits
quantizer then finds (scale ``d``, zero point ``zp``), and the small fp32 correction
``blocksum(A) @ R`` (``blocksum`` adds each run of 32 input features) restores ``m``.
Weights that are not on a Q4_1 grid are left alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OFFSET_SUFFIX", "absorb_block_offsets"]

log = logging.getLogger(__name__)

OFFSET_SUFFIX = "_q4_1_offsets"


def absorb_block_offsets(
    src: Path, dst: Path, *, block: int = 32, exclude: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Rewrite Q4_1-valued MatMul weights of ``src`` as described above; save to ``dst``.

    Returns counts and the names of the added correction MatMuls (exclude them from later
    quantization).
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    nodes: list[Any] = []
    blocksums: dict[tuple[str, int], str] = {}
    added_matmuls: list[str] = []
    new_inits: list[Any] = []
    rewritten = skipped = 0
    for node in graph.node:
        weight_name = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else ""
        init = inits.get(weight_name)
        if init is None or node.name in exclude:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(init).astype(np.float32)
        if w.ndim != 2 or w.shape[0] % block:
            nodes.append(node)
            continue
        k, n = w.shape
        nb = k // block
        wb = w.reshape(nb, block, n)
        lo = wb.min(axis=1)
        step = (wb.max(axis=1) - lo) / 15.0
        safe = np.where(step == 0, 1.0, step)
        q = np.rint((wb - lo[:, None, :]) / safe[:, None, :])
        recon = q * step[:, None, :] + lo[:, None, :]
        if float(np.abs(recon - wb).max()) > 1e-3 * float(step.max() or 1.0):
            skipped += 1
            nodes.append(node)
            continue
        zp = np.clip(np.rint(-lo / safe), 0, 15)
        offsets = (lo + step * zp).astype(np.float32)  # [nb, n]
        w_grid = (step[:, None, :] * (q - zp[:, None, :])).reshape(k, n).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(w_grid, init.name))

        a = node.input[0]
        key = (a, nb)
        if key not in blocksums:
            shape_name = f"{a}{OFFSET_SUFFIX}_shape{nb}"
            new_inits.append(
                numpy_helper.from_array(np.array([0, 0, nb, block], dtype=np.int64), shape_name)
            )
            axes_name = f"{a}{OFFSET_SUFFIX}_axes"
            if axes_name not in {i.name for i in new_inits}:
                new_inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), axes_name))
            reshaped = f"{a}{OFFSET_SUFFIX}_blocks{nb}"
            summed = f"{a}{OFFSET_SUFFIX}_blocksum{nb}"
            nodes.append(helper.make_node("Reshape", [a, shape_name], [reshaped], name=reshaped))
            nodes.append(
                helper.make_node(
                    "ReduceSum", [reshaped, axes_name], [summed], name=summed, keepdims=0
                )
            )
            blocksums[key] = summed
        out = node.output[0]
        main = f"{out}{OFFSET_SUFFIX}_main"
        corr = f"{out}{OFFSET_SUFFIX}_corr"
        offsets_name = f"{init.name}{OFFSET_SUFFIX}"
        new_inits.append(numpy_helper.from_array(offsets, offsets_name))
        node.output[0] = main
        nodes.append(node)
        mm_name = f"{node.name or out}{OFFSET_SUFFIX}_MatMul"
        nodes.append(
            helper.make_node("MatMul", [blocksums[key], offsets_name], [corr], name=mm_name)
        )
        nodes.append(helper.make_node("Add", [main, corr], [out], name=f"{mm_name}_Add"))
        added_matmuls.append(mm_name)
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    onnx.save(model, str(dst))
    log.info(
        "Q4_1 block offsets absorbed in %d MatMuls (%d not on a Q4_1 grid)", rewritten, skipped
    )
    return {"rewritten": rewritten, "skipped": skipped, "correction_matmuls": added_matmuls}
