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
    check_token_ids,
    encode_text,
    generation_request,
    prompt_tokens_of,
    refuse_unsupported,
    sampling_params,
    usage_of,
)
from agent.engine.interface import ChatMessage, FinishReason, GenerationOutput
from agent.errors import InvalidRequestError, UnsupportedError
from agent.model_registry import served_name


class ChatService(GenerationService):
    async def prepare(
        self, req: ChatCompletionRequest, options: RequestOptions
    ) -> PreparedGeneration:
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
        prompt_ids = await encode_text(
            lambda: model.encode(model.apply_chat_template(messages)),
            sum(len(m.content) for m in messages),
        )
        if req.continue_token_ids:
            check_token_ids(req.continue_token_ids, model.vocab_size, "continue_token_ids")
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
            options,
        )

    async def complete(self, prepared: PreparedGeneration) -> ChatCompletionResponse:
        text, ids, last = await self._collect(prepared)
        prompt_tokens = prompt_tokens_of(prepared.request)
        return ChatCompletionResponse(
            id=prepared.request.request_id,
            created=prepared.created,
            model=served_name(prepared.model),
            system_fingerprint=prepared.model.version,
            choices=[
                ChatChoice(
                    index=0,
                    message=ChatMessageOut(content=text),
                    finish_reason=last.finish_reason if last else "length",
                    token_ids=ids if prepared.return_token_ids else None,
                )
            ],
            usage=usage_of(last, prompt_tokens),
        )

    async def stream(self, prepared: PreparedGeneration) -> AsyncIterator[ChatCompletionChunk]:
        with_ids = prepared.return_token_ids

        def chunk(
            delta: ChatDelta, finish: FinishReason | None = None, ids: list[int] | None = None
        ) -> ChatCompletionChunk:
            choice = ChatChunkChoice(index=0, delta=delta, finish_reason=finish, token_ids=ids)
            return ChatCompletionChunk(
                id=prepared.request.request_id,
                created=prepared.created,
                model=served_name(prepared.model),
                system_fingerprint=prepared.model.version,
                choices=[choice],
            )

        def content(output: GenerationOutput) -> ChatCompletionChunk | None:
            # with token ids, a token whose text is held back (a possible stop string, a
            # character not complete yet) still gets its chunk: the client counts its id
            if with_ids and output.token_ids:
                return chunk(ChatDelta(content=output.text), ids=list(output.token_ids))
            return chunk(ChatDelta(content=output.text)) if output.text else None

        outputs = self._runner.run(prepared)
        # the first output before the role chunk: admission errors (queue full, ...) then
        # come before the first event, so they still get a real status code
        last = await anext(outputs, None)
        yield chunk(ChatDelta(role="assistant", content=""), ids=[] if with_ids else None)
        if last is not None:
            if (event := content(last)) is not None:
                yield event
            async for output in outputs:
                last = output
                if (event := content(output)) is not None:
                    yield event
        yield chunk(
            ChatDelta(), last.finish_reason if last else "length", ids=[] if with_ids else None
        )
        if prepared.include_usage:
            yield ChatCompletionChunk(
                id=prepared.request.request_id,
                created=prepared.created,
                model=served_name(prepared.model),
                system_fingerprint=prepared.model.version,
                choices=[],
                usage=usage_of(last, prompt_tokens_of(prepared.request)),
            )
