"""One decoder-only ONNX graph with a key/value cache, run a step at a time.

The graph takes ``input_ids``, ``attention_mask``, (``position_ids``) and the past keys and
values of every layer, and returns logits and the present keys and values. Prefill runs the
whole prompt once against an empty past; each decode step then feeds one token and the
previous step's present tensors, so the prompt is never recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.errors import ModelLoadError

_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class CausalLMSpec:
    num_layers: int  # decoder layers, one past key and value each
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # size of one head
    vocab_size: int  # logits per position
    uses_position_ids: bool = True  # the graph takes position_ids
    past_key: str = "past_key_values.{layer}.key"  # input name templates
    past_value: str = "past_key_values.{layer}.value"
    present_key: str = "present.{layer}.key"  # output name templates
    present_value: str = "present.{layer}.value"


class KVCache:
    """The past keys and values of one sequence, as ONNX Runtime values."""

    __slots__ = ("length", "values")

    def __init__(self, values: dict[str, ort.OrtValue], length: int) -> None:
        self.values = values  # input name -> tensor [1, kv_heads, length, head_dim]
        self.length = length  # tokens held


class CausalLM:
    def __init__(self, session: ort.InferenceSession, spec: CausalLMSpec) -> None:
        self._session = session
        self._spec = spec
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        self._past_names = [
            name
            for layer in range(spec.num_layers)
            for name in (spec.past_key.format(layer=layer), spec.past_value.format(layer=layer))
        ]
        self._present_names = [
            name
            for layer in range(spec.num_layers)
            for name in (
                spec.present_key.format(layer=layer),
                spec.present_value.format(layer=layer),
            )
        ]
        expected_inputs = ["input_ids", "attention_mask", *self._past_names]
        if spec.uses_position_ids:
            expected_inputs.append("position_ids")
        missing = [n for n in expected_inputs if n not in inputs]
        missing += [n for n in ["logits", *self._present_names] if n not in outputs]
        if missing:
            raise ModelLoadError(f"graph lacks inputs/outputs the manifest names: {missing}")
        kv_type = inputs[self._past_names[0]].type
        if kv_type not in _ORT_TO_NUMPY:
            raise ModelLoadError(f"unsupported key/value type {kv_type}")
        self._kv_dtype = _ORT_TO_NUMPY[kv_type]
        self._output_names = ["logits", *self._present_names]

    @property
    def spec(self) -> CausalLMSpec:
        return self._spec

    def empty_cache(self) -> KVCache:
        s = self._spec
        empty = np.zeros((1, s.num_kv_heads, 0, s.head_dim), dtype=self._kv_dtype)
        value = ort.OrtValue.ortvalue_from_numpy(empty)
        return KVCache({name: value for name in self._past_names}, 0)

    def forward(
        self, token_ids: npt.NDArray[np.int64], cache: KVCache, *, all_logits: bool = False
    ) -> tuple[npt.NDArray[np.float32], KVCache]:
        """Run ``token_ids`` (1-D) after ``cache``; return logits and the extended cache.

        Logits are those of the last position, or of every position with ``all_logits``.
        """
        n = int(token_ids.shape[0])
        total = cache.length + n
        feed: dict[str, ort.OrtValue] = dict(cache.values)
        feed["input_ids"] = ort.OrtValue.ortvalue_from_numpy(
            token_ids.reshape(1, n).astype(np.int64, copy=False)
        )
        feed["attention_mask"] = ort.OrtValue.ortvalue_from_numpy(
            np.ones((1, total), dtype=np.int64)
        )
        if self._spec.uses_position_ids:
            positions = np.arange(cache.length, total, dtype=np.int64).reshape(1, n)
            feed["position_ids"] = ort.OrtValue.ortvalue_from_numpy(positions)
        results = self._session.run_with_ort_values(self._output_names, feed)
        logits = results[0].numpy()[0]
        presents = dict(zip(self._past_names, results[1:], strict=True))
        out = logits if all_logits else logits[-1]
        return out.astype(np.float32, copy=False), KVCache(presents, total)

    @property
    def kv_dtype(self) -> type:
        return self._kv_dtype

    @property
    def num_kv_tensors(self) -> int:
        return len(self._past_names)

    def run_batch(
        self,
        input_ids: npt.NDArray[np.int64],
        attention_mask: npt.NDArray[np.int64],
        past: list[npt.NDArray[np.float32]],
    ) -> tuple[npt.NDArray[np.float32], list[npt.NDArray[np.float32]]]:
        """One step for a batch whose rows may hold different numbers of tokens.

        ``input_ids`` is [rows, n]; ``attention_mask`` [rows, past width + n] marks real
        tokens (padding 0); positions follow from the mask. Returns the logits of each row's
        last position [rows, vocab] and the present tensors (in past order).
        """
        n = int(input_ids.shape[1])
        feed: dict[str, npt.NDArray[np.int64] | npt.NDArray[np.float32]] = dict(
            zip(self._past_names, past, strict=True)
        )
        feed["input_ids"] = input_ids
        feed["attention_mask"] = attention_mask
        if self._spec.uses_position_ids:
            held = attention_mask[:, :-n].sum(axis=1, keepdims=True)
            feed["position_ids"] = held + np.arange(n, dtype=np.int64)[None, :]
        outputs = self._session.run(self._output_names, feed)
        logits = np.asarray(outputs[0])[:, -1, :].astype(np.float32, copy=False)
        return logits, [np.asarray(t) for t in outputs[1:]]
