"""Wire formats of overflow targets, all seen by the forwarder as OpenAI's.

- :class:`OpenAIAdapter`: OpenAI-compatible servers (vLLM, TGI, llama.cpp, hosted
  OpenAI-compatible providers). Edgefleet's own request extensions are removed, since a
  strict server refuses unknown parameters.
- :class:`EdgefleetAdapter`: another edgefleet agent: OpenAI's format plus the hop marker
  (``X-Edgefleet-Hop``) and token ids (``return_token_ids``), so a stream broken on one peer
  resumes on another with ``continue_token_ids``.
- :class:`AnthropicAdapter`: Anthropic's Messages API (``POST /v1/messages``), translated
  both ways, streaming events included (message_start, content_block_*, ping,
  message_delta, message_stop, error), with 429 and 529 ``overloaded_error`` retryable.

Continuation after a broken stream: edgefleet peers by token ids; OpenAI-compatible and
Anthropic targets that say they support it (``supports_continuation``) by a trailing
assistant message holding the text already delivered (assistant prefill).

Error messages never carry what the target said verbatim (a provider may echo part of a
credential): only the target's name, the HTTP status and the error type.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from edgefleet.contract import OverflowApi

#: Request fields that are edgefleet extensions, removed for targets other than peers.
EDGEFLEET_FIELDS = (
    "edgefleet",
    "return_token_ids",
    "continue_token_ids",
    "cache",
    "priority",
    "min_tokens",
    "top_k",
)
HOP_HEADER = "X-Edgefleet-Hop"
#: Statuses worth another try (here or on the next target).
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
#: Statuses where the request itself is at fault: the client gets the error, no failover.
CLIENT_FAULT_STATUSES = frozenset({400, 404, 413, 422})
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 1024


class UpstreamError(Exception):
    """A target failed a request. ``retryable``: worth trying again; ``client_fault``: the
    request is at fault (the client gets a 4xx, nothing else is tried)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        client_fault: bool = False,
        error_type: str = "",
        untranslatable: bool = False,
    ) -> None:
        super().__init__(message)
        # the request cannot be put in this target's format (another target may take it)
        self.untranslatable = untranslatable
        self.message = message
        self.retryable = retryable
        self.status = status
        self.client_fault = client_fault
        self.error_type = error_type


def status_error(target: str, status: int, body: bytes) -> UpstreamError:
    """The error for an HTTP status from ``target``; the body only gives the error type."""
    error_type = ""
    try:
        data = json.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("type"), str):
            error_type = error["type"][:64]
    except ValueError:
        pass
    detail = f" ({error_type})" if error_type else ""
    return UpstreamError(
        f"overflow target {target} answered HTTP {status}{detail}",
        retryable=status in RETRYABLE_STATUSES,
        status=status,
        client_fault=status in CLIENT_FAULT_STATUSES,
        error_type=error_type,
    )


@dataclass
class Continuation:
    """What a broken stream already delivered (as the target saw it: redacted)."""

    text: str
    token_ids: list[int] | None
    completion_tokens: int


class Adapter(Protocol):
    api: OverflowApi

    def supports(self, endpoint: str) -> bool: ...

    def path(self, endpoint: str) -> str: ...

    def headers(self, credential: str) -> dict[str, str]: ...

    def request_body(
        self, body: dict[str, Any], endpoint: str, model: str, continuation: Continuation | None
    ) -> dict[str, Any]: ...

    def response(self, data: Any, endpoint: str, target: str) -> dict[str, Any]: ...

    def chunks(
        self, events: AsyncIterator[tuple[str, str]], target: str
    ) -> AsyncIterator[dict[str, Any]]: ...


async def sse_events(lines: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, str]]:
    """(event name, data) of each server-sent event in ``lines``."""
    event = ""
    data: list[str] = []
    async for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield event, "\n".join(data)


def _json(data: str, target: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise UpstreamError(
            f"overflow target {target} sent an event that is not JSON", retryable=True
        ) from None


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _strip(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in EDGEFLEET_FIELDS}


def _bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"} if credential else {}


class OpenAIAdapter:
    api = OverflowApi.OPENAI

    def supports(self, endpoint: str) -> bool:
        return endpoint in ("chat", "completions")

    def path(self, endpoint: str) -> str:
        return "/chat/completions" if endpoint == "chat" else "/completions"

    def headers(self, credential: str) -> dict[str, str]:
        return _bearer(credential)

    def request_body(
        self, body: dict[str, Any], endpoint: str, model: str, continuation: Continuation | None
    ) -> dict[str, Any]:
        out = _strip(body)
        out["model"] = model
        if out.get("stream"):
            out["stream_options"] = {"include_usage": True}
        if continuation is not None:
            _prefill(out, endpoint, continuation)
        return out

    def response(self, data: Any, endpoint: str, target: str) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError(
                f"overflow target {target} answered without choices", retryable=True
            )
        return data

    async def chunks(
        self, events: AsyncIterator[tuple[str, str]], target: str
    ) -> AsyncIterator[dict[str, Any]]:
        async for _, data in events:
            if data.strip() == "[DONE]":
                return
            chunk = _json(data, target)
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                code = str(error.get("code") or error.get("type") or "error")[:64]
                raise UpstreamError(
                    f"overflow target {target} ended its stream with an error ({code})",
                    retryable=True,
                    error_type=code,
                )
            yield chunk
        # no [DONE] (transformers serve never sends one): complete only if a choice
        # finished, which the forwarder checks


def _prefill(out: dict[str, Any], endpoint: str, continuation: Continuation) -> None:
    """Continue after ``continuation``: the text so far as a trailing assistant turn (chat)
    or after the prompt (completions); max_tokens counts what is still to come."""
    if endpoint == "chat":
        out["messages"] = [
            *out.get("messages", []),
            {"role": "assistant", "content": continuation.text},
        ]
    elif isinstance(out.get("prompt"), str):
        out["prompt"] = out["prompt"] + continuation.text
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(name), int):
            out[name] = max(1, out[name] - continuation.completion_tokens)


class EdgefleetAdapter(OpenAIAdapter):
    api = OverflowApi.EDGEFLEET

    def headers(self, credential: str) -> dict[str, str]:
        return {HOP_HEADER: "1", **_bearer(credential)}

    def request_body(
        self, body: dict[str, Any], endpoint: str, model: str, continuation: Continuation | None
    ) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k != "edgefleet"}
        out["model"] = model
        if out.get("stream"):
            out["stream_options"] = {"include_usage": True}
            out["return_token_ids"] = True  # to resume elsewhere if this peer breaks
        if continuation is not None:
            if continuation.token_ids:
                out["continue_token_ids"] = list(body.get("continue_token_ids") or []) + list(
                    continuation.token_ids
                )
                for name in ("max_tokens", "max_completion_tokens"):
                    if isinstance(out.get(name), int):
                        out[name] = max(1, out[name] - continuation.completion_tokens)
            else:
                _prefill(out, endpoint, continuation)
        return out


_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise UpstreamError(
                    f"{where}: only text content is translated to Anthropic's Messages API",
                    retryable=False,
                    client_fault=True,
                    status=400,
                    untranslatable=True,
                )
        return "".join(parts)
    raise UpstreamError(
        f"{where}: unsupported content", retryable=False, client_fault=True, untranslatable=True
    )


class AnthropicAdapter:
    api = OverflowApi.ANTHROPIC

    def supports(self, endpoint: str) -> bool:
        return endpoint == "chat"

    def path(self, endpoint: str) -> str:
        return "/messages"

    def headers(self, credential: str) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if credential:
            headers["x-api-key"] = credential
        return headers

    def request_body(
        self, body: dict[str, Any], endpoint: str, model: str, continuation: Continuation | None
    ) -> dict[str, Any]:
        system: list[str] = []
        messages: list[dict[str, Any]] = []
        for i, message in enumerate(body.get("messages") or []):
            role = message.get("role")
            where = f"messages.{i}"
            if role in ("system", "developer"):
                system.append(_text_of(message.get("content"), where))
            elif role in ("user", "assistant"):
                if message.get("tool_calls"):
                    raise UpstreamError(
                        f"{where}: tool calls are not translated to Anthropic's Messages API",
                        retryable=False,
                        client_fault=True,
                        status=400,
                        untranslatable=True,
                    )
                messages.append({"role": role, "content": _text_of(message.get("content"), where)})
            else:
                raise UpstreamError(
                    f"{where}: role {role!r} is not translated to Anthropic's Messages API",
                    retryable=False,
                    client_fault=True,
                    status=400,
                    untranslatable=True,
                )
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if not isinstance(max_tokens, int):
            max_tokens = ANTHROPIC_DEFAULT_MAX_TOKENS
        if continuation is not None:
            # assistant prefill: Anthropic continues the last assistant turn; it refuses a
            # final assistant turn ending in white space
            messages.append({"role": "assistant", "content": continuation.text.rstrip()})
            max_tokens = max(1, max_tokens - continuation.completion_tokens)
        out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages}
        if system:
            out["system"] = "\n\n".join(system)
        if isinstance(body.get("temperature"), int | float):
            out["temperature"] = min(float(body["temperature"]), 1.0)
        if isinstance(body.get("top_p"), int | float) and body["top_p"] != 1:
            out["top_p"] = float(body["top_p"])
        stop = body.get("stop")
        if isinstance(stop, str):
            out["stop_sequences"] = [stop]
        elif isinstance(stop, list) and stop:
            out["stop_sequences"] = [str(s) for s in stop]
        if body.get("stream"):
            out["stream"] = True
        return out

    def response(self, data: Any, endpoint: str, target: str) -> dict[str, Any]:
        if not isinstance(data, dict) or data.get("type") != "message":
            raise UpstreamError(f"overflow target {target} answered without a message",
                                retryable=True)  # fmt: skip
        text = "".join(
            str(block.get("text", ""))
            for block in data.get("content") or []
            if isinstance(block, dict) and block.get("type") == "text"
        )
        usage = _obj(data.get("usage"))
        prompt = int(usage.get("input_tokens") or 0)
        completion = int(usage.get("output_tokens") or 0)
        return {
            "id": f"chatcmpl-{data.get('id', '')}",
            "object": "chat.completion",
            "created": 0,
            "model": str(data.get("model", "")),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": _STOP_REASONS.get(str(data.get("stop_reason")), "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    async def chunks(
        self, events: AsyncIterator[tuple[str, str]], target: str
    ) -> AsyncIterator[dict[str, Any]]:
        message_id = ""
        model = ""
        prompt = completion = 0
        finish = "stop"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": f"chatcmpl-{message_id}",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        async for event, data in events:
            payload = _json(data, target)
            if not isinstance(payload, dict):
                continue
            kind = payload.get("type", event)
            if kind == "ping":
                continue
            if kind == "error":
                error = _obj(payload.get("error"))
                error_type = str(error.get("type", "error"))[:64]
                raise UpstreamError(
                    f"overflow target {target} ended its stream with {error_type}",
                    retryable=error_type in ("overloaded_error", "api_error", "rate_limit_error"),
                    error_type=error_type,
                )
            if kind == "message_start":
                message = _obj(payload.get("message"))
                message_id = str(message.get("id", ""))
                model = str(message.get("model", ""))
                usage = _obj(message.get("usage"))
                prompt = int(usage.get("input_tokens") or 0)
                completion = int(usage.get("output_tokens") or 0)
                yield chunk({"role": "assistant", "content": ""})
            elif kind == "content_block_delta":
                delta = _obj(payload.get("delta"))
                if delta.get("type") == "text_delta" and delta.get("text"):
                    yield chunk({"content": str(delta["text"])})
            elif kind == "message_delta":
                delta = _obj(payload.get("delta"))
                if delta.get("stop_reason"):
                    finish = _STOP_REASONS.get(str(delta["stop_reason"]), "stop")
                usage = _obj(payload.get("usage"))
                if usage.get("output_tokens") is not None:
                    completion = int(usage["output_tokens"])
            elif kind == "message_stop":
                yield chunk({}, finish)
                yield {
                    **chunk({}),
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
                return
        raise UpstreamError(
            f"overflow target {target} ended its stream without message_stop", retryable=True
        )


ADAPTERS: dict[OverflowApi, Adapter] = {
    OverflowApi.OPENAI: OpenAIAdapter(),
    OverflowApi.EDGEFLEET: EdgefleetAdapter(),
    OverflowApi.ANTHROPIC: AnthropicAdapter(),
}
