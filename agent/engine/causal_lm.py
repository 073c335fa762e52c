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

from agent.engine.memory import kv_bytes_per_token
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
        self,
        num_tensors: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: type,
        max_rows: int,
        max_bytes: int | None = None,
    ) -> None:
        self._num_tensors = num_tensors
        self._heads = num_kv_heads
        self._dim = head_dim
        self._dtype = dtype
        self.max_rows = max_rows
        # bytes of one slot-token (every tensor) and of one tensor's slot-token
        self._tensor_token_bytes = num_kv_heads * head_dim * np.dtype(dtype).itemsize
        self.bytes_per_token = num_tensors * self._tensor_token_bytes
        # the buffers, transient copies while they grow included, stay within this when
        # admission keeps rows x tokens within :meth:`admissible_tokens` (None: no bound)
        self.max_bytes = max_bytes
        self.buffers: list[npt.NDArray[np.float32]] = []
        self.lengths = np.zeros(max_rows, dtype=np.int64)
        # ONNX Runtime bindings over these buffers, by row range (made by CausalLM); they
        # go with the buffers they point into
        self.bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self.logits_widths: dict[tuple[int, int], int] = {}  # positions each binding returns
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

    @property
    def allocated_bytes(self) -> int:
        return self.allocated_tokens * self.bytes_per_token

    def admissible_tokens(self) -> int | None:
        """Slot-tokens (rows x tokens) admission may promise so that growing the buffers,
        the transient copy included, never takes more than ``max_bytes``.

        The buffers grow one tensor at a time (the old tensor is freed before the next one
        is allocated), so the peak is the larger of the old and new buffers plus one tensor
        of the other: with both within ``A = max_bytes x T / (T + 1)`` (T tensors), the peak
        is within ``A + A / T = max_bytes``.
        """
        if self.max_bytes is None:
            return None
        t = self._num_tensors
        return self.max_bytes * t // (t + 1) // self.bytes_per_token

    def bytes_for_tokens(self, tokens: int) -> int:
        """The ``max_bytes`` whose :meth:`admissible_tokens` is ``tokens``."""
        t = self._num_tensors
        return -(-tokens * self.bytes_per_token * (t + 1) // t)

    def ensure(self, rows: int, tokens: int) -> None:
        """Make room for slots ``[0, rows)`` holding ``tokens`` tokens each.

        Growth is geometric (rows and capacity double) while the doubled buffers stay within
        :meth:`admissible_tokens`; past it, the buffers take exactly what is asked (the rows
        in use and the longest slot), which admission keeps within it.
        """
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows asked of a cache of {self.max_rows}")
        if rows <= self.rows and tokens <= self.capacity:
            return
        keep = int(self.lengths[: self.rows].max()) if self.rows else 0
        used = int(np.flatnonzero(self.lengths[: self.rows])[-1]) + 1 if keep else 0
        new_rows = min(self.max_rows, max(rows, 2 * self.rows)) if rows > self.rows else self.rows
        new_cap = self.capacity
        if tokens > self.capacity:
            new_cap = -(-max(tokens, 2 * self.capacity, self.MIN_CAPACITY) // 64) * 64
            if self.token_limit is not None:
                new_cap = max(tokens, min(new_cap, self.token_limit))
        limit = self.admissible_tokens()
        if limit is not None and new_rows * new_cap > limit:
            # exactly what the slots in use and this run need
            new_rows, new_cap = max(rows, used), max(tokens, keep)
        self._grow(new_rows, new_cap, min(keep, new_cap))

    def _grow(self, new_rows: int, new_cap: int, keep: int) -> None:
        shape = (new_rows, self._heads, new_cap, self._dim)
        rows = min(new_rows, self.rows)
        self.bindings.clear()  # they hold the old buffers
        if not self.buffers:
            self.buffers = [np.empty(shape, dtype=self._dtype) for _ in range(self._num_tensors)]
            return
        for i in range(self._num_tensors):  # one at a time: one old tensor beside the new
            buffer: npt.NDArray[np.float32] = np.empty(shape, dtype=self._dtype)
            if keep:
                buffer[:rows, :, :keep] = self.buffers[i][:rows, :, :keep]
            self.buffers[i] = buffer

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

    @property
    def kv_bytes_per_token(self) -> int:
        """Key/value cache bytes of one token: layers x kv_heads x head_dim x 2 x dtype."""
        s = self._spec
        return kv_bytes_per_token(s.num_layers, s.num_kv_heads, s.head_dim,
                                  np.dtype(self._kv_dtype).itemsize)  # fmt: skip

    def new_cache(self, max_rows: int, max_bytes: int | None = None) -> SlotCache:
        s = self._spec
        return SlotCache(len(self._past_names), s.num_kv_heads, s.head_dim, self._kv_dtype,
                         max_rows, max_bytes)  # fmt: skip

    def warm_up(self) -> None:
        """One token through the session on the calling thread: its first run pages in and
        sets up what loading did not."""
        cache = self.new_cache(1)
        token = np.zeros((1, 1), np.int64)
        self.run(cache, 0, token, np.ones(1, np.int64), token)
        cache.clear()

    def close(self) -> None:
        """Drop the session (its weights and buffers); the object is unusable afterwards."""
        self._session = None

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
        binding = self._binding(cache, first, rows, int(logits_index.shape[1]))
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

    def _binding(self, cache: SlotCache, first: int, rows: int, width: int) -> ort.IOBinding:
        """A binding with the cache views and the logits output in place, kept by the cache:
        a decode step then only binds its four small inputs (~0.5 ms less per step).

        ONNX Runtime allocates the logits output on the first run and reuses it, so a run
        asking logits at another number of positions (a speculative decode step) binds the
        output afresh."""
        binding = cache.bindings.get((first, rows))
        if binding is not None and cache.logits_widths.get((first, rows)) != width:
            binding.bind_output("logits", "cpu")
            cache.logits_widths[(first, rows)] = width
        if binding is None:
            cache.logits_widths[(first, rows)] = width
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
