"""One decoder-only ONNX graph with fused attention, run over a slot cache.

The graph (written by ``models.llama_graph``) takes ``input_ids`` [rows, n],
``seqlens_k`` [rows] (each row's tokens after this run, minus one),
``total_sequence_length`` (the longest row's), ``logits_index`` [rows, k] and, per layer,
the past keys and values [rows, kv_heads, capacity, head_dim]. Its GroupQueryAttention
kernels write the new keys and values into that same buffer when past and present are
bound to the same memory, so a step copies no cache at all: the key/value cache is a
:class:`SlotCache`, one preallocated buffer per layer and kind, one row (slot) per sequence,
each sequence's tokens at the start of its row.

Why this layout (measured on the 2-core CPU, SmolLM2-135M int4, 16 rows, ~200 tokens each):
the exported graph with a concatenated past took ~80 ms per decode step, 37 ms of it
attention plumbing (Concat of the past, expanding 3 key/value heads to 9) plus the
rearranging of a right-aligned batch cache; fused attention over a shared buffer takes
~35 ms. The cost is padding: a row's capacity is the longest sequence's, so memory is
``rows x capacity`` (admission keeps that within the configured budget).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.errors import ModelLoadError
from models.llama_graph import GRAPH_INPUTS
from models.manifest import LlmSpec

_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class SlotCache:
    """Keys and values of up to ``max_rows`` sequences: row ``i`` is slot ``i``.

    Buffers grow (rows and capacity, geometrically) when a run needs more and are freed
    by :meth:`clear`. A slot's tokens are ``[:, :, :lengths[i]]`` of its row; the rest of
    the row is scratch the kernel may write.
    """

    MIN_CAPACITY = 128

    def __init__(
        self, num_tensors: int, num_kv_heads: int, head_dim: int, dtype: type, max_rows: int
    ) -> None:
        self._num_tensors = num_tensors
        self._heads = num_kv_heads
        self._dim = head_dim
        self._dtype = dtype
        self.max_rows = max_rows
        self.buffers: list[npt.NDArray[np.float32]] = []
        self.lengths = np.zeros(max_rows, dtype=np.int64)
        # ONNX Runtime bindings over these buffers, by row range (made by CausalLM); they
        # go with the buffers they point into
        self.bindings: dict[tuple[int, int], ort.IOBinding] = {}
        # no slot will ever hold more tokens than this (the scheduler sets it from what the
        # admitted sequences may reach): growth stops there instead of doubling past it
        self.token_limit: int | None = None

    @property
    def rows(self) -> int:
        return int(self.buffers[0].shape[0]) if self.buffers else 0

    @property
    def capacity(self) -> int:
        return int(self.buffers[0].shape[2]) if self.buffers else 0

    @property
    def allocated_tokens(self) -> int:
        return self.rows * self.capacity

    def ensure(self, rows: int, tokens: int) -> None:
        """Make room for slots ``[0, rows)`` holding ``tokens`` tokens each."""
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows asked of a cache of {self.max_rows}")
        if rows <= self.rows and tokens <= self.capacity:
            return
        new_rows = min(self.max_rows, max(rows, 2 * self.rows)) if rows > self.rows else self.rows
        new_cap = self.capacity
        if tokens > self.capacity:
            new_cap = -(-max(tokens, 2 * self.capacity, self.MIN_CAPACITY) // 64) * 64
            if self.token_limit is not None:
                new_cap = max(tokens, min(new_cap, self.token_limit))
        keep = int(self.lengths[: self.rows].max()) if self.rows else 0
        shape = (new_rows, self._heads, new_cap, self._dim)
        grown: list[npt.NDArray[np.float32]] = []
        for i in range(self._num_tensors):
            buffer: npt.NDArray[np.float32] = np.empty(shape, dtype=self._dtype)
            if self.buffers and keep:
                old = self.buffers[i]
                buffer[: old.shape[0], :, :keep] = old[:, :, :keep]
            grown.append(buffer)
        self.buffers = grown
        self.bindings.clear()

    def clear(self) -> None:
        """Free the buffers (no sequence holds a slot)."""
        self.buffers = []
        self.lengths[:] = 0
        self.bindings.clear()

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s tokens into slot ``dst``."""
        n = int(self.lengths[src])
        for b in self.buffers:
            b[dst, :, :n] = b[src, :, :n]
        self.lengths[dst] = n
        self.lengths[src] = 0

    def write(self, slot: int, stacked: npt.NDArray[np.float32]) -> None:
        """Make ``slot`` hold these tokens: ``stacked`` is [tensors, heads, tokens, dim]."""
        n = int(stacked.shape[2])
        self.ensure(slot + 1, n)
        for b, a in zip(self.buffers, stacked, strict=True):
            b[slot, :, :n] = a
        self.lengths[slot] = n

    def read(self, slot: int, start: int, end: int) -> npt.NDArray[np.float32]:
        """A copy of tokens ``[start, end)`` of ``slot``: [tensors, heads, tokens, dim]."""
        return np.stack([b[slot, :, start:end] for b in self.buffers])


class CausalLM:
    def __init__(self, session: ort.InferenceSession, spec: LlmSpec) -> None:
        self._session = session
        self._spec = spec
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        self._past_names = [
            name
            for layer in range(spec.num_layers)
            for name in (
                spec.past_key_template.format(layer=layer),
                spec.past_value_template.format(layer=layer),
            )
        ]
        self._present_names = [
            name
            for layer in range(spec.num_layers)
            for name in (
                spec.present_key_template.format(layer=layer),
                spec.present_value_template.format(layer=layer),
            )
        ]
        missing = [n for n in [*GRAPH_INPUTS, *self._past_names] if n not in inputs]
        missing += [n for n in ["logits", *self._present_names] if n not in outputs]
        if missing:
            raise ModelLoadError(
                f"graph lacks inputs/outputs of the fused-attention interface: {missing[:6]} "
                "(rebuild the model with `python -m models build`)"
            )
        kv_type = inputs[self._past_names[0]].type
        if kv_type not in _ORT_TO_NUMPY:
            raise ModelLoadError(f"unsupported key/value type {kv_type}")
        self._kv_dtype = _ORT_TO_NUMPY[kv_type]

    @property
    def spec(self) -> LlmSpec:
        return self._spec

    def new_cache(self, max_rows: int) -> SlotCache:
        s = self._spec
        return SlotCache(len(self._past_names), s.num_kv_heads, s.head_dim, self._kv_dtype,
                         max_rows)  # fmt: skip

    def run(
        self,
        cache: SlotCache,
        first: int,
        input_ids: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        logits_index: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.float32]:
        """One step for slots ``[first, first + rows)``.

        ``input_ids`` [rows, n] are the new tokens of each slot, right-padded; ``lengths``
        [rows] each slot's tokens once they are in (a row that adds n tokens to a slot
        holding p has length p + n, or fewer real tokens for a padded row of a first
        prompt); ``logits_index`` [rows, k] the positions in ``input_ids`` to return logits
        for. Every row adds the same n tokens except in a first prompt (all slots empty).
        Returns logits [rows, k, vocab]; the cache holds the new tokens afterwards.
        """
        rows = int(input_ids.shape[0])
        cache.ensure(first + rows, int(lengths.max()))
        binding = self._binding(cache, first, rows)
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
        binding.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
        # the longest row's total; for a first prompt that is n, which is how the kernel
        # tells a prompt (every slot empty) from tokens added to a cache
        total = np.array(int(lengths.max()), dtype=np.int32)
        binding.bind_cpu_input("total_sequence_length", total)
        binding.bind_cpu_input("logits_index", np.ascontiguousarray(logits_index, dtype=np.int64))
        self._session.run_with_iobinding(binding)
        # a copy: the bound output's memory is reused by the binding's next run
        logits: npt.NDArray[np.float32] = np.array(binding.get_outputs()[0].numpy())
        cache.lengths[first : first + rows] = lengths
        return logits

    def _binding(self, cache: SlotCache, first: int, rows: int) -> ort.IOBinding:
        """A binding with the cache views and the logits output in place, kept by the cache:
        a decode step then only binds its four small inputs (~0.5 ms less per step)."""
        binding = cache.bindings.get((first, rows))
        if binding is None:
            binding = self._session.io_binding()
            binding.bind_output("logits", "cpu")  # first: get_outputs() keeps binding order
            for past, present, buffer in zip(
                self._past_names, self._present_names, cache.buffers, strict=True
            ):
                # a view of rows [first, first + rows): no copy, the kernel writes in place
                value = ort.OrtValue.ortvalue_from_numpy(buffer[first : first + rows])
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            cache.bindings[(first, rows)] = binding
        return binding
