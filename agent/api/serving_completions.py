"""``/v1/completions``: raw text (or token ids) into the engine, no chat template."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from agent.api.protocol import CompletionChoice, CompletionRequest, CompletionResponse
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
    check_constrained_fields,
    compile_constraint,
    constrained_request,
)
from agent.engine.interface import GenerationOutput
from agent.errors import InvalidRequestError, UnsupportedError
from agent.model_registry import served_name
from agent.structured.spec import parse_response_format


class CompletionService(GenerationService):
    async def prepare(self, req: CompletionRequest, options: RequestOptions) -> PreparedGeneration:
        model = self._registry.text_model(req.model)
        refuse_unsupported(req)
        if req.echo:
            raise UnsupportedError("echo is not supported", param="echo")
        if req.suffix:
            raise UnsupportedError("suffix is not supported", param="suffix")
        if req.best_of not in (None, 1):
            raise UnsupportedError("only best_of=1 is supported", param="best_of")
        if req.logprobs:
            raise UnsupportedError("logprobs are not supported", param="logprobs")
        spec = parse_response_format(req.response_format)
        check_constrained_fields(req, spec)
        prompt = req.prompt
        if isinstance(prompt, str):
            text = prompt
            prompt_ids = await encode_text(lambda: model.encode(text), len(text))
        elif all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise UnsupportedError("only one prompt per request is supported", param="prompt")
            first = str(prompt[0])
            prompt_ids = await encode_text(lambda: model.encode(first), len(first))
        else:
            prompt_ids = [int(t) for t in prompt]
            check_token_ids(prompt_ids, model.vocab_size, "prompt")
            if options.moderation is not None:  # the key's input check, on what they say
                await options.moderation.check_input([("prompt", model.decode(prompt_ids))])
        if not prompt_ids:
            raise InvalidRequestError("prompt is empty", param="prompt")
        if req.continue_token_ids:
            check_token_ids(req.continue_token_ids, model.vocab_size, "continue_token_ids")
        compiled = await compile_constraint(model, spec, req.continue_token_ids)
        params = sampling_params(
            req,
            max_tokens=req.max_tokens,
            max_tokens_param="max_tokens",
            prompt_param="prompt",
            prompt_tokens=len(prompt_ids),
            context_length=model.context_length,
            limits=self._limits,
        )
        request = generation_request("cmpl", prompt_ids, params, req, options)
        prepared = self._runner.prepare(
            model, "completions", constrained_request(request, compiled), req, options
        )
        text_prompt = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            text_prompt = prompt[0]
        prepared = await self._runner.semantic_lookup(
            prepared,
            "completions",
            req,
            options,
            prompt=None if req.continue_token_ids else text_prompt,
        )
        return dataclasses.replace(prepared, constraint=spec)

    def _response(
        self,
        prepared: PreparedGeneration,
        choices: list[CompletionChoice],
        last: GenerationOutput | None,
        with_usage: bool,
    ) -> CompletionResponse:
        return CompletionResponse(
            id=prepared.request.request_id,
            created=prepared.created,
            model=served_name(prepared.model),
            system_fingerprint=prepared.model.version,
            choices=choices,
            usage=usage_of(last, prompt_tokens_of(prepared.request)) if with_usage else None,
        )

    async def complete(self, prepared: PreparedGeneration) -> CompletionResponse:
        text, ids, last = await self._collect(prepared)
        finish = last.finish_reason if last else "length"
        token_ids = ids if prepared.return_token_ids else None
        choice = CompletionChoice(index=0, text=text, finish_reason=finish, token_ids=token_ids)
        return self._response(prepared, [choice], last, with_usage=True)

    async def stream(self, prepared: PreparedGeneration) -> AsyncIterator[CompletionResponse]:
        last: GenerationOutput | None = None
        async for output in self._runner.run(prepared):
            last = output
            with_ids = prepared.return_token_ids and bool(output.token_ids)
            if output.text or output.finish_reason or with_ids:
                choice = CompletionChoice(
                    index=0,
                    text=output.text,
                    finish_reason=output.finish_reason,
                    token_ids=list(output.token_ids) if prepared.return_token_ids else None,
                )
                yield self._response(prepared, [choice], None, with_usage=False)
        if prepared.include_usage:
            yield self._response(prepared, [], last, with_usage=True)
