"""8-bit weights on CPUs without fast 8-bit dot products.

The embedding model ships with its matrix products as ONNX Runtime's ``MatMulNBits`` with
8-bit weights and int8 activations (``accuracy_level`` 4). Where the CPU has 8-bit dot
product instructions (VNNI: AVX512-VNNI, AVX-VNNI, AMX) that is fast: 15 ms for a 128-token
window of all-MiniLM-L6-v2 on an AVX-512 EPYC. Where it has AVX2 alone (AMD Zen 2 and 3,
Intel before Ice Lake and Alder Lake, most edge boxes) ONNX Runtime has no fast kernel for
8-bit weights: the same window took 208 ms, 2.3x the 91 ms of the same products in fp32.
So on such a CPU the agent runs those products in fp32 on the weights dequantized at load:
embeddings agree with the 8-bit graph's to a cosine of 0.999 or more (the heads' verdicts
on 400 labelled texts: 1 of 400 changed), for 4 bytes per weight instead of 1 (the loaded
MiniLM: 104 MiB resident instead of 80). Measured side by side by
``python -m benchmarks.embedding_kernels``: 2.3x faster for a 128-token window, 1.9x for
16 tokens, on a 2-core AVX2 EPYC.

On other machines (ARM, or x86 with VNNI) the graph runs as shipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "FAST_INT8_FLAGS",
    "cpu_flags",
    "eight_bit_as_fp32",
    "graph_for_this_cpu",
    "slow_8bit_products",
]

#: /proc/cpuinfo flags of x86 instructions that make 8-bit products fast
FAST_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The first processor's flags in ``/proc/cpuinfo`` (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def slow_8bit_products(flags: frozenset[str] | None = None, machine: str | None = None) -> bool:
    """Whether this CPU is x86 without 8-bit dot product instructions (where ONNX Runtime's
    8-bit ``MatMulNBits`` is slower than fp32)."""
    machine = (machine or platform.machine()).lower()
    if machine not in {"x86_64", "amd64", "i686", "i386"}:
        return False
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags and not flags & FAST_INT8_FLAGS


def eight_bit_as_fp32(model_path: Path) -> bytes | None:
    """The graph at ``model_path`` with every 8-bit ``MatMulNBits`` replaced by a ``MatMul``
    on its weights dequantized to fp32 (and an ``Add`` of its bias), serialized; None when
    it has no 8-bit ``MatMulNBits``. Other nodes and initializers are kept as they are."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    added: list[onnx.TensorProto] = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs.get("bits") != 8:
            nodes.append(node)
            continue
        inputs = list(node.input) + [""] * (6 - len(node.input))
        if inputs[4] or not all(name in initializers for name in inputs[1:4] if name):
            nodes.append(node)  # g_idx or computed weights: left as they are
            continue
        k, n, block = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
        packed = numpy_helper.to_array(initializers[inputs[1]])  # [N, blocks, block] uint8
        blocks = packed.shape[1]
        scales = numpy_helper.to_array(initializers[inputs[2]]).astype(np.float32)
        zero: np.ndarray | float = 128.0  # 8-bit without zero points: 2 ** (bits - 1)
        if inputs[3]:
            zero = numpy_helper.to_array(initializers[inputs[3]]).astype(np.float32)
            zero = zero.reshape(n, -1)[:, :blocks, None]
        weights = (packed.reshape(n, blocks, block).astype(np.float32) - zero) * scales.reshape(
            n, blocks, 1
        )
        dense = np.ascontiguousarray(weights.reshape(n, blocks * block)[:, :k].T)  # [K, N]
        name = f"{inputs[1]}/fp32"
        added.append(numpy_helper.from_array(dense, name))
        replaced.update(x for x in inputs[1:4] if x)
        if inputs[5]:
            product = f"{node.output[0]}/product"
            nodes.append(helper.make_node("MatMul", [inputs[0], name], [product], name=node.name))
            nodes.append(
                helper.make_node(
                    "Add", [product, inputs[5]], [node.output[0]], name=f"{node.name}/bias"
                )
            )
        else:
            nodes.append(
                helper.make_node("MatMul", [inputs[0], name], [node.output[0]], name=node.name)
            )
    if not replaced:
        return None
    still_used = {name for node in nodes for name in node.input}
    kept = [
        init for init in graph.initializer if init.name not in replaced or init.name in still_used
    ]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend([*kept, *added])
    return bytes(model.SerializeToString())


@contextlib.contextmanager
def graph_for_this_cpu(model_path: Path) -> Iterator[Path]:
    """The path to give ``onnxruntime.InferenceSession`` for an embedding graph, while the
    context lasts: ``model_path``, or on a CPU without 8-bit dot products
    (:func:`slow_8bit_products`) and for a graph with 8-bit ``MatMulNBits``, a file of the
    graph with those in fp32 (:func:`eight_bit_as_fp32`, which needs the ``onnx`` package:
    without it, the graph as shipped): an anonymous memory file where
    Linux has them (an agent image's file system is read-only), else a temporary file. A
    file rather than the graph's bytes: a session made from bytes keeps them (the Python
    wrapper holds a reference), 80 MiB more for MiniLM. Where neither can be written, the
    graph as shipped (a warning says why)."""
    if not slow_8bit_products():
        yield model_path
        return
    try:
        rewritten = eight_bit_as_fp32(model_path)
    except ImportError as exc:  # the onnx package: in the convert extra, not in agent images
        log.info(
            "%s: its 8-bit products run as shipped (%s; they would run about 2x faster in "
            "fp32 on this CPU with the onnx package installed)",
            model_path,
            exc,
        )
        rewritten = None
    if rewritten is None:
        yield model_path
        return
    with contextlib.ExitStack() as stack:
        try:
            path = _scratch_file(stack, model_path.name, rewritten)
        except OSError as exc:
            log.warning("%s: could not write its fp32 graph (%s); its 8-bit products run as "
                        "shipped", model_path, exc)  # fmt: skip
            path = model_path
        else:
            log.info(
                "%s: this CPU has no 8-bit dot product instructions (VNNI); its 8-bit "
                "matrix products run in fp32 on weights dequantized at load (about 2x faster "
                "here, 4 bytes per weight instead of 1)",
                model_path,
            )
        del rewritten
        yield path


def _scratch_file(stack: contextlib.ExitStack, name: str, data: bytes) -> Path:
    """``data`` in a file that lives as long as ``stack``: an anonymous memory file
    (``memfd_create``, read through ``/proc/self/fd``) or a temporary one."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and Path("/proc/self/fd").is_dir():
        fd = memfd_create(f"edgefleet-fp32-{name}")
        stack.callback(os.close, fd)
        with os.fdopen(os.dup(fd), "wb") as out:
            out.write(data)
        return Path(f"/proc/self/fd/{fd}")
    scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="edgefleet-fp32-"))
    path = Path(scratch) / name
    path.write_bytes(data)
    return path
