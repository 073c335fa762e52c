"""Tool calls in the prompt and in the output.

Prompt: the tools are described to the model in a system block (:func:`tools_system_block`),
added to the request's first system message (or as a new first system message). A past
assistant call is written back into its turn as the model would have written it, and a
``role: "tool"`` message goes through the chat template under the role ``tool``, wrapped
in ``<tool_response>`` with its call id.

Output: one call is written as ``<tool_call>{"name":NAME,"arguments":ARGS}</tool_call>``,
compact (the grammar admits no other spelling). :func:`parse_tool_call` reads it back;
:class:`ToolCallStreamer` turns the text as it arrives into OpenAI's streamed
``delta.tool_calls`` pieces: the id, type and name first (with empty arguments), then the
arguments in pieces as they are generated.

:class:`ToolSpec` (one function a request offers) lives here, below the request parsing in
:mod:`agent.structured.spec`, which builds it and checks outputs with :func:`parse_tool_call`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_HEAD = '{"name":'
_ARGS = ',"arguments":'
_TAIL = "}" + CALL_CLOSE


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call."""

    name: str
    description: str = field(default="", repr=False)
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"}, repr=False)


def tools_system_block(tools: Sequence[ToolSpec], *, required: bool) -> str:
    """The system block that tells the model which functions it may call and how."""
    listed = "\n".join(
        json.dumps(
            {"name": t.name, "description": t.description, "parameters": t.parameters},
            separators=(",", ":"),
        )
        for t in tools
    )
    how = (
        "Call one of these functions now."
        if required
        else "If one of these functions answers the request, call it; otherwise answer in "
        "plain text."
    )
    return (
        "You can call functions. They are listed below, one JSON object per line:\n"
        f"{listed}\n{how} To call a function, reply with exactly "
        f'{CALL_OPEN}{{"name":"FUNCTION_NAME","arguments":{{...}}}}{CALL_CLOSE} and nothing '
        "else."
    )


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (used to put a past call back into its turn)."""
    return f"{CALL_OPEN}{_HEAD}{json.dumps(name)}{_ARGS}{arguments}{_TAIL}"


def tool_response_text(tool_call_id: str | None, content: str) -> str:
    """A ``role: "tool"`` message's content as the model reads it."""
    body = json.dumps({"tool_call_id": tool_call_id, "content": content})
    return f"<tool_response>{body}</tool_response>"


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str = field(repr=False)  # the arguments' JSON text, as generated


def parse_tool_call(text: str, tools: Sequence[ToolSpec]) -> ParsedToolCall | None:
    """The call ``text`` makes, or None when it is not exactly one well-formed call to one
    of ``tools`` (arguments are not validated here)."""
    if not text.startswith(CALL_OPEN + _HEAD) or not text.endswith(_TAIL):
        return None
    body = text[len(CALL_OPEN) : -len(CALL_CLOSE)]
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name = value["name"]
    if not any(t.name == name for t in tools):
        return None
    head = f"{CALL_OPEN}{_HEAD}{json.dumps(name)}{_ARGS}"
    if not text.startswith(head):
        return None
    return ParsedToolCall(name, text[len(head) : -len(_TAIL)])


@dataclass
class CallPiece:
    """One streamed piece of a call: the header (id and name) or a piece of arguments."""

    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ToolCallStreamer:
    """Turns a tool-calling output, as its text arrives, into text or call pieces.

    For ``tool_auto`` the first character decides: ``<`` is a call (the grammar admits
    nothing else starting with it), anything else is text, passed through as it comes.
    Call text is held until its name is complete; then the header goes out, then the
    arguments as they arrive, minus the closing ``}</tool_call>`` (held back until the end).
    """

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.mode: str | None = None  # "text" or "call", once known
        self._buffer = ""
        self._sent_header = False
        self._args_sent = 0  # characters of arguments already out

    def feed(self, text: str) -> tuple[str, list[CallPiece]]:
        """Text content and call pieces to send for this new text."""
        if not text:
            return "", []
        if self.mode is None:
            self.mode = "call" if text.startswith("<") else "text"
        if self.mode == "text":
            return text, []
        self._buffer += text
        return "", self._pieces(final=False)

    def finish(self) -> tuple[str, list[CallPiece]]:
        """What is still held at the end."""
        if self.mode != "call":
            return "", []
        return "", self._pieces(final=True)

    def _pieces(self, *, final: bool) -> list[CallPiece]:
        pieces: list[CallPiece] = []
        start = len(CALL_OPEN) + len(_HEAD)
        if not self._sent_header:
            marker = self._buffer.find(_ARGS, start)
            if marker < 0:
                return pieces
            try:
                name = json.loads(self._buffer[start:marker])
            except ValueError:
                return pieces
            self._sent_header = True
            self._args_start = marker + len(_ARGS)
            pieces.append(CallPiece(id=self.call_id, name=str(name)))
        args = self._buffer[self._args_start :]
        if final and args.endswith(_TAIL):
            args = args[: -len(_TAIL)]
        elif not final:
            args = args[: max(0, len(args) - len(_TAIL))]  # it may be the closing text
        if len(args) > self._args_sent:
            pieces.append(CallPiece(arguments=args[self._args_sent :]))
            self._args_sent = len(args)
        return pieces
