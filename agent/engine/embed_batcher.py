"""Dynamic batching of embedding inputs, as Triton's dynamic batcher does it.

Inputs from concurrent requests wait at most ``max_queue_delay_us`` for company, then run
together in one ONNX Runtime call of at most ``max_batch_size`` inputs. At most
``max_queue`` inputs wait: a request that would take the queue past it is refused at once
(:class:`OverloadedError`, 429 with Retry-After) and none of its inputs are queued.
An input asked for ``wait_for_company=False`` (a lookup on a request's critical path, such
as the semantic cache's) waits for no one: the next call starts as soon as the worker is
free, taking every input pending by then; it still waits behind the call being run.

The owner starts the loop (:meth:`DynamicEmbeddingBatcher.start`) and awaits its end
(:meth:`DynamicEmbeddingBatcher.close`). A failed ONNX Runtime call fails that call's
inputs only (each input of a failed call is then run alone, so one bad input fails its
own request and no other); any other unexpected error in the loop fails every pending input with
:class:`EngineRestartedError` and restarts the loop, up to the :class:`RestartPolicy`; past
it the batcher is dead and every request fails at once with :class:`EngineDeadError`.
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

from agent.engine.supervisor import OnDead, RestartPolicy, supervise
from agent.errors import (
    EngineDeadError,
    EngineError,
    EngineRestartedError,
    InvalidRequestError,
    OverloadedError,
)

Vectors = npt.NDArray[np.float32]
_Pending = tuple[list[int], "asyncio.Future[Vectors]"]


@dataclass(frozen=True)
class EmbeddingBatchConfig:
    max_batch_size: int = 32  # inputs per ONNX Runtime call
    max_queue_delay_us: int = 2000  # how long the first input waits for others
    max_queue: int = 4096  # inputs waiting at most; a request beyond it gets 429


class DynamicEmbeddingBatcher:
    def __init__(
        self,
        run: Callable[[list[list[int]]], Vectors],
        executor: Executor,
        config: EmbeddingBatchConfig = EmbeddingBatchConfig(),
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        self._run = run
        self._executor = executor
        self.config = config
        self.restart_policy = restart_policy or RestartPolicy()
        self._pending: deque[_Pending] = deque()
        self._batch: list[_Pending] = []  # the inputs of the call being run
        self._hurried: set[asyncio.Future[Vectors]] = set()  # pending, waiting for no one
        self._first_arrival = 0.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._on_dead: OnDead | None = None
        self._dead_reason = ""
        self.restarts = 0  # loop restarts after an unexpected failure, since start
        self.refused = 0  # requests refused because the queue was full, since start
        self.batch_sizes: list[int] = []  # inputs per call, most recent last (bounded)

    @property
    def dead_reason(self) -> str:
        """Why the batcher stopped for good; empty while it serves."""
        return self._dead_reason

    async def start(self, on_dead: OnDead | None = None) -> None:
        """Starts the supervised batching loop; ``on_dead`` hears if it ever dies."""
        if self._closed:
            raise EngineError("the embedding engine is closed")
        if self._task is not None:
            raise EngineError("the embedding engine is already started")
        self._on_dead = on_dead
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(
            supervise("embedding batcher", self._loop, self.restart_policy, self._on_failure),
            name="embedding-batcher",
        )

    async def embed(self, inputs: list[list[int]], *, wait_for_company: bool = True) -> Vectors:
        """The inputs' vectors. ``wait_for_company`` False: the next call does not wait
        ``max_queue_delay_us`` for other inputs (it runs once the worker is free)."""
        if self._closed:
            raise EngineError("the embedding engine is shutting down")
        if self._dead_reason:
            raise EngineDeadError(f"the embedding engine is unavailable: {self._dead_reason}")
        wake = self._wake
        if wake is None:
            raise EngineError("the embedding engine is not running (start() was never called)")
        if len(inputs) > self.config.max_queue:
            raise InvalidRequestError(
                f"{len(inputs)} inputs in one request; this agent queues at most "
                f"{self.config.max_queue}",
                param="input",
            )
        if len(self._pending) + len(inputs) > self.config.max_queue:
            self.refused += 1
            raise OverloadedError(
                f"the embedding queue is full ({len(self._pending)} inputs waiting, at most "
                f"{self.config.max_queue}); retry later",
                retry_after=1.0,
                reason="embedding_queue_full",
            )
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in inputs]
        if not self._pending:
            self._first_arrival = time.monotonic()
        self._pending.extend(zip(inputs, futures, strict=True))
        if not wait_for_company:
            self._hurried.update(futures)
        wake.set()
        try:
            return np.stack(await asyncio.gather(*futures))
        finally:
            for f in futures:
                f.cancel()  # a cancelled request's inputs are skipped

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fail_all(EngineError("the embedding engine is shutting down"))

    def _fail_all(self, error: EngineError) -> None:
        for _, future in [*self._batch, *self._pending]:
            if not future.done():
                future.set_exception(error)
        self._batch = []
        self._pending.clear()
        self._hurried.clear()

    def _on_failure(self, dead: str | None) -> None:
        """The loop raised: fail every input it held and start from a clean state."""
        if dead is None:
            self.restarts += 1
            self._fail_all(
                EngineRestartedError("the engine failed and restarted; retry the request")
            )
        else:
            self._dead_reason = dead
            self._fail_all(EngineDeadError(f"the embedding engine is unavailable: {dead}"))
            if self._on_dead is not None:
                self._on_dead(dead)

    def _take_batch(self) -> list[_Pending]:
        """The next call's inputs: up to ``max_batch_size`` still wanted, oldest first."""
        batch: list[_Pending] = []
        while self._pending and len(batch) < self.config.max_batch_size:
            ids, future = self._pending.popleft()
            self._hurried.discard(future)
            if not future.done():
                batch.append((ids, future))
        self._first_arrival = time.monotonic()
        return batch

    def _deliver(self, batch: list[_Pending], vectors: Vectors) -> None:
        self.batch_sizes.append(len(batch))
        del self.batch_sizes[:-1000]
        for row, (_, future) in enumerate(batch):
            if not future.done():
                future.set_result(vectors[row])

    async def _run_alone(self, batch: list[_Pending]) -> None:
        """After a failed call: each input in a call of its own, so only the bad fail."""
        loop = asyncio.get_running_loop()
        for ids, future in batch:
            if future.done():
                continue
            try:
                vectors = await loop.run_in_executor(self._executor, self._run, [ids])
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(vectors[0])

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
            if (
                len(self._pending) < self.config.max_batch_size
                and waited < delay
                and not self._hurried
            ):
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay - waited)
                continue
            self._batch = batch = self._take_batch()
            if not batch:
                continue
            try:
                vectors = await loop.run_in_executor(
                    self._executor, self._run, [ids for ids, _ in batch]
                )
            except Exception as exc:  # onnxruntime failure: fail this call's inputs only
                if len(batch) == 1:
                    if not batch[0][1].done():
                        batch[0][1].set_exception(exc)
                else:
                    await self._run_alone(batch)
                self._batch = []
                continue
            self._deliver(batch, vectors)
            self._batch = []
