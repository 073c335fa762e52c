"""A served text-generation model: tokenizer and chat template in front of an engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from agent.engine.continuous_batcher import ContinuousBatcher
from agent.engine.interface import (
    BatcherListener,
    ChatMessage,
    EngineLoad,
    GenerationOutput,
    GenerationRequest,
)
from agent.engine.supervisor import OnDead
from agent.engine.text_codec import TextCodec
from agent.structured.grammar import CompiledGrammar, GrammarCompiler
from agent.structured.spec import ConstraintSpec


class OnnxTextModel:
    def __init__(
        self,
        *,
        model_id: str,
        version: str,
        context_length: int,
        codec: TextCodec,
        engine: ContinuousBatcher,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self._model_id = model_id
        self._version = version
        self._context_length = context_length
        self._codec = codec
        self._engine = engine
        self._grammars = GrammarCompiler(
            codec.tokenizer_json(), list(eos_token_ids), codec.vocab_size
        )

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
    def engine(self) -> ContinuousBatcher:
        return self._engine

    def add_listener(self, listener: BatcherListener) -> None:
        self._engine.listeners.append(listener)

    async def compile_constraint(self, spec: ConstraintSpec) -> CompiledGrammar:
        return await self._grammars.compile(spec)

    def load(self) -> EngineLoad:
        e = self._engine
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

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._engine.generate(request)

    @property
    def dead_reason(self) -> str:
        return self._engine.dead_reason

    async def start(self, on_dead: OnDead | None = None) -> None:
        await self._engine.start(on_dead)

    async def close(self) -> None:
        await self._engine.close()
        self._grammars.close()
