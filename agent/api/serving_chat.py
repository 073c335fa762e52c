"""``/v1/chat/completions``: messages through the chat template into the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from agent.api.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
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
from agent.api.serving_structured import (
    ChatDeltaShaper,
    chat_message_out,
    chat_messages,
    check_constrained_fields,
    compile_constraint,
    constrained_request,
    tools_for_template,
)
from agent.engine.interface import GenerationOutput
from agent.errors import InvalidRequestError, UnsupportedError
from agent.model_registry import served_name
from agent.structured.spec import parse_constraint


class ChatService(GenerationService):
    async def prepare(
        self, req: ChatCompletionRequest, options: RequestOptions
    ) -> PreparedGeneration:
        model = self._registry.text_model(req.model)
        refuse_unsupported(req)
        if req.logprobs or req.top_logprobs:
            raise UnsupportedError("logprobs are not supported", param="logprobs")
        spec = parse_constraint(
            response_format=req.response_format,
            tools=req.tools,
            tool_choice=req.tool_choice,
            functions=req.functions,
        )
        check_constrained_fields(req, spec)
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            raise InvalidRequestError(
                "give max_tokens or max_completion_tokens, not both", param="max_tokens"
            )
        native = model.renders_tools
        messages = chat_messages(req.messages, spec, template_tools=native)
        tools = tools_for_template(spec) if native else None
        prompt_ids = await encode_text(
            lambda: model.encode(model.apply_chat_template(messages, tools)),
            sum(len(m.content) for m in messages),
        )
        if req.continue_token_ids:
            check_token_ids(req.continue_token_ids, model.vocab_size, "continue_token_ids")
        compiled = await compile_constraint(model, spec, req.continue_token_ids)
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
        request = generation_request("chatcmpl", prompt_ids, params, req, options)
        prepared = self._runner.prepare(
            model, "chat", constrained_request(request, compiled), req, options
        )
        last = req.messages[-1]
        prompt = None
        if last.role == "user" and last.content is not None and not req.continue_token_ids:
            prompt = last.text()
        prepared = await self._runner.semantic_lookup(
            prepared,
            "chat",
            req,
            options,
            prompt=prompt,
            earlier=[m.model_dump(mode="json") for m in req.messages[:-1]],
            extra={"tools": list(req.tools or ())},
        )
        continued = ""
        if spec is not None and spec.calls_tools and req.continue_token_ids:
            continued = model.decode(req.continue_token_ids)  # a call is read whole
        return dataclasses.replace(prepared, constraint=spec, continued_text=continued)

    async def complete(self, prepared: PreparedGeneration) -> ChatCompletionResponse:
        text, ids, last = await self._collect(prepared)
        prompt_tokens = prompt_tokens_of(prepared.request)
        message, finish = chat_message_out(
            prepared.constraint,
            text,
            (last.finish_reason if last else None) or "length",
            continued=prepared.continued_text,
        )
        return ChatCompletionResponse(
            id=prepared.request.request_id,
            created=prepared.created,
            model=served_name(prepared.model),
            system_fingerprint=prepared.model.version,
            choices=[
                ChatChoice(
                    index=0,
                    message=message,
                    finish_reason=finish,  # type: ignore[arg-type]
                    token_ids=ids if prepared.return_token_ids else None,
                )
            ],
            usage=usage_of(last, prompt_tokens),
        )

    async def stream(self, prepared: PreparedGeneration) -> AsyncIterator[ChatCompletionChunk]:
        with_ids = prepared.return_token_ids

        shaper = ChatDeltaShaper(prepared.constraint, continued=prepared.continued_text)

        def chunk(
            delta: ChatDelta, finish: str | None = None, ids: list[int] | None = None
        ) -> ChatCompletionChunk:
            choice = ChatChunkChoice(
                index=0,
                delta=delta,
                finish_reason=finish,  # type: ignore[arg-type]
                token_ids=ids,
            )
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
            delta = shaper.feed(output.text)
            if with_ids and output.token_ids:
                return chunk(delta or ChatDelta(content=""), ids=list(output.token_ids))
            return chunk(delta) if delta is not None else None

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
        held, finish = shaper.finish(last.finish_reason if last else "length")
        if held is not None:
            yield chunk(held, ids=[] if with_ids else None)
        yield chunk(ChatDelta(), finish, ids=[] if with_ids else None)
        if prepared.include_usage:
            yield ChatCompletionChunk(
                id=prepared.request.request_id,
                created=prepared.created,
                model=served_name(prepared.model),
                system_fingerprint=prepared.model.version,
                choices=[],
                usage=usage_of(last, prompt_tokens_of(prepared.request)),
            )
