"""Dynamic batching of embedding inputs, as Triton's dynamic batcher does it.

Inputs from concurrent requests wait at most ``max_queue_delay_us`` for company, then run
together in one ONNX Runtime call of at most ``max_batch_size`` inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class EmbeddingBatchConfig:
    max_batch_size: int = 32  # inputs per ONNX Runtime call
    max_queue_delay_us: int = 2000  # how long the first input waits for others


class DynamicEmbeddingBatcher:
    def __init__(
        self,
        run: Callable[[list[list[int]]], Vectors],
        executor: Executor,
        config: EmbeddingBatchConfig = EmbeddingBatchConfig(),
    ) -> None:
        self._run = run
        self._executor = executor
        self.config = config
        self._pending: deque[tuple[list[int], asyncio.Future[Vectors]]] = deque()
        self._first_arrival = 0.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.batch_sizes: list[int] = []  # inputs per call, most recent last (bounded)

    async def embed(self, inputs: list[list[int]]) -> Vectors:
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="embedding-batcher")
        assert self._wake is not None
        futures = [loop.create_future() for _ in inputs]
        if not self._pending:
            self._first_arrival = time.monotonic()
        self._pending.extend(zip(inputs, futures, strict=True))
        self._wake.set()
        try:
            return np.stack(await asyncio.gather(*futures))
        finally:
            for f in futures:
                f.cancel()  # a cancelled request's inputs are skipped

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        delay = self.config.max_queue_delay_us / 1e6
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            waited = time.monotonic() - self._first_arrival
            if len(self._pending) < self.config.max_batch_size and waited < delay:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay - waited)
                continue
            batch: list[tuple[list[int], asyncio.Future[Vectors]]] = []
            while self._pending and len(batch) < self.config.max_batch_size:
                ids, future = self._pending.popleft()
                if not future.done():
                    batch.append((ids, future))
            self._first_arrival = time.monotonic()
            if not batch:
                continue
            try:
                vectors = await loop.run_in_executor(
                    self._executor, self._run, [ids for ids, _ in batch]
                )
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batch_sizes.append(len(batch))
            del self.batch_sizes[:-1000]
            for row, (_, future) in enumerate(batch):
                if not future.done():
                    future.set_result(vectors[row])
