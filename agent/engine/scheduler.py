"""Continuous batching at iteration level over one ONNX Runtime decoder session.

One scheduler task owns the session. Every step runs, on a worker thread, at most one
prefill (a chunk of one newly admitted prompt, so a long prompt never stalls running decodes
for long, or several short prompts together) followed by one batched decode of all running
sequences. A sequence joins the batch as soon as its prompt is in the cache and leaves it
the step it finishes or is cancelled, freeing its key/value slot.

Slots (rows of the :class:`~agent.engine.causal_lm.SlotCache`): the running sequences hold
slots ``0..n-1`` in the order of ``_running``; the prompt being prefilled takes the slots
right after them. A sequence that leaves has its slot filled by the last running one (and
that one's by the prompt being prefilled), so the decode batch is always rows ``0..n-1``.

Admission control follows Triton's queue policy: a bounded priority queue, a maximum
queue wait, per-request timeouts, and immediate rejection (429 with Retry-After) when the
queue is full or the predicted wait exceeds the request's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agent.engine.causal_lm import CausalLM
from agent.engine.interface import (
    PRIORITY_RANK,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
)
from agent.engine.prefix_cache import PrefixCache
from agent.engine.sampling import TokenSampler
from agent.engine.stops import StopMatcher
from agent.engine.text_codec import IncrementalDetokenizer, TextCodec
from agent.errors import (
    AgentError,
    EngineError,
    InvalidRequestError,
    OverloadedError,
    RequestTimeoutError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatcherConfig:
    max_running: int = 16  # sequences decoded together in one step
    max_batched_tokens: int = 256  # prompt tokens per step (a chunk, or short prompts together)
    kv_budget_tokens: int = 32768  # prompt + max_tokens reserved across running sequences
    max_queue: int = 64  # waiting sequences; more are rejected with 429
    max_queue_wait_s: float = 60.0  # a sequence waiting longer is rejected with 429
    request_timeout_s: float = 300.0  # default whole-request timeout
    prefix_cache_bytes: int = 64 << 20  # keys/values of recent prompts' blocks; 0: off


class BatcherListener(Protocol):
    """Told what the batcher does (metrics implement this)."""

    def on_step(self, stats: StepStats) -> None: ...

    def on_admitted(self, queue_wait_s: float) -> None: ...

    def on_rejected(self, reason: str) -> None: ...

    def on_prefix_reused(self, tokens: int) -> None: ...


@dataclass
class StepStats:
    """What one scheduler step did, for metrics and profiles."""

    batch_size: int = 0  # sequences decoded this step
    prefill_tokens: int = 0  # prompt tokens run this step
    ort_s: float = 0.0  # time inside ONNX Runtime
    sample_s: float = 0.0  # time choosing tokens
    step_s: float = 0.0  # whole step, scheduling included


class _Sequence:
    """A request inside the batcher."""

    def __init__(
        self,
        request: GenerationRequest,
        codec: TextCodec,
        eos_token_ids: frozenset[int],
        order: int,
        timeout_s: float,
    ) -> None:
        self.request = request
        self.prompt = np.asarray(request.prompt_token_ids, dtype=np.int64)
        self.sampler = TokenSampler(request.params, eos_token_ids)
        self.detok: IncrementalDetokenizer = codec.detokenizer()
        self.stops = StopMatcher(request.params.stop)
        self.outputs: asyncio.Queue[GenerationOutput | AgentError] = asyncio.Queue()
        self.arrived = time.monotonic()
        self.deadline = self.arrived + timeout_s
        self.rank = (PRIORITY_RANK[request.priority], order)
        self.prefilled = 0  # prompt tokens already in this sequence's cache
        self.prefix: npt.NDArray[np.float32] | None = None  # cached keys/values of its start
        self.last_token = -1
        self.generated = 0
        self.cancelled = False
        self.done = False
        self.admitted_at: float | None = None

    @property
    def reserved_tokens(self) -> int:
        return int(self.prompt.shape[0]) + self.request.params.max_tokens

    def __lt__(self, other: _Sequence) -> bool:
        return self.rank < other.rank


@dataclass
class _Plan:
    prefill: _Sequence | None = None  # a prompt, one chunk this step
    chunk: npt.NDArray[np.int64] | None = None
    group: list[_Sequence] = field(default_factory=list)  # short prompts, whole, together
    rows: list[_Sequence] = field(default_factory=list)  # running sequences to decode


@dataclass
class _Result:
    prefill_token: int | None = None
    group_tokens: list[int] = field(default_factory=list)
    row_tokens: list[int] = field(default_factory=list)
    stats: StepStats = field(default_factory=StepStats)


class ContinuousBatcher:
    def __init__(
        self,
        lm: CausalLM,
        codec: TextCodec,
        eos_token_ids: Sequence[int],
        config: BatcherConfig = BatcherConfig(),
    ) -> None:
        self._lm = lm
        self._codec = codec
        self._eos = frozenset(eos_token_ids)
        self.config = config
        # running and prefilling sequences together are at most max_running
        self._cache = lm.new_cache(config.max_running)
        self._bytes_per_token = lm.spec.bytes_per_token
        self._prefixes = (
            PrefixCache(config.prefix_cache_bytes) if config.prefix_cache_bytes else None
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort-batch")
        self._waiting: list[_Sequence] = []  # heap by (priority, arrival)
        self._prefilling: list[_Sequence] = []
        self._running: list[_Sequence] = []  # slot i of the cache
        self._partial: _Sequence | None = None  # prompt half in the cache, slot len(_running)
        self._order = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._service_s = 0.0  # moving average of a sequence's time in the batch
        self.last_step = StepStats()
        self.listeners: list[BatcherListener] = []

    # ---- load, for health, metrics and the coordinator -----------------------------------

    @property
    def running(self) -> int:
        return len(self._running) + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_used_tokens(self) -> int:
        """Cache slots allocated, in tokens (padding to the longest sequence included)."""
        return self._cache.allocated_tokens

    @property
    def kv_used_fraction(self) -> float:
        """The budget share admission has promised: admitted sequences x the longest one's
        prompt + max_tokens (slots are padded to it). Near 1, new requests wait."""
        active = [*self._running, *self._prefilling]
        if not active:
            return 0.0
        promised = len(active) * max(s.reserved_tokens for s in active)
        return min(1.0, promised / self.config.kv_budget_tokens)

    # ---- lifecycle -----------------------------------------------------------------------

    def _ensure_started(self) -> asyncio.Event:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="continuous-batcher")
        assert self._wake is not None
        return self._wake

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for seq in [*self._waiting, *self._prefilling, *self._running]:
            seq.outputs.put_nowait(EngineError("the engine is shutting down"))
        self._executor.shutdown(wait=True, cancel_futures=True)

    # ---- admission -----------------------------------------------------------------------

    def predicted_wait_s(self, rank: tuple[int, int]) -> float:
        """Time until a new sequence of this rank would start, from recent service times."""
        free = self.config.max_running - self.running
        ahead = sum(1 for s in self._waiting if s.rank < rank)
        if ahead < free:
            return 0.0
        rounds = math.ceil((ahead - free + 1) / self.config.max_running)
        return rounds * self._service_s

    def _admit_or_reject(self, seq: _Sequence) -> None:
        cfg = self.config
        retry = max(1.0, self._service_s)
        if len(self._waiting) >= cfg.max_queue:
            raise OverloadedError(
                f"the queue is full ({cfg.max_queue} waiting); retry later",
                retry_after=retry,
                reason="queue_full",
            )
        if seq.reserved_tokens > cfg.kv_budget_tokens:
            raise InvalidRequestError(
                f"the request needs {seq.reserved_tokens} cache tokens (prompt + max_tokens); "
                f"this agent's cache holds {cfg.kv_budget_tokens}",
                param="max_tokens",
            )
        wait = self.predicted_wait_s(seq.rank)
        if wait > seq.deadline - seq.arrived or wait > cfg.max_queue_wait_s:
            raise OverloadedError(
                f"predicted wait {wait:.1f} s exceeds the request's deadline; retry later",
                retry_after=max(1.0, wait),
                reason="predicted_wait",
            )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._closed:
            raise EngineError("the engine is shutting down")
        timeout = request.timeout_s or self.config.request_timeout_s
        seq = _Sequence(request, self._codec, self._eos, next(self._order), timeout)
        try:
            self._admit_or_reject(seq)
        except OverloadedError as exc:
            for listener in self.listeners:
                listener.on_rejected(exc.reason)
            raise
        wake = self._ensure_started()
        heapq.heappush(self._waiting, seq)
        wake.set()
        try:
            while True:
                item = await seq.outputs.get()
                if isinstance(item, AgentError):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not seq.done:
                seq.cancelled = True  # the client went away: free the slot next step
                wake.set()

    # ---- the loop ------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            started = time.perf_counter()
            self._drop_cancelled_and_expired()
            self._admit()
            if not self._running and not self._prefilling:
                self._wake.clear()
                if not self._waiting:
                    await self._wake.wait()
                else:  # waiting but blocked by the cache budget: wait for a change
                    await asyncio.sleep(0.005)
                continue
            plan = self._plan()
            try:
                result = await loop.run_in_executor(self._executor, self._execute, plan)
            except Exception as exc:  # onnxruntime failure: fail this step's sequences
                log.exception("engine step failed")
                self._fail(plan, EngineError(f"inference failed: {exc}"))
                continue
            self._apply(plan, result)
            result.stats.step_s = time.perf_counter() - started
            self.last_step = result.stats
            for listener in self.listeners:
                listener.on_step(result.stats)
            await asyncio.sleep(0)  # let handlers run between steps

    def _finish(self, seq: _Sequence, item: GenerationOutput | AgentError) -> None:
        seq.done = True
        seq.outputs.put_nowait(item)
        if seq.admitted_at is not None:
            spent = time.monotonic() - seq.admitted_at
            self._service_s = spent if self._service_s == 0 else 0.8 * self._service_s + 0.2 * spent

    def _drop_cancelled_and_expired(self) -> None:
        now = time.monotonic()
        if any(s.cancelled or s.deadline < now for s in self._waiting):
            keep = []
            for s in self._waiting:
                if s.cancelled:
                    continue
                if s.deadline < now or now - s.arrived > self.config.max_queue_wait_s:
                    self._finish(s, OverloadedError(
                        "timed out waiting in the queue", retry_after=1.0, reason="queue_timeout"
                    ))  # fmt: skip
                    for listener in self.listeners:
                        listener.on_rejected("queue_timeout")
                    continue
                keep.append(s)
            self._waiting = keep
            heapq.heapify(self._waiting)
        for s in list(self._prefilling):
            if s.cancelled or s.deadline < now:
                self._prefilling.remove(s)
                if s is self._partial:
                    self._partial = None
                    self._cache.lengths[len(self._running)] = 0
                if not s.cancelled:
                    self._finish(s, RequestTimeoutError("the request ran past its timeout"))
        gone = [i for i, s in enumerate(self._running) if s.cancelled or s.deadline < now]
        for i in gone:
            s = self._running[i]
            if not s.cancelled:
                self._finish(s, RequestTimeoutError("the request ran past its timeout"))
        self._remove_rows(gone)

    def _remove_rows(self, rows: list[int]) -> None:
        """Free the slots of these running sequences (indices into ``_running``)."""
        for row in sorted(rows, reverse=True):
            last = len(self._running) - 1
            if row != last:  # the last running sequence takes the freed slot
                self._cache.move(last, row)
                self._running[row] = self._running[last]
            self._running.pop()
            self._cache.lengths[last] = 0
            if self._partial is not None:  # the prompt being prefilled follows
                self._cache.move(last + 1, last)
        if not self._running and self._partial is None:
            self._cache.clear()  # idle: give the memory back

    def _reserved_fits(self, extra: _Sequence) -> bool:
        """Slots are padded to the longest sequence: rows x longest must fit the budget."""
        active = [*self._running, *self._prefilling, extra]
        longest = max(s.reserved_tokens for s in active)
        return len(active) * longest <= self.config.kv_budget_tokens

    def _admit(self) -> None:
        while self._waiting and self.running < self.config.max_running:
            head = self._waiting[0]
            if (self._running or self._prefilling) and not self._reserved_fits(head):
                break
            heapq.heappop(self._waiting)
            head.admitted_at = time.monotonic()
            for listener in self.listeners:
                listener.on_admitted(head.admitted_at - head.arrived)
            if self._prefixes is not None:
                head.prefix = self._prefixes.lookup(head.prompt)[1]
            self._prefilling.append(head)

    def _plan(self) -> _Plan:
        self._cache.token_limit = max(
            (s.reserved_tokens for s in (*self._running, *self._prefilling)), default=None
        )
        plan = _Plan(rows=list(self._running))
        if not self._prefilling:
            return plan
        # The budget does not shrink with the batch: a prompt is cut into the same chunks
        # whether it runs alone or with others, so its output does not depend on the load.
        budget = self.config.max_batched_tokens
        seq = self._partial or self._prefilling[0]
        if seq is self._partial or seq.prefix is not None or len(seq.prompt) > budget:
            if seq.prefix is not None:  # start from a cached prefix: into the slot now
                self._cache.write(len(self._running), seq.prefix)
                reused = seq.prefilled = int(seq.prefix.shape[2])
                seq.prefix = None
                for listener in self.listeners:
                    listener.on_prefix_reused(reused)
            self._partial = seq
            plan.prefill = seq
            plan.chunk = seq.prompt[seq.prefilled : seq.prefilled + budget]
            return plan
        # whole short prompts go together, right-padded to the longest, within the budget
        width = 0
        for candidate in self._prefilling:
            if candidate.prefix is not None:
                break
            longest = max(width, len(candidate.prompt))
            if (len(plan.group) + 1) * longest > budget:
                break
            plan.group.append(candidate)
            width = longest
        return plan

    def _prefill_group(self, plan: _Plan, result: _Result) -> None:
        group = plan.group
        lengths = np.array([len(s.prompt) for s in group], dtype=np.int64)
        ids = np.zeros((len(group), int(lengths.max())), dtype=np.int64)
        for i, seq in enumerate(group):
            ids[i, : len(seq.prompt)] = seq.prompt
        t0 = time.perf_counter()
        logits = self._lm.run(self._cache, len(self._running), ids, lengths, lengths[:, None] - 1)
        t1 = time.perf_counter()
        result.group_tokens = [seq.sampler.sample(logits[i, 0]) for i, seq in enumerate(group)]
        result.stats.prefill_tokens += int(lengths.sum())
        result.stats.ort_s += t1 - t0
        result.stats.sample_s += time.perf_counter() - t1

    def _execute(self, plan: _Plan) -> _Result:
        """Runs on the worker thread: ONNX Runtime and sampling, nothing else."""
        result = _Result()
        stats = result.stats
        if plan.group:
            self._prefill_group(plan, result)
        if plan.prefill is not None and plan.chunk is not None:
            seq = plan.prefill
            n = int(plan.chunk.shape[0])
            total = seq.prefilled + n
            t0 = time.perf_counter()
            logits = self._lm.run(
                self._cache,
                len(self._running),
                plan.chunk.reshape(1, n),
                np.array([total], dtype=np.int64),
                np.array([[n - 1]], dtype=np.int64),
            )
            t1 = time.perf_counter()
            if total == int(seq.prompt.shape[0]):
                result.prefill_token = seq.sampler.sample(logits[0, 0])
            stats.prefill_tokens = n
            stats.ort_s += t1 - t0
            stats.sample_s += time.perf_counter() - t1
        if plan.rows:
            rows = len(plan.rows)
            ids = np.array([[s.last_token] for s in plan.rows], dtype=np.int64)
            t0 = time.perf_counter()
            logits = self._lm.run(
                self._cache, 0, ids, self._cache.lengths[:rows] + 1, np.zeros((rows, 1), np.int64)
            )
            t1 = time.perf_counter()
            result.row_tokens = [s.sampler.sample(logits[i, 0]) for i, s in enumerate(plan.rows)]
            stats.batch_size = rows
            stats.ort_s += t1 - t0
            stats.sample_s += time.perf_counter() - t1
        return result

    def _emit(self, seq: _Sequence, token: int) -> bool:
        """Hand one sampled token to the sequence's consumer; True when it is finished."""
        params = seq.request.params
        seq.generated += 1
        seq.last_token = token
        finish: FinishReason | None = None
        if token in self._eos:
            text = seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
            finish = "stop"
        else:
            text = seq.stops.feed(seq.detok.add(token))
            if seq.stops.stopped:
                finish = "stop"
            elif seq.generated >= params.max_tokens:
                text += seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
                finish = "length"
        output = GenerationOutput(
            text=text,
            token_ids=(token,),
            finish_reason=finish,
            prompt_tokens=int(seq.prompt.shape[0]),
            completion_tokens=seq.generated,
        )
        if finish is not None:
            self._finish(seq, output)
            return True
        seq.outputs.put_nowait(output)
        return False

    def _apply(self, plan: _Plan, result: _Result) -> None:
        # Indices into _running stay valid until _remove_rows, which runs once, at the end.
        finished = [
            i
            for i, (seq, token) in enumerate(zip(plan.rows, result.row_tokens, strict=True))
            if seq.cancelled or self._emit(seq, token)
        ]
        joined: list[tuple[_Sequence, int]] = []  # prompts now whole in the cache
        for seq, token in zip(plan.group, result.group_tokens, strict=True):
            self._prefilling.remove(seq)
            seq.prefilled = len(seq.prompt)
            joined.append((seq, token))
        chunked = plan.prefill
        if chunked is not None and plan.chunk is not None:
            chunked.prefilled += int(plan.chunk.shape[0])
            if result.prefill_token is not None:
                self._prefilling.remove(chunked)
                self._partial = None
                joined.append((chunked, result.prefill_token))
        for seq, token in joined:  # their slots follow the running ones already
            slot = len(self._running)
            if self._prefixes is not None:
                self._prefixes.store(seq.prompt, partial(self._cache.read, slot))
            self._running.append(seq)
            if seq.cancelled or self._emit(seq, token):
                finished.append(slot)
        self._remove_rows(finished)

    def _fail(self, plan: _Plan, error: AgentError) -> None:
        for seq in plan.rows:
            self._finish(seq, error)
        self._remove_rows(list(range(len(plan.rows))))
        for seq in [*plan.group, *([plan.prefill] if plan.prefill else [])]:
            if seq in self._prefilling:
                self._prefilling.remove(seq)
                self._finish(seq, error)
        self._partial = None
        if not self._running:
            self._cache.clear()
