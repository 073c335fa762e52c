"""The input check of a chat or text completion request (agent/moderation/gate.py): which
texts are checked, run after authentication and parsing, before the response cache and
before any overflow forwarding.

Checked: chat ``user`` and ``tool`` messages (what a client or a tool puts in; ``system``
and ``assistant`` messages are the app's and the model's own), and ``/v1/completions``
prompts given as text. A prompt given as token ids is checked by the completions service
once the model is known, as the text its tokenizer decodes them to
(agent/api/serving_completions.py); one forwarded because its model is not served here
is not checked here.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agent.api.protocol import ChatCompletionRequest, CompletionRequest
from agent.moderation.gate import RequestModeration

__all__ = ["MODERATED", "MODERATION_HEADER", "check_overflow_answer", "input_texts"]

# The request's content checks and what they found (categories only), for its record and
# for an overflow target's answer.
MODERATED = web.RequestKey("edgefleet_moderated", RequestModeration)
MODERATION_HEADER = "X-Edgefleet-Moderation"

#: chat roles whose messages are checked
CHECKED_ROLES = frozenset({"user", "tool"})


def input_texts(body: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, str]]:
    """(param, text) for each checked part of the request."""
    if isinstance(body, ChatCompletionRequest):
        out = []
        for i, message in enumerate(body.messages):
            if message.role not in CHECKED_ROLES or message.content is None:
                continue
            content = message.content
            text = content if isinstance(content, str) else "\n".join(p.text for p in content)
            out.append((f"messages[{i}]", text))
        return out
    prompt = body.prompt
    if isinstance(prompt, str):
        return [("prompt", prompt)]
    return [(f"prompt[{i}]", p) for i, p in enumerate(prompt) if isinstance(p, str)]


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text an OpenAI stream chunk (chat or text completion) adds."""
    out = []
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


async def check_overflow_answer(moderation: RequestModeration, answer: Any) -> Any:
    """An overflow target's whole answer through the output check: a choice's text cut at
    its first blocked window, ``finish_reason: "content_filter"``."""
    if not isinstance(answer, dict):
        return answer
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        holder, field = (message, "content") if isinstance(message, dict) else (choice, "text")
        text = holder.get(field)
        if not isinstance(text, str) or not text:
            continue
        kept, cut = await moderation.check_text(text)
        if cut:
            holder[field] = kept
            choice["finish_reason"] = "content_filter"
    return answer
