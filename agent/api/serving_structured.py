"""Structured outputs and tool calls at the API edge: from the request's ``response_format``,
``tools`` and ``tool_choice`` to a compiled constraint, and from the constrained output to
OpenAI's response shapes (``message.tool_calls``, streamed ``delta.tool_calls``).

The parsing and grammar logic lives in :mod:`agent.structured`; this module only adapts it
to the chat and text completion services.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agent.api.protocol import (
    ChatDelta,
    ChatMessageIn,
    ChatMessageOut,
    FunctionCallDelta,
    FunctionCallOut,
    ModelCapabilities,
    SamplingFields,
    ToolCallDelta,
    ToolCallOut,
)
from agent.engine.interface import ChatMessage, GenerationRequest, TextModel
from agent.errors import InvalidRequestError
from agent.structured.grammar import CompiledGrammar
from agent.structured.spec import ConstraintSpec
from agent.structured.tool_calls import (
    CallPiece,
    ToolCallStreamer,
    call_text,
    new_call_id,
    parse_tool_call,
    tool_response_text,
    tools_system_block,
)

#: What every text model served here supports (``/v1/models`` capabilities).
TEXT_MODEL_CAPABILITIES = ModelCapabilities(
    response_format=["text", "json_object", "json_schema"],
    tools=True,
    parallel_tool_calls=False,
    streaming_tool_calls=True,
)
EMBEDDING_MODEL_CAPABILITIES = ModelCapabilities(
    response_format=[], tools=False, parallel_tool_calls=False, streaming_tool_calls=False
)


def check_constrained_fields(req: SamplingFields, spec: ConstraintSpec | None) -> None:
    """Sampling fields that would break a constrained output are refused with it."""
    if spec is None:
        return
    if req.stop:
        raise InvalidRequestError(
            "stop cannot be combined with response_format or tools (a stop string could cut "
            "the structured output)",
            param="stop",
        )
    if req.min_tokens:
        raise InvalidRequestError(
            "min_tokens cannot be combined with response_format or tools (the output ends "
            "when its grammar is complete)",
            param="min_tokens",
        )


async def compile_constraint(
    model: TextModel, spec: ConstraintSpec | None, continue_token_ids: Sequence[int] | None
) -> CompiledGrammar | None:
    """The request's compiled grammar (off the event loop, cached per model); a resumed
    stream's delivered ids must be a prefix the grammar admits."""
    if spec is None:
        return None
    compiled = await model.compile_constraint(spec)
    if continue_token_ids:
        compiled.check_prefix(list(continue_token_ids), "continue_token_ids")
    return compiled


def constrained_request(
    request: GenerationRequest, compiled: CompiledGrammar | None
) -> GenerationRequest:
    return request if compiled is None else dataclasses.replace(request, constraint=compiled)


def chat_messages(
    messages: Sequence[ChatMessageIn],
    spec: ConstraintSpec | None,
    *,
    template_tools: bool = False,
) -> list[ChatMessage]:
    """The conversation as the chat template reads it: past calls written back as the model
    wrote them; offered tools described in the first system message and tool results
    wrapped with their call ids, unless ``template_tools`` (the model's own template
    describes the tools, given by :func:`tools_for_template`, and wraps the results)."""
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        text = m.text()
        if m.role == "tool":
            if not m.tool_call_id:
                raise InvalidRequestError(
                    "a tool message needs tool_call_id", param=f"messages.{i}.tool_call_id"
                )
            if not template_tools:
                text = tool_response_text(m.tool_call_id, text)
        elif m.tool_calls:
            if m.role != "assistant":
                raise InvalidRequestError(
                    "only assistant messages carry tool_calls", param=f"messages.{i}.tool_calls"
                )
            text += "".join(call_text(c.function.name, c.function.arguments) for c in m.tool_calls)
        out.append(ChatMessage(role=role, content=text))
    if spec is not None and spec.calls_tools and not template_tools:
        block = tools_system_block(spec.callable_tools, required=spec.kind != "tool_auto")
        if out and out[0].role == "system":
            out[0] = ChatMessage(role="system", content=f"{out[0].content}\n\n{block}")
        else:
            out.insert(0, ChatMessage(role="system", content=block))
    return out


def tools_for_template(spec: ConstraintSpec | None) -> list[dict[str, Any]] | None:
    """The tools a request may call, as a chat template that describes tools reads them
    (OpenAI's function objects, as ``transformers`` passes them); None when it calls none."""
    if spec is None or not spec.calls_tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in spec.callable_tools
    ]


def chat_message_out(
    spec: ConstraintSpec | None, text: str, finish: str, *, continued: str = ""
) -> tuple[ChatMessageOut, str]:
    """The message and finish reason for a whole output: a finished call becomes
    ``tool_calls`` (finish ``tool_calls``); anything else, a cut call included, is content
    as generated. ``continued``: a resumed request's text already delivered; a call is read
    from it and ``text`` together, and returned whole."""
    if spec is not None and spec.calls_tools and finish == "stop":
        call = parse_tool_call(continued + text, spec.callable_tools)
        if call is not None:
            tool_call = ToolCallOut(
                id=new_call_id(),
                function=FunctionCallOut(name=call.name, arguments=call.arguments),
            )
            return ChatMessageOut(content=None, tool_calls=[tool_call]), "tool_calls"
    return ChatMessageOut(content=text), finish


class ChatDeltaShaper:
    """Turns a stream's text into chat deltas: plain content, or ``delta.tool_calls`` pieces
    when the output is a call (see :class:`~agent.structured.tool_calls.ToolCallStreamer`)."""

    def __init__(self, spec: ConstraintSpec | None, *, continued: str = "") -> None:
        self._streamer = ToolCallStreamer(new_call_id()) if spec and spec.calls_tools else None
        if self._streamer is not None and continued:
            # a resumed stream: what was delivered before is not sent again (the call's
            # id is new; its name went out with the first part if that part had it)
            self._streamer.feed(continued)

    @property
    def is_call(self) -> bool:
        return self._streamer is not None and self._streamer.mode == "call"

    def _delta(self, content: str, pieces: list[CallPiece]) -> ChatDelta | None:
        if pieces:  # the header and the first arguments may come in one piece of text
            head = next((p for p in pieces if p.id), None)
            call = ToolCallDelta(
                index=0,
                id=head.id if head else None,
                type="function" if head else None,
                function=FunctionCallDelta(
                    name=head.name if head else None,
                    arguments="".join(p.arguments for p in pieces),
                ),
            )
            return ChatDelta(tool_calls=[call])
        return ChatDelta(content=content) if content else None

    def feed(self, text: str) -> ChatDelta | None:
        if self._streamer is None:
            return ChatDelta(content=text) if text else None
        return self._delta(*self._streamer.feed(text))

    def finish(self, finish: str | None) -> tuple[ChatDelta | None, str | None]:
        """What is still held, and the finish reason (``tool_calls`` for a finished call)."""
        if self._streamer is None:
            return None, finish
        delta = self._delta(*self._streamer.finish())
        return delta, "tool_calls" if self.is_call and finish == "stop" else finish
