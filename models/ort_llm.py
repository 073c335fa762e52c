"""A plain onnxruntime loop over a decoder graph (batch 1, KV cache).

Used by the accuracy gate and the benchmark: prefill with an empty past, then one token per
step feeding ``present.*`` back as ``past_key_values.*`` (each step's present is the past
plus the new tokens; the engine shares one buffer instead, see
:mod:`agent.engine.causal_lm`). The graph is :mod:`models.llama_graph`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from models.errors import ConversionError
from models.manifest import LlmSpec

__all__ = ["Generation", "OrtDecoder", "make_session"]

Past = dict[str, npt.NDArray[np.float32]]


def make_session(onnx_path: Path, threads: int) -> Any:
    """An onnxruntime CPU session with ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # library boundary
        raise ConversionError(f"onnxruntime cannot load {onnx_path}: {exc}") from exc


@dataclass
class Generation:
    """Result of one greedy generation."""

    tokens: list[int]  # new token ids, without the prompt
    prefill_s: float  # prompt forward pass + first token
    decode_s: float  # all later steps
    decode_steps: int = 0  # tokens produced by decode steps (len(tokens) - 1)
    stopped_at_eos: bool = field(default=False)


class OrtDecoder:
    """Runs an exported causal LM graph one sequence at a time."""

    def __init__(self, onnx_path: Path, spec: LlmSpec, threads: int) -> None:
        started = time.perf_counter()
        self.session = make_session(onnx_path, threads)
        self.load_s = time.perf_counter() - started
        self.spec = spec
        self.output_names = [o.name for o in self.session.get_outputs()]

    def empty_past(self) -> Past:
        shape = (1, self.spec.num_kv_heads, 0, self.spec.head_dim)
        past: Past = {}
        for layer in range(self.spec.num_layers):
            past[self.spec.past_key_template.format(layer=layer)] = np.zeros(shape, np.float32)
            past[self.spec.past_value_template.format(layer=layer)] = np.zeros(shape, np.float32)
        return past

    def forward(
        self, ids: list[int], past: Past, past_len: int, *, every_position: bool = True
    ) -> tuple[npt.NDArray[np.float32], Past]:
        """Logits for ``ids`` ([len(ids), vocab]; [1, vocab], the last, unless
        ``every_position``) and the grown cache."""
        n = len(ids)
        total = past_len + n
        feed: dict[str, Any] = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "seqlens_k": np.array([total - 1], dtype=np.int32),
            "total_sequence_length": np.array(total, dtype=np.int32),
            "logits_index": np.arange(n if every_position else 1, dtype=np.int64)[None, :]
            + (0 if every_position else n - 1),
            **past,
        }
        outputs = dict(zip(self.output_names, self.session.run(None, feed), strict=True))
        present: Past = {}
        for layer in range(self.spec.num_layers):
            for past_t, present_t in (
                (self.spec.past_key_template, self.spec.present_key_template),
                (self.spec.past_value_template, self.spec.present_value_template),
            ):
                present[past_t.format(layer=layer)] = outputs[present_t.format(layer=layer)]
        logits: npt.NDArray[np.float32] = outputs["logits"][0]
        return logits, present

    def greedy(
        self,
        prompt: list[int],
        max_new: int,
        eos_ids: tuple[int, ...] = (),
        stop_at_eos: bool = True,
    ) -> Generation:
        """Greedy decoding of up to ``max_new`` tokens."""
        t0 = time.perf_counter()
        logits, past = self.forward(prompt, self.empty_past(), 0, every_position=False)
        token = int(np.argmax(logits[-1]))
        tokens = [token]
        t1 = time.perf_counter()
        stopped = stop_at_eos and token in eos_ids
        while not stopped and len(tokens) < max_new:
            logits, past = self.forward([token], past, len(prompt) + len(tokens) - 1)
            token = int(np.argmax(logits[-1]))
            tokens.append(token)
            stopped = stop_at_eos and token in eos_ids
        t2 = time.perf_counter()
        return Generation(
            tokens=tokens,
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
            decode_steps=len(tokens) - 1,
            stopped_at_eos=stopped,
        )

    def negative_log_likelihood(
        self, ids: list[int], window: int | None = None
    ) -> tuple[float, int]:
        """Sum of -log p(token | prefix) over ids[1:] and its count (len(ids) - 1).

        One prefill pass when ``ids`` fit in ``window`` tokens (None: no limit), so the
        figure equals the build's; a longer text is cut into windows of ``window`` tokens,
        each starting at the previous one's last token, so every token of ids[1:] is
        scored once (its prefix restarting at its window's start).
        """
        if window is not None and window < 2:
            raise ValueError(f"a perplexity window needs at least 2 tokens, not {window}")
        size = len(ids) if window is None else window
        total, count = 0.0, 0
        for start in range(0, max(1, len(ids) - 1), size - 1):
            chunk = ids[start : start + size]
            if len(chunk) < 2:
                break
            logits, _ = self.forward(chunk, self.empty_past(), 0)
            targets = np.asarray(chunk[1:], dtype=np.int64)
            total += _nll_sum(logits[:-1], targets)
            count += len(targets)
        return total, count


#: Rows of logits turned into float64 at a time: the whole (tokens x vocabulary) block
#: at once was 970 MB for Qwen2.5's 152k-token vocabulary over the gate's 800 tokens,
#: beside the agent's serving models, and most of the self-check's 100 s on 2 cores.
NLL_ROWS = 32


def _nll_sum(logits: np.ndarray, targets: np.ndarray) -> float:
    """Sum over rows of -log softmax(logits[i])[targets[i]], in float64, a few rows at a
    time (the same figure as the whole block at once)."""
    total = 0.0
    for first in range(0, len(targets), NLL_ROWS):
        rows = logits[first : first + NLL_ROWS].astype(np.float64)
        peak = rows.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(rows - peak).sum(axis=-1)) + peak[:, 0]
        picked = rows[np.arange(len(rows)), targets[first : first + NLL_ROWS]]
        total += float((log_norm - picked).sum())
    return total
