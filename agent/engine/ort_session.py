"""Creating ONNX Runtime sessions: CUDA when present, CPU otherwise, thread counts set."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from agent.engine import step_cores
from agent.engine.int8_kernels import graph_for_this_cpu
from agent.engine.memory import release_mapped_weights, trim_heap
from agent.errors import ModelLoadError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionConfig:
    intra_op_threads: int = 0  # 0: one per core (ONNX Runtime's default)
    inter_op_threads: int = 1
    execution_provider: str = "auto"  # auto | cpu | cuda


def choose_providers(preference: str) -> list[str]:
    available = ort.get_available_providers()
    if preference == "cpu":
        return ["CPUExecutionProvider"]
    if preference == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise ModelLoadError(
                "execution_provider=cuda but this onnxruntime build has no CUDA provider "
                f"(available: {', '.join(available)}); install edgefleet[gpu]"
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if preference != "auto":
        raise ModelLoadError(f"unknown execution_provider {preference!r} (auto, cpu or cuda)")
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


_shared_pool = False  # every session of this process runs on ONNX Runtime's global pool


def use_shared_thread_pool(intra_op_threads: int, inter_op_threads: int) -> bool:
    """Make every ONNX Runtime session this process creates from now on share one thread
    pool of these sizes (0: ONNX Runtime's default). Call it before the first session: the
    pool belongs to ONNX Runtime's environment, made with the first session. Returns
    whether the sessions will share it.

    Why: each session otherwise has its own pool whose threads spin for a while after each
    run. Two models stepping in turn on the same cores then run one model's step against
    the other's spinning threads: measured on two cores, two busy models together made 58%
    of what each made alone (shares summed); one pool makes it about 100%, and turning the
    spinning off instead cost a single model 16-19% of its throughput.
    """
    global _shared_pool
    if _shared_pool:
        return True
    before = step_cores.thread_ids()
    try:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(intra_op_threads, inter_op_threads)
    except (ImportError, AttributeError, RuntimeError) as exc:  # an older or other build
        log.warning("ONNX Runtime's shared thread pool is unavailable (%s): each model's "
                    "session keeps its own threads", exc)  # fmt: skip
        return False
    _shared_pool = True
    # the pool's workers start with the environment: kept apart from the step thread
    # while a model loads beside serving ones (see step_cores)
    step_cores.note_pool_threads(step_cores.thread_ids() - before)
    return True


def create_session(
    model_path: Path,
    config: SessionConfig,
    *,
    fp32_where_int8_is_slow: bool = False,
    trim: bool = True,
) -> ort.InferenceSession:
    """A session of the graph at ``model_path``. ``fp32_where_int8_is_slow`` (embedding
    models): on a CPU without 8-bit dot products, 8-bit matrix products run in fp32
    (:mod:`agent.engine.int8_kernels`). ``trim=False`` leaves trimming the C heap to the
    caller (the residency trims once the model serves: up to 30 ms off a swap)."""
    options = ort.SessionOptions()
    if _shared_pool:  # the process's one pool (its sizes were given when it was made)
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = config.intra_op_threads
        options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Tensor shapes change every step (the cache grows, batches change); an arena keeps the
    # high-water mark of every shape seen, plain allocation returns memory.
    options.enable_cpu_mem_arena = False
    providers = choose_providers(config.execution_provider)
    try:
        with (
            graph_for_this_cpu(model_path)
            if fp32_where_int8_is_slow
            else contextlib.nullcontext(model_path)
        ) as path:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own RuntimeError subclasses
        raise ModelLoadError(f"onnxruntime cannot load {model_path}: {exc}") from exc
    # what loading read once and no longer needs: mapped weights' pages (left in the page
    # cache, which the kernel reclaims when it needs to: a reload of this model reads
    # nothing from disk) and the heap's transient blocks
    release_mapped_weights(model_path)
    if trim:
        trim_heap("session loaded")
    log.info("loaded %s on %s", model_path, ", ".join(session.get_providers()))
    return session
