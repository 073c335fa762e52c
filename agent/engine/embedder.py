"""Sentence embeddings from an encoder ONNX graph: mean pooling and L2 normalisation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.engine.embed_batcher import DynamicEmbeddingBatcher, EmbeddingBatchConfig
from agent.engine.interface import EmbeddingResult
from agent.engine.memory import trim_heap
from agent.engine.supervisor import OnDead, RestartPolicy
from agent.engine.text_codec import load_tokenizer
from agent.errors import AgentError, EngineError, InvalidRequestError

log = logging.getLogger(__name__)

# Text up to this many characters is tokenised on the calling coroutine: 0.1-0.2 ms of
# work, where a hop to a worker thread and back costs more than that at the tail (a
# thread's wake-up waits for a core on a loaded box). Longer text goes to a thread.
# Measured (benchmarks.semantic_cache --cost-only, 2-core box, load 2-3): a miss's p99
# 8.3 -> 5.0 ms and 20.2 -> 7.6 ms, the embedding alone 7.8 -> 3.8 and 15.9 -> 5.6 ms.
INLINE_TOKENIZE_CHARS = 2048


class OnnxEmbeddingModel:
    def __init__(
        self,
        *,
        model_id: str,
        version: str,
        session: ort.InferenceSession,
        tokenizer_file: Path,
        max_input_tokens: int,
        normalize: bool = True,
        pad_token_id: int = 0,
        batch_config: EmbeddingBatchConfig = EmbeddingBatchConfig(),
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        self._model_id = model_id
        self._version = version
        self._session = session
        self._tokenizer = load_tokenizer(tokenizer_file)
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._max_input_tokens = max_input_tokens
        self._vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._normalize = normalize
        self._pad = pad_token_id
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name = session.get_outputs()[0].name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort-embed")
        self.batcher = DynamicEmbeddingBatcher(
            self._run, self._executor, batch_config, restart_policy
        )

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def version(self) -> str:
        return self._version

    @property
    def max_input_tokens(self) -> int:
        return self._max_input_tokens

    @property
    def dead_reason(self) -> str:
        return self.batcher.dead_reason

    async def start(self, on_dead: OnDead | None = None) -> None:
        await self.batcher.start(on_dead)

    async def close(self) -> None:
        await self.batcher.close()
        # a call cancelled mid-run is still on the worker thread: wait for it off the loop
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        # the session goes now, and the C heap gives its pages back (unload, hot swap)
        self._session = None
        await asyncio.to_thread(trim_heap, "model closed")

    def _ids_for(self, index: int, item: str | Sequence[int]) -> list[int]:
        if isinstance(item, str):
            # encode_batch releases the GIL (encode does not): see embed()
            ids = list(self._tokenizer.encode_batch([item], add_special_tokens=True)[0].ids)
        else:
            ids = list(item)
            bad = next((t for t in ids if not 0 <= t < self._vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"input[{index}] has token id {bad}, outside this model's vocabulary "
                    f"(0 to {self._vocab_size - 1})",
                    param="input",
                )
        if not ids:
            raise InvalidRequestError(f"input[{index}] is empty", param="input")
        if len(ids) > self._max_input_tokens:
            raise InvalidRequestError(
                f"input[{index}] has {len(ids)} tokens; this model accepts at most "
                f"{self._max_input_tokens}",
                param="input",
            )
        return ids

    def _ids_for_all(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        return [self._ids_for(i, item) for i, item in enumerate(inputs)]

    async def embed(
        self, inputs: Sequence[str | Sequence[int]], *, wait_for_company: bool = True
    ) -> EmbeddingResult:
        chars = sum(len(item) for item in inputs if isinstance(item, str))
        if chars > INLINE_TOKENIZE_CHARS:
            # tokenizing text takes milliseconds per 100 KB: off the event loop
            batch = await asyncio.to_thread(self._ids_for_all, inputs)
        else:
            batch = self._ids_for_all(inputs)
        try:
            vectors = await self.batcher.embed(batch, wait_for_company=wait_for_company)
        except AgentError:
            raise
        except Exception as exc:
            # ONNX Runtime's text names graph nodes and shapes: the log gets it, not the client
            log.error("embedding model %s failed: %s", self._model_id, exc)
            raise EngineError("the embedding model failed on this input") from exc
        return EmbeddingResult(
            vectors=vectors.tolist(), prompt_tokens=sum(len(ids) for ids in batch)
        )

    def _run(self, batch: list[list[int]]) -> npt.NDArray[np.float32]:
        width = max(len(ids) for ids in batch)
        input_ids = np.full((len(batch), width), self._pad, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._session.run([self._output_name], feed)[0].astype(np.float32)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        if self._normalize:
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        result: npt.NDArray[np.float32] = pooled.astype(np.float32, copy=False)
        return result
