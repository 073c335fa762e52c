"""A served text-generation model: tokenizer and chat template in front of an engine.

The tokenizer, chat template and grammar compiler (the light part) are there from the
start; the engine with its ONNX Runtime session (the heavy part) is either given loaded or
built on demand by ``build_engine`` when the agent's :class:`~agent.engine.residency.Residency`
loads the model, and released when it unloads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agent.engine.continuous_batcher import ContinuousBatcher
from agent.engine.interface import (
    BatcherListener,
    ChatMessage,
    EngineLoad,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
)
from agent.engine.supervisor import OnDead
from agent.engine.text_codec import TextCodec
from agent.errors import EngineError
from agent.structured.grammar import CompiledGrammar, GrammarCompiler
from agent.structured.spec import ConstraintSpec

if TYPE_CHECKING:
    from agent.engine.residency import Residency


class OnnxTextModel:
    def __init__(
        self,
        *,
        model_id: str,
        version: str,
        context_length: int,
        codec: TextCodec,
        engine: ContinuousBatcher | None = None,
        eos_token_ids: Sequence[int] = (),
        build_engine: Callable[[bool], ContinuousBatcher] | None = None,
        predicted_bytes: int = 0,
        reserve_bytes: int = 0,
        measured_bytes: int | None = None,
    ) -> None:
        if engine is None and build_engine is None:
            raise ValueError("an engine or a way to build one is needed")
        self._model_id = model_id
        self._version = version
        self._context_length = context_length
        self._codec = codec
        self._engine = engine
        self._build_engine = build_engine
        self._prefill_rate: float | None = None  # the last engine's (see attach_heavy)
        self._grammars = GrammarCompiler(
            codec.tokenizer_json, list(eos_token_ids), codec.vocab_size
        )
        # for the residency: the weights' footprint before a load (from the files) and the
        # caches the engine may grow to (key/value budget and prefix cache)
        self.predicted_bytes = predicted_bytes
        self.reserve_bytes = reserve_bytes
        # what building the engine given at construction measured (the C heap's bytes in
        # use across it; None: not measured), for the residency
        self.measured_bytes = measured_bytes
        self._listeners: list[BatcherListener] = []
        self._on_dead: OnDead | None = None
        self._started = False
        # set when the agent manages which models are loaded: requests then hold the
        # model loaded (loading it first when it is not) through it
        self.residency: Residency | None = None

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def version(self) -> str:
        return self._version

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def vocab_size(self) -> int:
        return self._codec.vocab_size

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> ContinuousBatcher:
        if self._engine is None:
            raise EngineError(f"model {self._model_id} is not loaded")
        return self._engine

    def add_listener(self, listener: BatcherListener) -> None:
        self._listeners.append(listener)
        if self._engine is not None:
            self._engine.listeners.append(listener)

    async def compile_constraint(self, spec: ConstraintSpec) -> CompiledGrammar:
        return await self._grammars.compile(spec)

    def load(self) -> EngineLoad:
        e = self._engine
        if e is None:
            return EngineLoad(0, 0, 0, 0.0)
        return EngineLoad(
            e.running,
            e.waiting,
            e.kv_used_tokens,
            e.kv_used_fraction,
            kv_allocated_bytes=e.kv_allocated_bytes,
            prefix_cache_bytes=e.prefix_cache_bytes,
        )

    def encode(self, text: str) -> list[int]:
        return self._codec.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(token_ids)

    @property
    def renders_tools(self) -> bool:
        return self._codec.renders_tools

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        return self._codec.apply_chat_template(messages, tools)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        residency = self.residency
        if residency is None:
            async for output in self.engine.generate(request):
                yield output
            return
        await residency.acquire(
            self._model_id,
            timeout_s=request.timeout_s,
            keep_alive_s=request.keep_alive_s,
            pin=request.pin_model,
        )
        try:
            async for output in self.engine.generate(request):
                yield output
        finally:
            residency.release(self._model_id)

    @property
    def dead_reason(self) -> str:
        return self._engine.dead_reason if self._engine is not None else ""

    async def start(self, on_dead: OnDead | None = None) -> None:
        self._on_dead = on_dead
        self._started = True
        if self._engine is not None:
            await self._engine.start(on_dead)

    async def close(self) -> None:
        self._started = False
        if self._engine is not None:  # kept: a request that still holds it gets "closed"
            await self._engine.close()
        self._grammars.close()

    # ---- the heavy part, for the residency ------------------------------------------------

    def busy(self) -> int:
        e = self._engine
        return 0 if e is None else e.running + e.waiting

    def build_heavy(self, *, warm_up: bool = True) -> object:
        """Blocking (the loader's thread): the session and its engine, with a token run
        through the session on this thread (``warm_up``) or not (then :meth:`warm_up`'s
        step is the session's first run)."""
        if self._build_engine is None:
            raise EngineError(f"model {self._model_id} cannot be loaded again here")
        return self._build_engine(warm_up)

    def warm_heavy(self, heavy: object) -> None:
        """Blocking: the session's first token, on the calling thread (a loader's)."""
        assert isinstance(heavy, ContinuousBatcher)
        heavy.warm_here()

    async def attach_heavy(self, heavy: object) -> None:
        assert isinstance(heavy, ContinuousBatcher)
        heavy.listeners.extend(self._listeners)
        if heavy.prefill_rate is None:  # a reload goes on from the last engine's measure
            heavy.prefill_rate = self._prefill_rate
        if self._started:
            await heavy.start(self._on_dead)
        self._engine = heavy

    async def warm_up(self) -> None:
        """One token from a one-token prompt, as a step of the engine: the first run
        pages in what loading did not (prepacking, the first step's buffers), so it is
        measured with the load. Where ``build_heavy`` ran a token through the session
        on the loader's thread (a load beside a serving model) this one costs a step
        (SmolLM2: 19 ms); without it the agent's resident set peaked 12-20 MiB higher in
        the next model's load (4 runs of the swap benchmark each way), so it stays."""
        engine = self._engine
        if engine is None or not self._started:
            return
        engine.listeners = []  # not a request: not in metrics
        rate = engine.prefill_rate  # nor in the prefill rate (a one-token prompt's is tiny)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=1)
            async for _ in engine.generate(GenerationRequest("warm-up", [0], params)):
                pass
        finally:
            engine.listeners = list(self._listeners)
            engine.prefill_rate = rate

    async def detach_heavy(
        self, *, trim: bool = True, free: bool = True
    ) -> Callable[[], None] | None:
        """Stop the engine and free its memory (on a worker thread: the event loop serves
        meanwhile). Returns once it is freed: a load measured across it would see a free
        still under way as a smaller footprint (a first try that let the next session
        build beside the free measured Qwen at 343 MiB instead of 465). ``trim=False``
        leaves trimming the C heap to the caller (the residency trims beside the next
        load). ``free=False``: returns once the engine has stopped, with the blocking call
        that frees its memory, for the caller to run (the residency runs it beside the
        build of a model whose footprint it knows already)."""
        engine, self._engine = self._engine, None
        if engine is None:
            return None
        self._prefill_rate = engine.prefill_rate or self._prefill_rate
        return await engine.close(trim=trim, free=free)
