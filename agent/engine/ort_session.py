"""Creating ONNX Runtime sessions: CUDA when present, CPU otherwise, thread counts set."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

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


def create_session(model_path: Path, config: SessionConfig) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Tensor shapes change every step (the cache grows, batches change); an arena keeps the
    # high-water mark of every shape seen, plain allocation returns memory.
    options.enable_cpu_mem_arena = False
    providers = choose_providers(config.execution_provider)
    try:
        session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own RuntimeError subclasses
        raise ModelLoadError(f"onnxruntime cannot load {model_path}: {exc}") from exc
    # what loading read once and no longer needs: mapped weights' pages and the heap's
    # transient blocks
    release_mapped_weights(model_path)
    trim_heap("session loaded")
    log.info("loaded %s on %s", model_path, ", ".join(session.get_providers()))
    return session
