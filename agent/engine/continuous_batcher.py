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

Supervision: the owner starts the loop (:meth:`ContinuousBatcher.start`) and awaits its end
(:meth:`ContinuousBatcher.close`). A failed ONNX Runtime call fails that step's sequences
only. Any other unexpected error in the loop (admission, planning, applying a step, a
listener) fails every waiting and running sequence with :class:`EngineRestartedError`, frees
their slots and restarts the loop; past the :class:`RestartPolicy` the engine is dead, every
request fails at once with :class:`EngineDeadError`, and ``on_dead`` is told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import numpy.typing as npt

from agent.engine.causal_lm import CausalLM
from agent.engine.interface import (
    PRIORITY_RANK,
    BatcherListener,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    StepStats,
)
from agent.engine.memory import trim_heap
from agent.engine.prefix_cache import PrefixCache
from agent.engine.sampling import TokenSampler
from agent.engine.speculation import DraftLength, StepCost, lookup
from agent.engine.stops import StopMatcher
from agent.engine.supervisor import OnDead, RestartPolicy, supervise
from agent.engine.text_codec import IncrementalDetokenizer, TextCodec
from agent.errors import (
    AgentError,
    EngineDeadError,
    EngineError,
    EngineRestartedError,
    InvalidRequestError,
    OverloadedError,
    RequestTimeoutError,
)

log = logging.getLogger(__name__)


# 512 MiB: 16 sequences of ~720 tokens for SmolLM2-135M (fp32 keys/values, 45 KiB a token),
# of ~1,360 for Qwen2.5-0.5B (24 KiB a token)
DEFAULT_KV_CACHE_BYTES = 512 << 20


PREFILL_RATE_WEIGHT = 0.3  # of the latest prefill call in the measured rate


@dataclass(frozen=True)
class BatcherConfig:
    max_running: int = 16  # sequences decoded together in one step
    max_batched_tokens: int = 256  # prompt tokens per step (a chunk, or short prompts together)
    # short prompts prefilled together in one step stop at the one that would make the
    # step take longer than this at the model's measured prefill rate (the first always
    # goes); 0: no limit. On a CPU a prompt's tokens cost the same alone or together, so
    # a bigger group only delays every prompt's first token and the running decodes
    max_prefill_step_s: float = 0.5
    # bytes of this model's key/value buffers, the transient copy while they grow included;
    # admission reserves prompt + max_tokens per running sequence, padded to the longest,
    # within it (see SlotCache.admissible_tokens)
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    # deprecated: the same budget in this model's tokens; when set, it replaces
    # kv_cache_bytes (converted with the model's bytes per token, transient copy included)
    kv_budget_tokens: int | None = None
    max_queue: int = 64  # waiting sequences; more are rejected with 429
    max_queue_wait_s: float = 60.0  # a sequence waiting longer is rejected with 429
    request_timeout_s: float = 300.0  # default whole-request timeout
    # keys/values of recent prompts' blocks, kept while idle; 0: off. Per model, and it
    # counts against the agent's memory budget: 32 MiB holds ~730 of SmolLM2's tokens
    prefix_cache_bytes: int = 32 << 20
    # idle this long, the engine unmaps the weight pages serving mapped (0: never)
    idle_release_s: float = 2.0
    # prompt-lookup speculation (agent/engine/speculation.py): tokens a sequence may propose
    # per step (0: off); only in steps decoding at most speculative_max_batch sequences (a
    # row with proposals runs in an ONNX Runtime call of its own: the fused attention kernel
    # takes several new positions of one row only), within speculative_max_extra_positions
    # proposed positions per step; the n-gram lengths looked up and how far back
    speculative_tokens: int = 0
    speculative_max_batch: int = 1
    speculative_max_extra_positions: int = 16
    speculative_ngram_min: int = 2
    speculative_ngram_max: int = 8
    speculative_lookback: int = 2048


class _Sequence:
    """A request inside the batcher."""

    def __init__(
        self,
        request: GenerationRequest,
        codec: TextCodec,
        eos_token_ids: frozenset[int],
        order: int,
        timeout_s: float,
        speculative_tokens: int = 0,
        step_cost: StepCost | None = None,
    ) -> None:
        self.request = request
        self.prompt = np.asarray(request.prompt_token_ids, dtype=np.int64)
        # prompt, then every token handed on (replayed ones included): what lookups search
        self.history = np.empty(len(self.prompt) + self.reserved_tokens_after_prompt, np.int64)
        self.history[: len(self.prompt)] = self.prompt
        self.history_len = len(self.prompt)
        self.draft = DraftLength(speculative_tokens, step_cost)
        self.sampler = TokenSampler(request.params, eos_token_ids)
        self.replay = list(request.continuation_token_ids)  # fed one per step, not sampled
        # constrained decoding: this sequence's own grammar state, masks its row's logits
        self.constraint = request.constraint.new_matcher() if request.constraint else None
        self.constraint_error = ""  # set when the constraint refused a token
        self.detok: IncrementalDetokenizer = codec.detokenizer()
        self.stops = StopMatcher(request.params.stop)
        self.outputs: asyncio.Queue[GenerationOutput | AgentError] = asyncio.Queue()
        self.arrived = time.monotonic()
        self.deadline = self.arrived + timeout_s
        self.rank = (PRIORITY_RANK[request.priority], order)
        self.prefilled = 0  # prompt tokens already in this sequence's cache
        self.last_token = -1
        self.generated = 0
        self.replayed = 0  # continuation tokens fed so far
        self.cancelled = False
        self.done = False
        self.admitted_at: float | None = None

    @property
    def reserved_tokens(self) -> int:
        return int(self.prompt.shape[0]) + self.reserved_tokens_after_prompt

    @property
    def reserved_tokens_after_prompt(self) -> int:
        return len(self.request.continuation_token_ids) + self.request.params.max_tokens

    def choose(self, logits: npt.NDArray[np.float32]) -> int:
        """The next token: the next continuation token while replaying, else a sample."""
        constraint = self.constraint
        if self.sampler.position < len(self.replay):
            self.sampler.skip()
            token = self.replay[self.sampler.position - 1]
        else:
            if constraint is not None:
                logits = constraint.apply(logits)
            token = self.sampler.sample(logits)
        if constraint is not None and not constraint.advance(token):
            self.constraint_error = constraint.error or "the grammar refused a token"
        return token

    def verify(
        self, logits: npt.NDArray[np.float32], proposal: list[int], eos: frozenset[int]
    ) -> list[int]:
        """The tokens this step hands on: ``logits`` [len(proposal) + 1, vocab] are the
        model's at this row's positions (the last token, then each proposed one). Each
        position is chosen exactly as without speculation (argmax, or the draw of this
        ``(seed, position)``), and the next is looked at only while the choice equals the
        proposal: the accepted proposals, then one token of the model's own."""
        tokens: list[int] = []
        for j in range(len(proposal) + 1):
            token = self.choose(logits[j])
            tokens.append(token)
            if j == len(proposal) or token != proposal[j] or token in eos:
                break
            if self.constraint_error or (self.constraint and self.constraint.finished):
                break
        return tokens

    def __lt__(self, other: _Sequence) -> bool:
        return self.rank < other.rank


@dataclass
class _Plan:
    # prompt tokens run this step, (sequence, first, end): one chunk of one prompt (after
    # its cached prefix, if any), or several short prompts whole, right-padded together
    prompts: list[tuple[_Sequence, int, int]] = field(default_factory=list)
    reuse: int = 0  # cached prefix tokens copied into the chunked prompt's slot first
    rows: list[_Sequence] = field(default_factory=list)  # running sequences to decode


@dataclass
class _Result:
    prompt_tokens: dict[int, int] = field(default_factory=dict)  # whole prompts' first tokens
    row_tokens: list[list[int]] = field(default_factory=list)  # per row, in order
    stats: StepStats = field(default_factory=StepStats)


class ContinuousBatcher:
    def __init__(
        self,
        lm: CausalLM,
        codec: TextCodec,
        eos_token_ids: Sequence[int],
        config: BatcherConfig = BatcherConfig(),
        restart_policy: RestartPolicy | None = None,
        release_idle: Callable[[], object] | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self._lm = lm
        # run in the engine's thread once it has been idle config.idle_release_s: lets go
        # of what serving mapped back in (the model's mapped weight pages)
        self._release_idle = release_idle
        self._release_when_idle = False  # steps ran since it last ran
        self._codec = codec
        self._eos = frozenset(eos_token_ids)
        self.config = config
        # running and prefilling sequences together are at most max_running
        self._cache = lm.new_cache(config.max_running)
        self._cache.max_bytes = (
            config.kv_cache_bytes
            if config.kv_budget_tokens is None
            else self._cache.bytes_for_tokens(config.kv_budget_tokens)
        )
        # prompt + max_tokens tokens admission may promise, over the running sequences
        self.kv_budget_tokens = self._cache.admissible_tokens() or 0
        self._trim_when_idle = False  # the cache was freed since the heap was last trimmed
        self._prefixes = (
            PrefixCache(config.prefix_cache_bytes) if config.prefix_cache_bytes else None
        )
        # what a proposed position costs this model on this machine (speculation's draft
        # lengths), measured from its steps of one sequence
        self._step_cost = StepCost()
        # prompt tokens per second of this model's prefill calls, a moving average (None
        # until one was measured)
        self._prefill_rate: float | None = None
        # the thread steps run on: the agent's one step executor when several models share
        # the cores (their steps interleave instead of oversubscribing), else its own
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ort-batch"
        )
        self._waiting: list[_Sequence] = []  # heap by (priority, arrival)
        self._prefilling: list[_Sequence] = []
        self._running: list[_Sequence] = []  # slot i of the cache
        self._partial: _Sequence | None = None  # prompt half in the cache, slot len(_running)
        self._order = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.restart_policy = restart_policy or RestartPolicy()
        self._on_dead: OnDead | None = None
        self._dead_reason = ""  # set once the loop failed past the restart policy
        self.restarts = 0  # loop restarts after an unexpected failure, since start
        self._service_s = 0.0  # moving average of a sequence's time in the batch
        self.listeners: list[BatcherListener] = []

    # ---- load, for health, metrics and the coordinator -----------------------------------

    @property
    def running(self) -> int:
        return len(self._running) + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def prefill_rate(self) -> float | None:
        """Prompt tokens per second of this model's prefill calls (a moving average; None
        until one was measured). Set on a new engine of the same model (a reload) to go on
        from what the last one measured."""
        return self._prefill_rate

    @prefill_rate.setter
    def prefill_rate(self, rate: float | None) -> None:
        self._prefill_rate = rate

    @property
    def kv_cache_bytes(self) -> int:
        """The cache's byte budget (engine.kv_cache_bytes, or the deprecated token budget
        converted)."""
        return self._cache.max_bytes or 0

    @property
    def kv_used_tokens(self) -> int:
        """Cache slots allocated, in tokens (padding to the longest sequence included)."""
        return self._cache.allocated_tokens

    @property
    def kv_allocated_bytes(self) -> int:
        """Bytes of the slots' key/value buffers now (freed when the engine is idle)."""
        return self._cache.allocated_bytes

    @property
    def prefix_cache_bytes(self) -> int:
        """Bytes of keys/values the prefix cache holds (kept while idle, within
        ``prefix_cache_bytes``)."""
        return self._prefixes.bytes_used if self._prefixes is not None else 0

    @property
    def kv_used_fraction(self) -> float:
        """The budget share admission has promised (see :meth:`_promised`); near 1, new
        requests wait."""
        return min(1.0, self._promised() / max(1, self.kv_budget_tokens))

    def _promised(self, extra: _Sequence | None = None) -> int:
        """Cache tokens promised to the admitted sequences (and ``extra``): their number x
        the longest one's prompt + max_tokens, since slots are padded to the longest."""
        active = [*self._running, *self._prefilling, *([extra] if extra else [])]
        return len(active) * max((s.reserved_tokens for s in active), default=0)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def dead_reason(self) -> str:
        """Why the engine stopped for good; empty while it serves."""
        return self._dead_reason

    async def start(self, on_dead: OnDead | None = None) -> None:
        """Starts the supervised scheduler loop; ``on_dead`` hears if it ever dies."""
        if self._closed:
            raise EngineError("the engine is closed")
        if self._task is not None:
            raise EngineError("the engine is already started")
        self._on_dead = on_dead
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(
            supervise("scheduler loop", self._loop, self.restart_policy, self._on_loop_failure),
            name="continuous-batcher",
        )

    async def close(self, *, trim: bool = True, free: bool = True) -> Callable[[], None] | None:
        """Stops the loop, fails what it held, waits for the worker thread, and frees the
        session, its weights and the caches on a worker thread: never blocking the event
        loop. ``trim=False`` leaves trimming the C heap to the caller (the residency trims
        beside the next model's load). ``free=False`` frees nothing and returns the
        blocking call that frees (the residency runs it beside the next model's build)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for seq in [*self._waiting, *self._prefilling, *self._running]:
            if not seq.done:
                self._finish(seq, EngineError("the engine is shutting down"))
        self._waiting, self._prefilling, self._running = [], [], []
        # a step cancelled mid-run is still on the worker thread: wait for it off the loop
        if self._own_executor:
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        else:  # shared, one worker: anything of ours submitted before this is done after it
            await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        # the session, its weights and the cache go now, not when the last reference to
        # this object does, and the C heap gives their pages back (unload, hot swap); off
        # the event loop: freeing a 0.5 GB session takes tens of milliseconds
        self._prefixes = None
        if not free:
            return partial(self._free_memory, trim)
        await asyncio.to_thread(self._free_memory, trim)
        return None

    def warm_here(self) -> None:
        """Blocking: one token through the session on the calling thread (its first run,
        off the step thread: see the residency's load)."""
        self._lm.warm_up()

    def _free_memory(self, trim: bool) -> None:
        self._cache.clear()
        self._lm.close()
        if trim:
            trim_heap("model closed")

    def _on_loop_failure(self, dead: str | None) -> None:
        """The loop raised: fail every sequence it held and start from a clean state."""
        error: EngineError
        if dead is None:
            self.restarts += 1
            error = EngineRestartedError("the engine failed and restarted; retry the request")
        else:
            self._dead_reason = dead
            error = EngineDeadError(f"the engine is unavailable: {dead}")
        for seq in [*self._waiting, *self._prefilling, *self._running]:
            if not seq.done and not seq.cancelled:
                self._finish(seq, error)
            seq.done = True
        self._waiting, self._prefilling, self._running = [], [], []
        self._partial = None
        self._cache.clear()  # every slot is free again
        self._trim_when_idle = True
        if self._prefixes is not None:  # it may be half updated: start it empty
            self._prefixes = PrefixCache(self.config.prefix_cache_bytes)
        if dead is not None and self._on_dead is not None:
            self._on_dead(dead)

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
        if seq.reserved_tokens > self.kv_budget_tokens:
            raise InvalidRequestError(
                f"the request needs {seq.reserved_tokens} cache tokens (prompt + max_tokens); "
                f"this agent's cache holds {self.kv_budget_tokens} of this model's "
                f"(engine.kv_cache_bytes {self._cache.max_bytes})",
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
        if self._dead_reason:
            raise EngineDeadError(f"the engine is unavailable: {self._dead_reason}")
        wake = self._wake
        if wake is None:
            raise EngineError("the engine is not running (start() was never called)")
        timeout = request.timeout_s or self.config.request_timeout_s
        seq = _Sequence(
            request, self._codec, self._eos, next(self._order), timeout,
            self.config.speculative_tokens, self._step_cost,
        )  # fmt: skip
        try:
            self._admit_or_reject(seq)
        except OverloadedError as exc:
            for listener in self.listeners:
                listener.on_rejected(exc.reason)
            raise
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
            if not self._running and not self._prefilling:  # _admit took all it could
                self._wake.clear()
                if self._trim_when_idle:  # the freed cache's pages go back to the OS
                    self._trim_when_idle = False
                    await loop.run_in_executor(self._executor, trim_heap, "engine idle")
                    if self._wake.is_set() or self._waiting:
                        continue
                if (
                    self._release_when_idle
                    and self._release_idle is not None
                    and (self.config.idle_release_s > 0)
                ):
                    try:  # a quiet spell, not each gap between two requests
                        await asyncio.wait_for(self._wake.wait(), self.config.idle_release_s)
                    except TimeoutError:
                        self._release_when_idle = False
                        await loop.run_in_executor(self._executor, self._release_idle)
                    continue
                await self._wake.wait()
                continue
            plan = self._plan()
            try:
                result = await loop.run_in_executor(self._executor, self._execute, plan)
            except Exception as exc:  # onnxruntime failure: fail this step's sequences
                log.exception("engine step failed")
                self._fail(plan, EngineError(f"inference failed: {exc}"))
                continue
            self._apply(plan, result)
            self._release_when_idle = True
            stats = result.stats
            stats.step_s = time.perf_counter() - started
            if self.config.speculative_tokens and stats.batch_size == 1 and not plan.prompts:
                # a step of one sequence alone: what its positions cost, for the draft lengths
                self._step_cost.observe(stats.decode_positions, stats.step_s)
                stats.position_cost = self._step_cost.position_cost
            if stats.prefill_tokens and stats.prefill_s > 0:
                rate = stats.prefill_tokens / stats.prefill_s
                last = self._prefill_rate
                self._prefill_rate = (
                    rate if last is None else last + PREFILL_RATE_WEIGHT * (rate - last)
                )
            for listener in self.listeners:
                listener.on_step(result.stats)
            await asyncio.sleep(0)  # let handlers run between steps

    def _finish(self, seq: _Sequence, item: GenerationOutput | AgentError) -> None:
        seq.done = True
        seq.outputs.put_nowait(item)
        if seq.admitted_at is not None:
            spent = time.monotonic() - seq.admitted_at
            self._service_s = spent if self._service_s == 0 else 0.8 * self._service_s + 0.2 * spent

    def _expired_in_queue(self, seq: _Sequence, now: float) -> bool:
        return seq.deadline < now or now - seq.arrived > self.config.max_queue_wait_s

    def _drop_cancelled_and_expired(self) -> None:
        now = time.monotonic()
        if any(s.cancelled or self._expired_in_queue(s, now) for s in self._waiting):
            keep = []
            for s in self._waiting:
                if s.cancelled:
                    continue
                if s.deadline < now:
                    # the caller's own timeout passed: a timeout (504), not overload to retry
                    # or overflow; the deadline is gone wherever the request would go
                    self._finish(s, RequestTimeoutError(
                        "the request's timeout passed while it waited in the queue"
                    ))  # fmt: skip
                    continue
                if now - s.arrived > self.config.max_queue_wait_s:  # the agent's own cap
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
        if not rows:
            return
        partial_slot = len(self._running)  # the prompt being prefilled follows them
        for row in sorted(rows, reverse=True):
            last = len(self._running) - 1
            if row != last:  # the last running sequence takes the freed slot
                self._cache.move(last, row)
                self._running[row] = self._running[last]
            self._running.pop()
            self._cache.lengths[last] = 0
        if self._partial is not None:
            self._cache.move(partial_slot, len(self._running))
        elif not self._running:
            self._cache.clear()  # idle: give the memory back
            self._trim_when_idle = True

    def _admit(self) -> None:
        while self._waiting and self.running < self.config.max_running:
            head = self._waiting[0]
            if self.running and self._promised(head) > self.kv_budget_tokens:
                break
            heapq.heappop(self._waiting)
            head.admitted_at = time.monotonic()
            for listener in self.listeners:
                listener.on_admitted(head.admitted_at - head.arrived)
            self._prefilling.append(head)

    def _cached_prefix(self, seq: _Sequence) -> int:
        return self._prefixes.cached_tokens(seq.prompt) if self._prefixes is not None else 0

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
        reuse = 0 if seq is self._partial else self._cached_prefix(seq)
        if seq is self._partial or reuse or len(seq.prompt) > budget:
            first = seq.prefilled or reuse
            plan.prompts = [(seq, first, min(len(seq.prompt), first + budget))]
            plan.reuse = reuse
            self._partial = seq  # it holds the slot after the running ones until it is in
            return plan
        # whole short prompts go together, right-padded to the longest, within the budget
        # and (after the first) within max_prefill_step_s at the measured prefill rate
        width = 0
        limit = self.config.max_prefill_step_s
        rate = self._prefill_rate
        for candidate in self._prefilling:
            longest = max(width, len(candidate.prompt))
            tokens = (len(plan.prompts) + 1) * longest
            if tokens > budget or self._cached_prefix(candidate):
                break
            # an engine yet to measure its rate (just loaded) takes one: a cold burst's
            # first step grouped every prompt (eight Qwen2.5-Coder chats: 4 s)
            if plan.prompts and limit > 0 and (rate is None or tokens / rate > limit):
                break
            plan.prompts.append((candidate, 0, len(candidate.prompt)))
            width = longest
        return plan

    def _run(
        self,
        stats: StepStats,
        first: int,
        ids: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        index: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.float32]:
        t0 = time.perf_counter()
        logits = self._lm.run(self._cache, first, ids, lengths, index)
        stats.ort_s += time.perf_counter() - t0
        return logits

    def _sample(
        self, stats: StepStats, seqs: list[_Sequence], logits: npt.NDArray[np.float32]
    ) -> list[int]:
        t0 = time.perf_counter()
        tokens = [seq.choose(logits[i]) for i, seq in enumerate(seqs)]
        stats.sample_s += time.perf_counter() - t0
        return tokens

    def _prefill(self, plan: _Plan, result: _Result) -> None:
        """Runs the plan's prompt tokens into the slots after the running sequences."""
        first = len(self._running)
        if plan.reuse:  # the chunked prompt starts from its cached prefix
            assert self._prefixes is not None
            seq = plan.prompts[0][0]
            reused, block = self._prefixes.lookup(seq.prompt)
            if reused != plan.reuse or block is None:
                raise RuntimeError("the prefix cache changed between planning and running")
            self._cache.write(first, block)
        starts = np.array([start for _, start, _ in plan.prompts], dtype=np.int64)
        ends = np.array([end for _, _, end in plan.prompts], dtype=np.int64)
        widths = ends - starts
        ids = np.zeros((len(plan.prompts), int(widths.max())), dtype=np.int64)
        for i, (seq, start, end) in enumerate(plan.prompts):
            ids[i, : end - start] = seq.prompt[start:end]
        started = time.perf_counter()
        logits = self._run(result.stats, first, ids, ends, widths[:, None] - 1)
        result.stats.prefill_s = time.perf_counter() - started
        result.stats.prefill_tokens = int(widths.sum())
        whole = [i for i, (seq, _, end) in enumerate(plan.prompts) if end == len(seq.prompt)]
        tokens = self._sample(result.stats, [plan.prompts[i][0] for i in whole], logits[whole, 0])
        result.prompt_tokens = dict(zip(whole, tokens, strict=True))
        if self._prefixes is not None:  # keep the whole prompts' blocks for later prompts
            for i in whole:
                self._prefixes.store(
                    plan.prompts[i][0].prompt, partial(self._cache.read, first + i)
                )

    def _execute(self, plan: _Plan) -> _Result:
        """Runs on the worker thread: ONNX Runtime, sampling and cache copies."""
        result = _Result()
        if plan.prompts:
            self._prefill(plan, result)
        if plan.rows:
            self._decode(plan.rows, result)
        return result

    def _proposals(self, seqs: list[_Sequence]) -> list[list[int]]:
        """Each row's proposed next tokens (prompt lookup), within the step's budget of
        extra positions; none in a batch wider than ``speculative_max_batch``."""
        cfg = self.config
        budget = cfg.speculative_max_extra_positions
        proposals: list[list[int]] = []
        for seq in seqs:
            params = seq.request.params
            # no proposals while replaying a resumed stream's tokens, or past max_tokens
            k, match = 0, None
            if budget > 0 and seq.sampler.position >= len(seq.replay):
                k = min(cfg.speculative_tokens, budget, params.max_tokens - seq.generated - 1)
            if k > 0:
                history = seq.history[: seq.history_len]
                match = lookup(history, cfg.speculative_ngram_min, cfg.speculative_ngram_max,
                               cfg.speculative_lookback)  # fmt: skip
            if match is not None:  # as many as pay for a match this long
                k = min(k, seq.draft.wanted(match.length))
            if match is None or k <= 0:
                proposals.append([])
                continue
            found = history[match.start : match.start + k].tolist()
            if found and seq.constraint is not None:  # cut what the grammar would refuse
                found = found[: seq.constraint.accepts(found)]
            budget -= len(found)
            proposals.append(found)
        return proposals

    def _decode(self, seqs: list[_Sequence], result: _Result) -> None:
        """One decode step of the running rows: each row's last token and, for a row with
        proposals, those as further positions in a call of its own (the fused attention
        kernel runs several new positions for one row only); the other rows together, in
        calls over runs of neighbouring slots. A row's cache keeps the positions of the
        tokens handed on: rejected proposals' keys/values stay beyond its length, scratch
        that the next step overwrites."""
        stats = result.stats
        rows = len(seqs)
        cfg = self.config
        speculate = cfg.speculative_tokens > 0 and rows <= cfg.speculative_max_batch
        proposals = self._proposals(seqs) if speculate else [[] for _ in seqs]
        row_logits: list[npt.NDArray[np.float32]] = []  # per row: [1 + proposals, vocab]
        start = 0
        while start < rows:
            if proposals[start]:
                end = start + 1
                ids = np.array([[seqs[start].last_token, *proposals[start]]], dtype=np.int64)
            else:  # the run of rows without proposals from here
                end = next((i for i in range(start, rows) if proposals[i]), rows)
                ids = np.array([[s.last_token] for s in seqs[start:end]], dtype=np.int64)
            width = int(ids.shape[1])
            lengths = self._cache.lengths[start:end] + width
            index = np.arange(width, dtype=np.int64)[None, :].repeat(end - start, axis=0)
            row_logits.extend(self._run(stats, start, ids, lengths, index))
            start = end
        t0 = time.perf_counter()
        result.row_tokens = [
            seq.verify(logits, proposal, self._eos)
            for seq, logits, proposal in zip(seqs, row_logits, proposals, strict=True)
        ]
        for i, (seq, proposal, tokens) in enumerate(
            zip(seqs, proposals, result.row_tokens, strict=True)
        ):
            if proposal:
                accepted = len(tokens) - 1
                seq.draft.update(len(proposal), accepted)
                stats.proposed_tokens += len(proposal)
                stats.accepted_tokens += accepted
                # the cache keeps the last token and the accepted proposals
                self._cache.lengths[i] -= len(proposal) - accepted
        stats.sample_s += time.perf_counter() - t0
        stats.batch_size = rows
        stats.decode_positions = rows + sum(len(p) for p in proposals)
        stats.decoded_tokens = sum(len(t) for t in result.row_tokens)

    def _emit(self, seq: _Sequence, token: int) -> bool:
        """Hand one sampled token to the sequence's consumer; True when it is finished."""
        params = seq.request.params
        seq.last_token = token
        seq.history[seq.history_len] = token
        seq.history_len += 1
        if seq.constraint_error:
            log.error("constrained decoding failed: %s", seq.constraint_error)
            self._finish(seq, EngineError("constrained decoding failed in the grammar engine"))
            return True
        if seq.replayed < len(seq.replay):  # already delivered: restore the text state only
            seq.replayed += 1
            seq.stops.feed(seq.detok.add(token))
            return False
        seq.generated += 1
        finish: FinishReason | None = None
        if token in self._eos:
            text = seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
            finish = "stop"
        else:
            text = seq.stops.feed(seq.detok.add(token))
            if seq.stops.stopped:
                finish = "stop"
            elif seq.constraint is not None and seq.constraint.finished:
                # the output is complete: end without sampling an end-of-turn token
                text += seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
                finish = "stop"
            elif seq.generated >= params.max_tokens:
                text += seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
                finish = "length"
        output = GenerationOutput(
            text=text,
            token_ids=(token,),
            finish_reason=finish,
            prompt_tokens=int(seq.prompt.shape[0]) + len(seq.replay),
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
            for i, (seq, tokens) in enumerate(zip(plan.rows, result.row_tokens, strict=True))
            if seq.cancelled or any(self._emit(seq, token) for token in tokens)
        ]
        if plan.reuse:
            for listener in self.listeners:
                listener.on_prefix_reused(plan.reuse)
        for i, (seq, _, end) in enumerate(plan.prompts):
            seq.prefilled = end
            token = result.prompt_tokens.get(i)
            if token is None:
                continue  # more chunks to go; it keeps its slot as the partial prompt
            self._prefilling.remove(seq)
            if seq is self._partial:
                self._partial = None
            slot = len(self._running)  # prompts' slots follow the running ones already
            self._running.append(seq)
            if seq.cancelled or self._emit(seq, token):
                finished.append(slot)
        self._remove_rows(finished)

    def _fail(self, plan: _Plan, error: AgentError) -> None:
        for seq in [*plan.rows, *(seq for seq, _, _ in plan.prompts)]:
            self._finish(seq, error)
        for seq, _, _ in plan.prompts:
            self._prefilling.remove(seq)
        self._running = []
        self._partial = None
        self._cache.clear()
        self._trim_when_idle = True
