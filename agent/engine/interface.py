"""The engine interface the HTTP layer talks to, and its plain-data inputs and outputs.

The HTTP layer never sees an ``onnxruntime.InferenceSession``: it tokenizes through
:class:`TextModel`, submits a :class:`GenerationRequest`, and reads
:class:`GenerationOutput` increments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from agent.structured.grammar import CompiledGrammar
    from agent.structured.spec import ConstraintSpec

# "content_filter": the output check cut it (agent/moderation/gate.py), never the engine
FinishReason = Literal["stop", "length", "content_filter"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 disables
    seed: int | None = None  # same seed and prompt give the same output
    max_tokens: int = 256  # generated tokens at most (end-of-turn token included)
    stop: tuple[str, ...] = ()  # text stops; the stop string itself is not returned
    min_tokens: int = 0  # end-of-turn tokens are not sampled before this many tokens

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class TokenConstraint(Protocol):
    """One sequence's output constraint (a grammar state); used on the batcher's thread."""

    def apply(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The logits with every token the constraint refuses next at minus infinity."""
        ...

    def advance(self, token: int) -> bool:
        """Consume a chosen (or replayed) token; False when the constraint refuses it."""
        ...

    def accepts(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the constraint admits from here (nothing is consumed)."""
        ...

    @property
    def finished(self) -> bool:
        """Nothing more is admitted: the output is complete."""
        ...

    @property
    def error(self) -> str: ...


class OutputConstraint(Protocol):
    """A compiled constraint (agent.structured's CompiledGrammar): one matcher per sequence."""

    @property
    def key(self) -> str: ...

    def new_matcher(self) -> TokenConstraint: ...


Priority = Literal["high", "normal", "low"]
PRIORITY_RANK: dict[str, int] = {"high": 0, "normal": 1, "low": 2}  # admitted in this order


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str  # for logs and cancellation; never the prompt
    prompt_token_ids: Sequence[int] = field(repr=False)  # already templated and encoded
    params: SamplingParams = SamplingParams()
    priority: Priority = "normal"  # higher priority is admitted first
    timeout_s: float | None = None  # whole request, queue wait included; None: engine default
    # a resumed stream: completion tokens already delivered elsewhere. The engine runs them
    # one per decode step after the prompt (the path an uninterrupted run took), sends no
    # output for them, and generates from there; params.max_tokens counts the tokens after
    # them, params.min_tokens and seeded draws count positions from the completion's start
    continuation_token_ids: Sequence[int] = field(default=(), repr=False)
    # constrained decoding (response_format, tools): each step's logits are masked to what
    # the constraint admits, continuation tokens advance it too, and the sequence ends
    # ("stop") as soon as it admits nothing more
    constraint: OutputConstraint | None = field(default=None, repr=False)
    # how long the model stays loaded once idle after this request (Ollama's keep_alive,
    # checked and capped by the caller); a request only ever extends it. None: the default
    keep_alive_s: float | None = None
    # pin the model (a keep_alive < 0 from a key allowed to pin models): never unloaded
    # for room or idleness until an operator unloads it or the agent restarts
    pin_model: bool = False

    def __repr__(self) -> str:  # hide the payload from logs
        return (
            f"GenerationRequest(request_id={self.request_id!r}, "
            f"prompt_tokens={len(self.prompt_token_ids)}, "
            f"continuation_tokens={len(self.continuation_token_ids)}, params={self.params!r}, "
            f"constrained={self.constraint is not None}, "
            f"priority={self.priority!r}, timeout_s={self.timeout_s!r})"
        )


@dataclass(frozen=True)
class GenerationOutput:
    text: str  # new text since the previous output (stop strings removed)
    token_ids: tuple[int, ...]  # tokens sampled since the previous output
    finish_reason: FinishReason | None  # set on the last output only
    prompt_tokens: int  # tokens in the prompt (a resumed stream's continuation included)
    completion_tokens: int  # tokens generated so far, this output's included (not continued ones)

    def __repr__(self) -> str:  # hide the payload from logs
        return (
            f"GenerationOutput(chars={len(self.text)}, tokens={len(self.token_ids)}, "
            f"finish_reason={self.finish_reason!r}, completion_tokens={self.completion_tokens})"
        )


@dataclass(frozen=True)
class EngineLoad:
    running: int  # sequences in the batch or being prefilled
    waiting: int  # sequences queued
    kv_used_tokens: int  # key/value cache allocated (slots padded to the longest)
    kv_used_fraction: float  # of the budget promised to admitted sequences
    kv_allocated_bytes: int = 0  # the slots' key/value buffers now
    prefix_cache_bytes: int = 0  # keys/values the prefix cache holds (kept when idle)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str = field(repr=False)


class TextModel(Protocol):
    """A served text-generation model: its tokenizer, its limits and its engine."""

    @property
    def model_id(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template describes offered tools itself."""
        ...

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None = None
    ) -> str: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]: ...

    async def compile_constraint(self, spec: ConstraintSpec) -> CompiledGrammar:
        """The spec's grammar for this model's vocabulary (compiled off the event loop and
        cached); InvalidSchemaError (400) when it cannot be compiled."""
        ...

    def load(self) -> EngineLoad: ...

    def add_listener(self, listener: BatcherListener) -> None: ...

    async def start(self, on_dead: Callable[[str], None] | None = None) -> None:
        """Starts the engine's loop; the owner awaits :meth:`close`. ``on_dead`` is called
        once, with the reason, if the engine fails past its restart policy."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: list[list[float]] = field(repr=False)  # one L2-normalised vector per input
    prompt_tokens: int  # tokens across all inputs, padding excluded


class EmbeddingModel(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def max_input_tokens(self) -> int: ...

    async def embed(
        self, inputs: Sequence[str | Sequence[int]], *, wait_for_company: bool = True
    ) -> EmbeddingResult:
        """``wait_for_company`` False: run without waiting the batcher's queue delay for
        other inputs (a lookup on a request's critical path)."""
        ...

    async def start(self, on_dead: Callable[[str], None] | None = None) -> None: ...

    async def close(self) -> None: ...


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
    decoded_tokens: int = 0  # tokens the decode rows handed on (accepted proposals included)
    decode_positions: int = 0  # positions the decode ran: one per row, plus the proposals
    proposed_tokens: int = 0  # prompt-lookup proposals verified this step
    accepted_tokens: int = 0  # of them, taken (the model chose the same token)
    ort_s: float = 0.0  # time inside ONNX Runtime
    prefill_s: float = 0.0  # of it, the prompt tokens' call
    sample_s: float = 0.0  # time choosing tokens
    step_s: float = 0.0  # whole step, scheduling included
    # a proposed position's measured cost, as a share of a one-position step (0: not
    # measured this step: speculation off, or several sequences decoding)
    position_cost: float = 0.0
