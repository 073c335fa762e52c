"""The input check of a chat or text completion request (agent/moderation/gate.py): which
texts are checked, run after authentication and parsing, before the response cache and
before any overflow forwarding.

Checked: chat ``user`` and ``tool`` messages (what a client or a tool puts in; ``system``
and ``assistant`` messages are the app's and the model's own), and ``/v1/completions``
prompts given as text. A prompt given as token ids is not checked (the text it stands for
is the model's tokenizer's, which this check does not read).
"""

from __future__ import annotations

from agent.api.protocol import ChatCompletionRequest, CompletionRequest

__all__ = ["input_texts"]

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
