"""Tokenizer, chat template and incremental detokenization for one text model.

Tokenization uses HF ``tokenizers``; chat templates are rendered with jinja2's immutable
sandbox, the way ``transformers`` renders them, so a template shipped with a model works
unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from agent.engine.interface import ChatMessage
from agent.errors import InvalidRequestError, ModelLoadError


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    """``tojson`` as ``transformers`` defines it for chat templates: keys in their order, no
    HTML escaping (jinja2's own sorts keys and escapes ``<``, which a model never saw)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def load_tokenizer(path: Path) -> Tokenizer:
    """A Hugging Face ``tokenizers`` JSON file; ModelLoadError when it cannot be read."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ModelLoadError(f"cannot read tokenizer {path}: {exc}") from exc


class TextCodec:
    """Turns chat messages and text into token ids and token ids back into text."""

    def __init__(
        self,
        tokenizer_file: Path,
        *,
        chat_template: str | None,
        add_special_tokens: bool,
        bos_token: str = "",
        eos_token: str = "",
    ) -> None:
        self._tokenizer = load_tokenizer(tokenizer_file)
        self._add_special_tokens = add_special_tokens
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._template: jinja2.Template | None = None
        self._renders_tools = False
        if chat_template:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            env.filters["tojson"] = _tojson
            try:
                self._template = env.from_string(chat_template)
                # a template that reads ``tools`` describes them itself, as the model was
                # trained to see them (Qwen2.5's does; SmolLM2's does not)
                self._renders_tools = "tools" in meta.find_undeclared_variables(
                    env.parse(chat_template)
                )
            except jinja2.exceptions.TemplateError as exc:
                raise ModelLoadError(f"chat template does not compile: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def tokenizer_json(self) -> str:
        """The tokenizer as ``tokenizers`` JSON (what the grammar engine reads)."""
        return str(self._tokenizer.to_str())

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it works (encode does not), so encoding on a
        # worker thread leaves the event loop free
        batch = self._tokenizer.encode_batch([text], add_special_tokens=self._add_special_tokens)
        return list(batch[0].ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template describes tools itself (``tools`` in its context)."""
        return self._renders_tools

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        """The prompt for ``messages``; ``tools`` (OpenAI's ``{"type": "function",
        "function": {...}}`` objects) go to a template that :attr:`renders_tools`."""
        if self._template is None:
            raise InvalidRequestError(
                "this model has no chat template; use /v1/completions", param="model"
            )
        context: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "add_generation_prompt": True,
            "bos_token": self._bos_token,
            "eos_token": self._eos_token,
        }
        if tools:
            context["tools"] = list(tools)
        try:
            return self._template.render(**context)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequestError(
                f"the model's chat template rejected these messages: {exc}", param="messages"
            ) from exc

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    """Yields the text of each new token once it is complete.

    Decoding a window that starts a few tokens back keeps merges and multi-byte characters
    right (a character split across tokens is held until its last byte arrives).
    """

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._codec.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._codec.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Text still held at the end (an incomplete character comes out as U+FFFD)."""
        prefix_text = self._codec.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._codec.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
