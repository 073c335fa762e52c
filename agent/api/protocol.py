"""Request and response bodies of the OpenAI wire format, as pydantic models.

Requests are validated strictly (a string is not a number); fields OpenAI documents but
this server does not implement are accepted only at their neutral value and otherwise
refused by the serving layer with a clear 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

_REQUEST = ConfigDict(strict=True, extra="ignore")

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopField = str | Annotated[list[str], Field(max_length=4)] | None
TokenIds = Annotated[
    list[int] | None,
    Field(
        description="Extension, present only when the request set return_token_ids: the token "
        "ids this choice (or this streamed chunk) delivers, in order. Concatenated over a "
        "stream they are the completion's ids, to send back as continue_token_ids."
    ),
]


class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = _REQUEST
    type: Literal["text"]
    text: str


class FunctionCallIn(BaseModel):
    model_config = _REQUEST
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallIn(BaseModel):
    """A call the assistant made on an earlier turn (sent back with the conversation)."""

    model_config = _REQUEST
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    model_config = _REQUEST
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=64)] | None = None  # assistant
    tool_call_id: str | None = None  # role "tool": the call this message answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


ResponseFormatField = Annotated[
    dict[str, Any] | None,
    Field(
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
        '"json_schema": {"name", "schema", "strict"}} as OpenAI defines them. The output is '
        "constrained while it is generated (compact JSON, properties in the schema's order): "
        "it always parses and, for a schema, validates, unless max_tokens cuts it "
        '(finish_reason "length"). A schema the grammar engine cannot compile, one over '
        "64 KiB serialized, or one taking over 2 s to compile is a 400 (invalid_schema).",
    ),
]


class SamplingFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = _REQUEST
    model: str
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0  # extension (as in vLLM)
    min_tokens: Annotated[int, Field(ge=0)] = 0  # extension (as in vLLM): no end-of-turn before
    n: Annotated[int, Field(ge=1, le=128)] = 1
    seed: int | None = None
    stop: StopField = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    priority: Literal["high", "normal", "low"] | None = None  # extension; or X-Priority header
    # extension (Ollama's): how long the model stays loaded once idle after this request
    keep_alive: float | str | None = Field(
        default=None,
        description="Extension (Ollama's keep_alive): seconds, or a duration such as '5m', "
        "that the model stays loaded once idle after this request; it only ever extends "
        "the model's idle stay (never keeps it from being unloaded to make room for another "
        "model), capped by the API key's max_keep_alive_s and the agent's "
        "residency.max_request_keep_alive_s. Negative pins the model (loaded until an "
        "operator unloads it or the agent restarts), for a key with may_pin_models only: "
        "else 400 naming keep_alive.",
    )
    cache: bool | None = None  # extension: use the response cache (default: when deterministic)
    semantic_cache: bool | None = Field(
        default=None,
        description="Extension: false asks for the exact response cache only (no answer from "
        "a reworded repeat); unset: the semantic cache when the API key's policy turns it on. "
        "cache: false turns both off.",
    )
    # extension: each choice (and each streamed chunk's choice) carries the token ids it
    # delivers in ``token_ids``, so a client can resume a broken stream by ids
    return_token_ids: bool = Field(
        default=False,
        description="Extension: every choice, and every streamed chunk's choice, carries the "
        "token ids it delivers in token_ids.",
    )
    # extension (in the spirit of vLLM's continue_final_message): completion token ids
    # already delivered by a stream that broke; generation resumes right after them.
    # max_tokens then counts the tokens still to come; usage counts them in prompt_tokens
    continue_token_ids: Annotated[list[int], Field(min_length=1)] | None = Field(
        default=None,
        description="Extension: resume a completion. Token ids already delivered (the "
        "concatenated token_ids of a broken stream) form the start of the completion: the "
        "prompt (chat: the messages through the chat template with the generation prompt) is "
        "followed by these ids and generation goes on after them, with max_tokens counting "
        "only the tokens still to come, and min_tokens, stop strings and seeded sampling "
        "counting from the completion's start. For greedy and seeded requests the result "
        "continues exactly as an uninterrupted run on the same model version would, as far "
        "as the engine's arithmetic allows. Usage counts these ids in prompt_tokens. Ids "
        "outside the vocabulary are refused (400, param continue_token_ids); prompt plus "
        "these ids must leave room in the context (400 context_length_exceeded).",
    )


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = Field(
        default=None,
        description="Functions the model may call (type function, at most 64). They are "
        "described to the model in a system block; a call is constrained to one of them "
        "with arguments that validate against its parameters.",
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None,
        description='"none", "auto" (the default with tools: the grammar admits either a '
        'text answer or one call, and the model\'s first token chooses), "required" or '
        '{"type": "function", "function": {"name": ...}}.',
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="Accepted; at most one call is produced per turn."
    )
    functions: list[dict[str, Any]] | None = None
    response_format: ResponseFormatField = None


class CompletionRequest(SamplingFields):
    prompt: (
        str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)]
    )
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None
    response_format: ResponseFormatField = None  # extension (as in vLLM): constrained text


class EmbeddingRequest(BaseModel):
    model_config = _REQUEST
    model: str
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=2048)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[list[int]], Field(min_length=1, max_length=2048)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


#: texts one /v1/moderations request may carry, and characters per text
MODERATION_MAX_INPUTS = 32
MODERATION_MAX_CHARS = 32_768


class ModerationRequest(BaseModel):
    """OpenAI's moderation request (text only): ``input`` a string or a list of strings.
    Counts and sizes are checked by the service, which names the text at fault."""

    model_config = _REQUEST
    input: str | list[str] = Field(
        description=f"a text, or 1 to {MODERATION_MAX_INPUTS} texts; at most "
        f"{MODERATION_MAX_CHARS} characters each"
    )
    model: str | None = None


# --- responses ---------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


ChatFinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text that validates against the function's parameters


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None  # present only when the model called a tool

    @model_serializer(mode="wrap")
    def _drop_absent_tool_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class _TokenIdsOnRequest(BaseModel):
    """A choice whose ``token_ids`` extension appears only when the request asked for it."""

    @model_serializer(mode="wrap")
    def _drop_absent_token_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("token_ids") is None:
            data.pop("token_ids", None)
        return data


class ChatChoice(_TokenIdsOnRequest):
    index: int
    message: ChatMessageOut
    finish_reason: ChatFinishReason | None
    logprobs: None = None
    token_ids: TokenIds = None  # extension: with return_token_ids, the ids delivered


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = None  # in a call's first piece only
    arguments: str = ""  # the next piece of the arguments' JSON text

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ToolCallDelta(BaseModel):
    """A streamed piece of a call, as OpenAI streams them: the first piece carries the id,
    type and name with empty arguments; the next ones carry only arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # as OpenAI sends them: {"role": ..., "content": ""}, then {"content": ...}, then {}
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(_TokenIdsOnRequest):
    index: int
    delta: ChatDelta
    finish_reason: ChatFinishReason | None = None
    logprobs: None = None
    token_ids: TokenIds = None  # extension: with return_token_ids, the ids delivered


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_TokenIdsOnRequest):
    index: int
    text: str
    finish_reason: Literal["stop", "length", "content_filter"] | None
    logprobs: None = None
    token_ids: TokenIds = None  # extension: with return_token_ids, the ids delivered


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ModerationResult(BaseModel):
    """One input's result, as OpenAI's moderation API gives it. Every category is named;
    one this classifier does not decide is false with score 0 and an empty
    ``category_applied_input_types`` entry. ``prompt_injection`` is ours, beside OpenAI's."""

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[Literal["text", "image"]]]


class ModerationResponse(BaseModel):
    id: str  # modr-<32 hex>
    model: str  # the heads' name@version
    results: list[ModerationResult]


class ModelCapabilities(BaseModel):
    """Extension on each model card: which structured-output features the model takes."""

    response_format: list[Literal["text", "json_object", "json_schema"]]  # types accepted
    tools: bool  # tools and tool_choice (none, auto, required, a named function)
    parallel_tool_calls: bool  # several calls in one turn (never: at most one per turn)
    streaming_tool_calls: bool  # delta.tool_calls pieces in a stream


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edgefleet"
    version: str  # extension: the artifact version served
    task: Literal["text-generation", "feature-extraction"]  # extension
    context_length: int  # extension: tokens of prompt plus completion
    # extension: what the model supports of OpenAI's optional request fields
    capabilities: ModelCapabilities
    # extensions, text models on an agent managing their memory: available, loading,
    # loaded, draining or failed; bytes resident (measured after its load), when an idle
    # model will be unloaded (Unix seconds; null: not idle, or never), pinned
    state: str | None = None
    resident_bytes: int | None = None
    expires_at: int | None = None
    pinned: bool | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelSyncStatus(BaseModel):
    """One model version in this agent's model sync (not loaded ones: see ``models``)."""

    model: str  # name@version
    state: Literal["downloading", "on_disk", "loading", "checking", "loaded", "failed"]
    bytes_done: int
    bytes_total: int
    last_error: str = ""


class Health(BaseModel):
    status: Literal["ok", "draining", "unhealthy"]  # draining: wants no new routes; unhealthy: 503
    models: list[str]
    running: int  # sequences being generated
    waiting: int  # sequences queued
    kv_cache_used_tokens: int
    unhealthy_reason: str = ""  # why the agent cannot serve (a dead engine); empty otherwise
    # model versions being fetched, loaded or checked, or that failed (model sync)
    model_sync: list[ModelSyncStatus] = []
