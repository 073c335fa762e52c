"""One decoder-only ONNX graph with a key/value cache, run a step at a time.

The graph takes ``input_ids``, ``attention_mask``, (``position_ids``) and the past keys and
values of every layer, and returns logits and the present keys and values. Prefill runs the
prompt against an empty past; each decode step then feeds one token per row and the
previous step's present tensors, so the prompt is never recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

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


# A past key or value tensor: ONNX Runtime's own value (fresh from the last step, no copy)
# or a numpy array (after the batch was rearranged).
KV: TypeAlias = "ort.OrtValue | npt.NDArray[np.float32]"


def kv_to_numpy(value: KV) -> npt.NDArray[np.float32]:
    if isinstance(value, ort.OrtValue):
        array: npt.NDArray[np.float32] = value.numpy()
        return array
    return value


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

    def empty_past(self, rows: int = 1) -> list[KV]:
        s = self._spec
        empty = np.zeros((rows, s.num_kv_heads, 0, s.head_dim), dtype=self._kv_dtype)
        return [empty for _ in self._past_names]

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
        past: Sequence[KV],
        *,
        all_logits: bool = False,
    ) -> tuple[npt.NDArray[np.float32], list[ort.OrtValue]]:
        """One step for a batch whose rows may hold different numbers of tokens.

        ``input_ids`` is [rows, n]; ``attention_mask`` [rows, past width + n] marks real
        tokens (padding 0); positions follow from the mask. Returns the logits of each row's
        last position [rows, vocab] (of every position [rows, n, vocab] with
        ``all_logits``) and the present tensors, in past order, as ONNX Runtime values that
        the next step takes without a copy.
        """
        n = int(input_ids.shape[1])
        feed: dict[str, ort.OrtValue] = {
            name: value if isinstance(value, ort.OrtValue) else _ortvalue(value)
            for name, value in zip(self._past_names, past, strict=True)
        }
        feed["input_ids"] = _ortvalue(input_ids)
        feed["attention_mask"] = _ortvalue(attention_mask)
        if self._spec.uses_position_ids:
            # a token's position counts the real tokens before it (padding has none)
            positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)[:, -n:]
            feed["position_ids"] = _ortvalue(positions)
        outputs = self._session.run_with_ort_values(self._output_names, feed)
        logits = outputs[0].numpy()
        chosen = logits if all_logits else logits[:, -1, :]
        return chosen.astype(np.float32, copy=False), list(outputs[1:])


def _ortvalue(array: npt.NDArray[Any]) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
