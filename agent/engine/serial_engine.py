"""Runs one generation at a time on a :class:`CausalLM`, off the event loop.

Every forward pass runs on a single-thread executor, so the event loop keeps answering
(health checks, new connections) while a generation runs, and sequences queue in
arrival order. Continuous batching replaces this class behind the same interface.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from agent.engine.causal_lm import CausalLM, KVCache
from agent.engine.interface import FinishReason, GenerationOutput, GenerationRequest
from agent.engine.sampling import TokenSampler
from agent.engine.stops import StopMatcher
from agent.engine.text_codec import TextCodec
from agent.errors import EngineError

log = logging.getLogger(__name__)


class SerialTextEngine:
    def __init__(self, lm: CausalLM, codec: TextCodec, eos_token_ids: Sequence[int]) -> None:
        self._lm = lm
        self._codec = codec
        self._eos = frozenset(eos_token_ids)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort-decode")
        self._lock = asyncio.Lock()
        self.running = 0  # sequences being generated (0 or 1)
        self.waiting = 0  # sequences queued behind it

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _step(self, token_ids: Sequence[int], cache: KVCache) -> tuple[np.ndarray, KVCache]:
        loop = asyncio.get_running_loop()
        ids = np.asarray(token_ids, dtype=np.int64)
        try:
            return await loop.run_in_executor(self._executor, self._lm.forward, ids, cache)
        except Exception as exc:  # onnxruntime errors are plain RuntimeError/Fail
            raise EngineError(f"inference failed: {exc}") from exc

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        params = request.params
        prompt = list(request.prompt_token_ids)
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            sampler = TokenSampler(params)
            detok = self._codec.detokenizer()
            stops = StopMatcher(params.stop)
            logits, cache = await self._step(prompt, self._lm.empty_cache())
            generated = 0
            while True:
                token = sampler.sample(logits)
                generated += 1
                finish: FinishReason | None = None
                if token in self._eos:
                    text = stops.feed(detok.flush()) + stops.flush()
                    finish = "stop"
                else:
                    text = stops.feed(detok.add(token))
                    if stops.stopped:
                        finish = "stop"
                    elif generated >= params.max_tokens:
                        text += stops.feed(detok.flush()) + stops.flush()
                        finish = "length"
                yield GenerationOutput(
                    text=text,
                    token_ids=(token,),
                    finish_reason=finish,
                    prompt_tokens=len(prompt),
                    completion_tokens=generated,
                )
                if finish is not None:
                    return
                logits, cache = await self._step([token], cache)
        finally:
            self.running -= 1
            self._lock.release()
