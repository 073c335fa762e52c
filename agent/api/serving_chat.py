"""``/v1/chat/completions``: messages through the chat template into the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

from agent.api.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
)
from agent.api.serving_common import (
    GenerationService,
    PreparedGeneration,
    RequestOptions,
    generation_request,
    refuse_unsupported,
    sampling_params,
    usage_of,
)
from agent.engine.interface import ChatMessage, FinishReason
from agent.errors import InvalidRequestError, UnsupportedError


class ChatService(GenerationService):
    def prepare(self, req: ChatCompletionRequest, options: RequestOptions) -> PreparedGeneration:
        model = self._registry.text_model(req.model)
        refuse_unsupported(req)
        if req.logprobs or req.top_logprobs:
            raise UnsupportedError("logprobs are not supported", param="logprobs")
        if req.tools or req.functions or req.tool_choice not in (None, "none"):
            raise UnsupportedError("tool calling is not supported", param="tools")
        if req.response_format is not None and req.response_format.type != "text":
            raise UnsupportedError(
                "only response_format type 'text' is supported", param="response_format"
            )
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            raise InvalidRequestError(
                "give max_tokens or max_completion_tokens, not both", param="max_tokens"
            )
        messages = []
        for i, m in enumerate(req.messages):
            if m.role == "tool":
                raise UnsupportedError(
                    "tool messages are not supported", param=f"messages.{i}.role"
                )
            role = "system" if m.role == "developer" else m.role
            messages.append(ChatMessage(role=role, content=m.text()))
        prompt_ids = model.encode(model.apply_chat_template(messages))
        max_tokens_param = "max_tokens" if req.max_tokens is not None else "max_completion_tokens"
        params = sampling_params(
            req,
            max_tokens=req.max_tokens if req.max_tokens is not None else req.max_completion_tokens,
            max_tokens_param=max_tokens_param,
            prompt_param="messages",
            prompt_tokens=len(prompt_ids),
            context_length=model.context_length,
            limits=self._limits,
        )
        return self._runner.prepare(
            model,
            "chat",
            generation_request("chatcmpl", prompt_ids, params, req, options),
            req,
        )

    async def complete(self, prepared: PreparedGeneration) -> ChatCompletionResponse:
        text, last = await self._collect(prepared)
        prompt_tokens = len(prepared.request.prompt_token_ids)
        return ChatCompletionResponse(
            id=prepared.request.request_id,
            created=prepared.created,
            model=prepared.model.model_id,
            system_fingerprint=prepared.model.version,
            choices=[
                ChatChoice(
                    index=0,
                    message=ChatMessageOut(content=text),
                    finish_reason=last.finish_reason if last else "length",
                )
            ],
            usage=usage_of(last, prompt_tokens),
        )

    async def stream(self, prepared: PreparedGeneration) -> AsyncIterator[ChatCompletionChunk]:
        def chunk(delta: ChatDelta, finish: FinishReason | None = None) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=prepared.request.request_id,
                created=prepared.created,
                model=prepared.model.model_id,
                system_fingerprint=prepared.model.version,
                choices=[ChatChunkChoice(index=0, delta=delta, finish_reason=finish)],
            )

        outputs = self._runner.run(prepared)
        # the first output before the role chunk: admission errors (queue full, ...) then
        # come before the first event, so they still get a real status code
        last = await anext(outputs, None)
        yield chunk(ChatDelta(role="assistant", content=""))
        if last is not None:
            if last.text:
                yield chunk(ChatDelta(content=last.text))
            async for output in outputs:
                last = output
                if output.text:
                    yield chunk(ChatDelta(content=output.text))
        yield chunk(ChatDelta(), last.finish_reason if last else "length")
        if prepared.include_usage:
            yield ChatCompletionChunk(
                id=prepared.request.request_id,
                created=prepared.created,
                model=prepared.model.model_id,
                system_fingerprint=prepared.model.version,
                choices=[],
                usage=usage_of(last, len(prepared.request.prompt_token_ids)),
            )
