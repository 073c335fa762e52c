"""What chat and text completions share: limits, sampling parameters, timing, metrics."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.api.protocol import SamplingFields, Usage
from agent.auth.keys import KeyGrant, keep_alive_for
from agent.engine.interface import (
    PRIORITY_RANK,
    GenerationOutput,
    GenerationRequest,
    Priority,
    SamplingParams,
    TextModel,
)
from agent.engine.residency import parse_keep_alive
from agent.errors import ContextLengthError, InvalidRequestError, UnsupportedError
from agent.metrics import AgentMetrics
from agent.model_registry import ModelRegistry
from agent.moderation.gate import RequestModeration
from agent.response_cache import CachedGeneration, ResponseCache, cache_key
from agent.semantic_responder import SemanticProbe, SemanticResponder
from agent.structured.spec import ConstraintSpec


@dataclass(slots=True)
class RequestUsage:
    """What one API request generated, for its per-request record (agent/request_log.py).

    The record hook (``errors_and_metrics`` in agent/api/app.py) makes one per request,
    leaves it on the request (``USAGE``, an aiohttp request key) and in the context
    (:data:`CURRENT_USAGE`), where :class:`GenerationRunner` fills it in as tokens come:
    streamed or not, cache hit or not, finished or cut off by the client. Counts only,
    never any text.
    """

    model: str = ""
    version: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: ``time.perf_counter()`` when the first output arrived (None: none did).
    first_token_at: float | None = None


#: The running request's usage sink (None outside an API request, e.g. in tests that call
#: the services directly). A context variable, so the runner needs no request in hand;
#: the sink is a mutable object, so tasks spawned with a copy of the context fill it too.
CURRENT_USAGE: contextvars.ContextVar[RequestUsage | None] = contextvars.ContextVar(
    "edgefleet_request_usage", default=None
)


@dataclass(frozen=True)
class RequestOptions:
    """Per-request options: scheduling from headers (``X-Priority``, ``X-Request-Timeout``)
    and the request's API key (None when keys are off)."""

    priority: Priority | None = None  # None: the body's, else "normal"
    timeout_s: float | None = None  # None: the engine's default
    grant: KeyGrant | None = None  # the key's scopes, rate limits and usage
    # the agent's cap on a request's keep_alive (residency.max_request_keep_alive_s); None:
    # left to the residency, which caps it the same
    max_keep_alive_s: float | None = None
    # the request's content checks (agent/moderation/gate.py); None: none to make
    moderation: RequestModeration | None = None


def request_options(
    priority: str | None,
    timeout: str | None,
    *,
    grant: KeyGrant | None = None,
    max_timeout_s: float | None = None,
    max_keep_alive_s: float | None = None,
) -> RequestOptions:
    """Validate the headers; a timeout above ``max_timeout_s`` is lowered to it."""
    if priority is not None and priority not in PRIORITY_RANK:
        raise InvalidRequestError(
            f"X-Priority must be high, normal or low, got {priority!r}", param="X-Priority"
        )
    timeout_s = None
    if timeout is not None:
        try:
            timeout_s = float(timeout)
        except ValueError:
            timeout_s = -1.0
        if not 0 < timeout_s <= 3600:
            raise InvalidRequestError(
                f"X-Request-Timeout must be seconds in (0, 3600], got {timeout!r}",
                param="X-Request-Timeout",
            )
    if timeout_s is not None and max_timeout_s is not None:
        timeout_s = min(timeout_s, max_timeout_s)
    return RequestOptions(
        priority=priority,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        grant=grant,
        max_keep_alive_s=max_keep_alive_s,
    )


def generation_request(
    prefix: str,
    prompt_ids: list[int],
    params: SamplingParams,
    body: SamplingFields,
    options: RequestOptions,
) -> GenerationRequest:
    """The engine's request; with an API key, its priority is clamped to the key's ceiling
    and its completion length to the key's cap (asking for more is a 400). A ``keep_alive``
    is capped by the key's and the agent's caps; a negative one pins the model, for a key
    allowed to pin models only (else, and always without keys, a 400)."""
    priority = options.priority or body.priority or "normal"
    grant = options.grant
    if grant is not None:
        priority = grant.clamp_priority(priority)  # type: ignore[assignment]
        requested = body.max_tokens
        param = "max_tokens"
        if requested is None and getattr(body, "max_completion_tokens", None) is not None:
            requested, param = body.max_completion_tokens, "max_completion_tokens"  # type: ignore[attr-defined]
        cap = grant.max_tokens(requested, param)
        if cap is not None and params.max_tokens > cap:
            continued = len(body.continue_token_ids or ())
            params = dataclasses.replace(
                params, max_tokens=cap, min_tokens=min(params.min_tokens, continued + cap)
            )
    keep_alive_s, pin_model = None, False
    if body.keep_alive is not None:
        wanted = parse_keep_alive(body.keep_alive)
        applied = (
            keep_alive_for(None, wanted, options.max_keep_alive_s)
            if grant is None
            else grant.keep_alive(wanted, options.max_keep_alive_s)
        )
        keep_alive_s, pin_model = (None, True) if applied.pin else (applied.seconds, False)
    return GenerationRequest(
        new_request_id(prefix),
        prompt_ids,
        params,
        priority=priority,
        timeout_s=options.timeout_s,
        continuation_token_ids=tuple(body.continue_token_ids or ()),
        keep_alive_s=keep_alive_s,
        pin_model=pin_model,
    )


# Text longer than this (characters) is tokenized on a worker thread: a 1 MB prompt takes
# about a second to tokenize, which would stall every other request on the event loop.
OFF_LOOP_CHARS = 4096


async def encode_text(encode: Callable[[], list[int]], chars: int) -> list[int]:
    """``encode()``'s token ids, computed off the event loop when the text is long."""
    if chars <= OFF_LOOP_CHARS:
        return encode()
    return await asyncio.to_thread(encode)


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """Token ids from a request must lie in the model's vocabulary."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"token id {bad} is outside the vocabulary [0, {vocab_size})", param=param
        )


@dataclass(frozen=True)
class GenerationLimits:
    default_max_tokens: int = 256  # completion length when the request names none


def refuse_unsupported(req: SamplingFields) -> None:
    if req.n != 1:
        raise UnsupportedError("only n=1 is supported", param="n")
    if req.presence_penalty != 0.0:
        raise UnsupportedError("presence_penalty is not supported", param="presence_penalty")
    if req.frequency_penalty != 0.0:
        raise UnsupportedError("frequency_penalty is not supported", param="frequency_penalty")
    if req.logit_bias:
        raise UnsupportedError("logit_bias is not supported", param="logit_bias")


def sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    max_tokens_param: str,
    prompt_param: str,
    prompt_tokens: int,
    context_length: int,
    limits: GenerationLimits,
) -> SamplingParams:
    context = context_length  # the model's, already capped at engine.max_context_tokens
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequestError(
            f"{max_tokens_param} must be at least 1, got {max_tokens}", param=max_tokens_param
        )
    if prompt_tokens >= context:
        raise ContextLengthError(
            f"This model's maximum context length is {context} tokens. However, your prompt "
            f"has {prompt_tokens} tokens, which leaves no room for a completion.",
            param=prompt_param,
        )
    continued = len(req.continue_token_ids or ())
    if prompt_tokens + continued >= context:
        raise ContextLengthError(
            f"This model's maximum context length is {context} tokens. However, your prompt "
            f"has {prompt_tokens} tokens and continue_token_ids {continued}, which leaves no "
            "room for a completion.",
            param="continue_token_ids",
        )
    prompt_tokens += continued  # from here on, what the engine holds before generating
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, context - prompt_tokens)
    elif prompt_tokens + max_tokens > context:
        raise ContextLengthError(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
            f"for the completion). Reduce the prompt or {max_tokens_param}.",
            param=max_tokens_param,
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        max_tokens=max_tokens,
        stop=stop,
        # min_tokens counts from the completion's start, continued tokens included
        min_tokens=min(req.min_tokens, continued + max_tokens),
    )


def cache_fields(request: GenerationRequest) -> dict[str, Any]:
    """Everything about a request that changes its output, for the response cache key.

    The model id and exact version are added by :func:`cache_key`. Every field of
    :class:`SamplingParams` is included, so a parameter added there is keyed at once. Not
    included: what only changes how the same output is written out (stream,
    stream_options, return_token_ids: a cached entry keeps the token ids), scheduling
    (priority, X-Request-Timeout) and ``user``.
    """
    return {
        "prompt": list(request.prompt_token_ids),
        "continuation": list(request.continuation_token_ids),
        "params": dataclasses.asdict(request.params),
        # response_format, tools and tool_choice (tools are in the prompt too)
        "constraint": request.constraint.key if request.constraint is not None else None,
    }


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class PreparedGeneration:
    model: TextModel
    request: GenerationRequest
    stream: bool
    include_usage: bool
    created: int
    return_token_ids: bool = False  # choices carry their token ids (the request's extension)
    cache_key: bytes | None = None  # set when the finished result may be cached
    cached: CachedGeneration | None = None  # a cache hit: the engine is not used
    grant: KeyGrant | None = None  # the request's API key (usage is counted there)
    charged_tokens: int = 0  # charged to the key's tokens/min window up front
    # response_format / tools / tool_choice, parsed (None: free text). The overflow path
    # sends a constrained request only to targets that support constraints and checks what
    # comes back with agent.structured.validate_constrained_output(constraint, text)
    constraint: ConstraintSpec | None = None
    continued_text: str = ""  # a resumed tool-calling stream: the text already delivered
    # the output check (None: none); a cut or flagged output is never cached
    moderation: RequestModeration | None = None
    # where the finished answer goes in the semantic cache (None: it is not kept there)
    semantic: SemanticProbe | None = None
    # a semantic hit: the cosine of this prompt and the one that made the entry
    similarity: float | None = None

    @property
    def constrained(self) -> bool:
        """The output must follow a response_format or tool-call grammar."""
        return self.constraint is not None

    @property
    def cache_status(self) -> str:
        """``X-Edgefleet-Cache`` header value: hit, semantic-hit, miss or bypass."""
        if self.cached is not None:
            return "hit" if self.similarity is None else "semantic-hit"
        return "miss" if self.cache_key is not None else "bypass"


def prompt_tokens_of(request: GenerationRequest) -> int:
    """Usage's prompt_tokens: the prompt and, for a resumed stream, the continued ids."""
    return len(request.prompt_token_ids) + len(request.continuation_token_ids)


def usage_of(output: GenerationOutput | None, prompt_tokens: int) -> Usage:
    completion = output.completion_tokens if output else 0
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
    )


class GenerationRunner:
    """Runs prepared generations: response cache first, then the engine, with metrics."""

    def __init__(
        self,
        metrics: AgentMetrics,
        cache: ResponseCache | None,
        semantic: SemanticResponder | None = None,
    ) -> None:
        self._metrics = metrics
        self._cache = cache
        self._semantic = semantic

    def prepare(
        self,
        model: TextModel,
        endpoint: str,
        request: GenerationRequest,
        body: SamplingFields,
        options: RequestOptions | None = None,
    ) -> PreparedGeneration:
        """Look the request up in the response cache and charge its key's tokens/min.

        Cache entries are per API key (the key id is part of the cache key), so a hit never
        tells one key what another asked. A key's tokens/min window is charged the prompt
        plus the most completion tokens up front (429 when it cannot pay); what the
        request did not use is given back when it ends.
        """
        params = request.params
        grant = options.grant if options is not None else None
        charged = 0
        if grant is not None:
            charged = prompt_tokens_of(request) + params.max_tokens
            grant.charge_tokens(charged)
        wanted = body.cache if body.cache is not None else (
            params.temperature == 0.0 or params.seed is not None
        )  # fmt: skip
        key = cached = None
        moderation = options.moderation if options is not None else None
        if moderation is not None and not moderation.checks_output:
            moderation = None
        if self._cache is not None and wanted:
            key_id = "" if grant is None else grant.key_id  # entries are per API key
            fields = cache_fields(request)
            if moderation is not None:  # checked under this policy by these heads
                fields["moderation"] = moderation.cache_tag()
            key = cache_key(model.model_id, model.version, endpoint, fields, key_id)
            cached = self._cache.get(key)
            (self._metrics.cache_hits if cached else self._metrics.cache_misses).inc()
        return PreparedGeneration(
            model=model,
            request=request,
            stream=body.stream,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            return_token_ids=body.return_token_ids,
            created=int(time.time()),
            cache_key=key,
            cached=cached,
            grant=grant,
            charged_tokens=charged,
            moderation=moderation,
        )

    async def semantic_lookup(
        self,
        prepared: PreparedGeneration,
        endpoint: str,
        body: SamplingFields,
        options: RequestOptions,
        *,
        prompt: str | None,
        earlier: Sequence[Any] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> PreparedGeneration:
        """After an exact-cache miss, the semantic cache (agent/semantic_responder.py): for
        a deterministic request the exact cache took, a key whose policy opts in, and a
        body that does not ask for the exact cache only (``semantic_cache: false``).

        ``prompt``: the last user message (None: the request has none to compare);
        ``earlier``: every message before it, as sent; ``extra``: what else of the request
        the exact cache reads through the prompt ids (the tools)."""
        grant = options.grant
        params = prepared.request.params
        if (
            self._semantic is None
            or prompt is None
            or prepared.cache_key is None  # cache: false, or the exact cache is off
            or prepared.cached is not None
            or body.semantic_cache is False
            or not (params.temperature == 0.0 or params.seed is not None)
            or grant is None  # opt-in per key: without keys, no key opts in
            or not grant.key.policy.semantic_cache
        ):
            return prepared
        fields = cache_fields(prepared.request)
        del fields["prompt"]  # the earlier messages and the last one stand for it
        fields["extra"] = dict(extra or {})
        moderation = prepared.moderation
        probe, found = await self._semantic.lookup(
            api_key_id=grant.key_id,
            model_id=prepared.model.model_id,
            model_version=prepared.model.version,
            endpoint=endpoint,
            fields=fields,
            earlier=earlier,
            prompt=prompt,
            moderation_version=moderation.cache_tag() if moderation is not None else "",
        )
        if found.entry is None:
            return dataclasses.replace(prepared, semantic=probe)
        # this request's prompt, not the one that made the entry, is what usage counts
        hit = dataclasses.replace(found.entry, prompt_tokens=prompt_tokens_of(prepared.request))
        return dataclasses.replace(prepared, cached=hit, similarity=found.similarity)

    async def run(self, prepared: PreparedGeneration) -> AsyncIterator[GenerationOutput]:
        """The generation's outputs, with time to first token and per-token time recorded;
        its tokens are counted for its API key however it ends."""
        grant = prepared.grant
        usage = CURRENT_USAGE.get()
        if usage is not None:
            usage.model = prepared.model.model_id
            usage.version = prepared.model.version or ""
            usage.prompt_tokens = prompt_tokens_of(prepared.request)
        if grant is None and usage is None:
            async for output in self._outputs(prepared):
                yield output
            return
        prompt = completion = 0
        try:
            async for output in self._outputs(prepared):
                prompt, completion = output.prompt_tokens, output.completion_tokens
                if usage is not None:
                    if usage.first_token_at is None:
                        usage.first_token_at = time.perf_counter()
                    # what usage_of reports: the prompt (and continued ids), the tokens
                    usage.completion_tokens = completion
                yield output
        finally:
            if grant is not None:
                grant.settle(prompt, completion, prepared.charged_tokens)

    async def _run(self, prepared: PreparedGeneration) -> AsyncIterator[GenerationOutput]:
        if prepared.cached is not None:
            hit = prepared.cached
            yield GenerationOutput(
                text=hit.text,
                token_ids=hit.token_ids,
                finish_reason=hit.finish_reason,  # type: ignore[arg-type]
                prompt_tokens=hit.prompt_tokens,
                completion_tokens=hit.completion_tokens,
            )
            return
        metrics = self._metrics
        model_id = prepared.model.model_id
        # the per-model children, looked up once rather than per token
        time_to_first_token = metrics.time_to_first_token.labels(model_id)
        time_per_output_token = metrics.time_per_output_token.labels(model_id)
        generation_tokens = metrics.generation_tokens.labels(model_id)
        started = time.perf_counter()
        last = started
        generated = 0
        metrics.prompt_tokens.labels(model_id).inc(prompt_tokens_of(prepared.request))
        async for output in prepared.model.generate(prepared.request):
            now = time.perf_counter()
            if generated == 0:
                time_to_first_token.observe(now - started)
            else:
                time_per_output_token.observe(now - last)
            last = now
            generation_tokens.inc(len(output.token_ids))
            generated = output.completion_tokens
            yield output

    async def _outputs(self, prepared: PreparedGeneration) -> AsyncIterator[GenerationOutput]:
        """The engine's outputs (or a cache hit's), through the output check when the
        request has one, and cached when they end: never a cut or flagged output."""
        outputs = self._run(prepared)
        moderation = prepared.moderation
        if moderation is not None and prepared.cached is None:
            outputs = moderation.screen(outputs, streamed=prepared.stream)
        texts: list[str] = []
        tokens: list[int] = []
        try:
            async for output in outputs:
                if prepared.cache_key is not None and prepared.cached is None:
                    texts.append(output.text)
                    tokens.extend(output.token_ids)
                    if (
                        output.finish_reason in ("stop", "length")
                        and (moderation is None or not moderation.output_flagged)
                        and self._cache is not None
                    ):
                        entry = CachedGeneration(
                            "".join(texts),
                            tuple(tokens),
                            output.finish_reason,
                            output.prompt_tokens,
                            output.completion_tokens,
                        )
                        self._cache.put(prepared.cache_key, entry)
                        if prepared.semantic is not None and self._semantic is not None:
                            self._semantic.store(prepared.semantic, entry)
                yield output
        finally:
            close = getattr(outputs, "aclose", None)
            if close is not None:
                await close()


class GenerationService:
    """What the chat and text completion services share: the models, limits and runner."""

    def __init__(
        self, registry: ModelRegistry, limits: GenerationLimits, runner: GenerationRunner
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._runner = runner

    async def _collect(
        self, prepared: PreparedGeneration
    ) -> tuple[str, list[int], GenerationOutput | None]:
        """Run a generation to the end: its text, its token ids and its last output."""
        parts: list[str] = []
        ids: list[int] = []
        last: GenerationOutput | None = None
        async for output in self._runner.run(prepared):
            parts.append(output.text)
            ids.extend(output.token_ids)
            last = output
        return "".join(parts), ids, last
