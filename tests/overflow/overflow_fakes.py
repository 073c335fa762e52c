"""Local fakes of OpenAI's Chat Completions API and Anthropic's Messages API, written
from the providers' published API references (wire formats, streaming events, errors),
on a real loopback socket. Each records what it received, so tests assert on what the
"provider" actually saw.

The reply is deterministic: ``"You said: " + <last user message>`` (so placeholders sent
come back and must be restored), cut into small pieces when streamed (so placeholders
split across chunks). A trailing assistant message is a prefill: the reply continues
after it (when it is a prefix of the full reply). ``plan`` scripts failures, one entry
per request: ``("status", 429)``, ``("break", n)`` (stream cut after n text pieces),
``("error_event", n)`` (stream error event after n pieces), ``("hang", s)``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

Plan = tuple[str, Any]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


@dataclass
class FakeBase:
    api_key: str = "test-key"
    piece: int = 3
    plan: list[Plan] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    server: TestServer | None = None

    def reply_for(self, messages: list[dict[str, Any]], prompt: str | None = None) -> str:
        if prompt is not None:
            return " and so on"
        user = [m for m in messages if m.get("role") == "user"]
        content = user[-1]["content"] if user else ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        full = f"You said: {content}"
        last = messages[-1] if messages else {}
        if last.get("role") == "assistant" and isinstance(last.get("content"), str):
            prefill = last["content"]
            if full.startswith(prefill):
                return full[len(prefill) :]
        return full

    def next_plan(self) -> Plan:
        return self.plan.pop(0) if self.plan else ("ok", None)

    async def start(self) -> str:
        app = web.Application()
        self.routes(app)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError


class FakeOpenAI(FakeBase):
    """POST /v1/chat/completions and /v1/completions (platform.openai.com API reference)."""

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)

    @staticmethod
    def error(status: int, message: str, type_: str, code: str | None) -> web.Response:
        return web.json_response(
            {"error": {"message": message, "type": type_, "param": None, "code": code}},
            status=status,
        )

    async def _common(
        self, request: web.Request
    ) -> tuple[dict[str, Any] | None, web.Response | None]:
        self.headers.append(dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return None, self.error(
                401,
                "Incorrect API key provided: " + request.headers.get("Authorization", "")[7:],
                "invalid_request_error",
                "invalid_api_key",
            )
        body = await request.json()
        self.received.append(body)
        return body, None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body, refusal = await self._common(request)
        if refusal is not None:
            return refusal
        assert body is not None
        text = self.reply_for(body["messages"])
        # edgefleet's extension (a peer agent): token ids are the characters' code points
        if body.get("continue_token_ids"):
            done = "".join(chr(i) for i in body["continue_token_ids"])
            text = text[len(done) :] if text.startswith(done) else text
        return await self._answer(request, body, text, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body, refusal = await self._common(request)
        if refusal is not None:
            return refusal
        assert body is not None
        return await self._answer(request, body, self.reply_for([], body["prompt"]), "text")

    async def _answer(
        self, request: web.Request, body: dict[str, Any], text: str, kind: str
    ) -> web.StreamResponse:
        action, arg = self.next_plan()
        if action == "status":
            if arg == 429:
                return self.error(429, "Rate limit reached", "requests", "rate_limit_exceeded")
            return self.error(arg, "The server had an error", "server_error", None)
        if action == "hang":
            await asyncio.sleep(arg)
        rid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        model = body["model"]
        prompt_tokens = _tokens(json.dumps(body.get("messages") or body.get("prompt")))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": _tokens(text),
            "total_tokens": prompt_tokens + _tokens(text),
        }
        obj = "chat.completion" if kind == "chat" else "text_completion"
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
            if kind == "chat":
                choice["message"] = {"role": "assistant", "content": text, "refusal": None}
            else:
                choice["text"] = text
            return web.json_response(
                {
                    "id": rid,
                    "object": obj,
                    "created": 1,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {
                "id": rid,
                "object": f"{obj}.chunk" if kind == "chat" else obj,
                "created": 1,
                "model": model,
                "choices": choices,
                **extra,
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def piece(delta: str | None, finish: str | None = None) -> dict[str, Any]:
            if kind == "chat":
                d = {} if delta is None else {"content": delta}
                out = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                out = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            if body.get("return_token_ids"):
                out["token_ids"] = [ord(c) for c in delta or ""]
            return out

        if kind == "chat":
            await send(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
        for n, part in enumerate(_pieces(text, self.piece)):
            if action == "break" and n == arg:
                return response  # connection closed without [DONE]
            if action == "error_event" and n == arg:
                error = {
                    "error": {
                        "message": "overloaded",
                        "type": "server_error",
                        "param": None,
                        "code": "overloaded",
                    }
                }
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
                await response.write(b"data: [DONE]\n\n")
                return response
            await send([piece(part)])
            await asyncio.sleep(0)
        await send([piece(None, "stop")])
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await send([], usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class FakeAnthropic(FakeBase):
    """POST /v1/messages (docs.anthropic.com Messages API and streaming reference)."""

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)

    @staticmethod
    def error(status: int, type_: str, message: str) -> web.Response:
        return web.json_response(
            {"type": "error", "error": {"type": type_, "message": message}}, status=status
        )

    async def messages(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        # the reference's x-api-key; the SDK (2.14) sends the key as a bearer token
        bearer = request.headers.get("Authorization", "")
        if request.headers.get("x-api-key") != self.api_key and bearer != f"Bearer {self.api_key}":
            return self.error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return self.error(400, "invalid_request_error", "anthropic-version header is required")
        body = await request.json()
        self.received.append(body)
        for name in ("model", "max_tokens", "messages"):
            if name not in body:
                return self.error(400, "invalid_request_error", f"{name}: Field required")
        messages = body["messages"]
        if any(m.get("role") not in ("user", "assistant") for m in messages):
            return self.error(
                400, "invalid_request_error", "messages: roles must be user or assistant"
            )
        last = messages[-1]
        if last["role"] == "assistant" and str(last["content"]).rstrip() != str(last["content"]):
            return self.error(
                400,
                "invalid_request_error",
                "messages: final assistant content cannot end with trailing whitespace",
            )
        action, arg = self.next_plan()
        if action == "status":
            if arg == 529:
                return self.error(529, "overloaded_error", "Overloaded")
            if arg == 429:
                return self.error(
                    429,
                    "rate_limit_error",
                    "Number of request tokens has exceeded your per-minute rate limit"[:40],
                )
            return self.error(arg, "api_error", "Internal server error")
        text = self._reply(messages)
        msg_id = f"msg_{uuid.uuid4().hex[:20]}"
        input_tokens = _tokens(json.dumps(messages) + body.get("system", ""))
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": _tokens(text)},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

        await event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 1},
                },
            },
        )
        await event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        await event("ping", {"type": "ping"})
        for n, part in enumerate(_pieces(text, self.piece)):
            if action == "break" and n == arg:
                return response
            if action == "error_event" and n == arg:
                await event(
                    "error",
                    {
                        "type": "error",
                        "error": {"type": "overloaded_error", "message": "Overloaded"},
                    },
                )
                await response.write_eof()
                return response
            await event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": part},
                },
            )
            if n == 1:
                await event("ping", {"type": "ping"})
            await asyncio.sleep(0)
        await event("content_block_stop", {"type": "content_block_stop", "index": 0})
        await event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": _tokens(text)},
            },
        )
        await event("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    def _reply(self, messages: list[dict[str, Any]]) -> str:
        def text(content: Any) -> str:
            if isinstance(content, list):
                return "".join(b.get("text", "") for b in content if isinstance(b, dict))
            return str(content)

        plain = [{"role": m["role"], "content": text(m["content"])} for m in messages]
        full = self.reply_for(plain)
        last = plain[-1]
        if last["role"] == "assistant":
            whole = self.reply_for(plain[:-1])
            if whole.startswith(last["content"]):
                return whole[len(last["content"]) :]
        return full
