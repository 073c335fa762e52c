"""Grammars from constraint specs, compiled with llguidance, and one matcher per sequence.

Why llguidance: it builds its token trie from the model's ``tokenizers`` JSON (no torch, no
transformers, no other dependency), computes a mask in about 0.1 ms per token here for our
JSON schemas (``benchmarks/structured_outputs.py`` compares it with outlines-core, whose
index must be built per schema over the whole vocabulary first), and takes Lark grammars
with embedded JSON schemas (``%json``), which the tool-call formats need. xgrammar would
bring torch into the agent.

A JSON number's grammar admits digits without end (and llguidance cannot bound them): each
matcher caps its numbers' digits on top of the grammar's mask (:mod:`agent.structured.number_cap`).

Compiling: :meth:`GrammarCompiler.compile` turns a :class:`ConstraintSpec` into a
:class:`CompiledGrammar` on a worker thread (never on the event loop), at most
:data:`COMPILE_TIMEOUT_S` seconds (then a 400), and keeps the last
:data:`CACHE_ENTRIES` grammars (failures included) per model. Each sequence gets its own
:class:`GrammarMatcher` (a copy of the compiled matcher's start state).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llguidance
import numpy as np
import numpy.typing as npt

from agent.errors import InvalidRequestError, InvalidSchemaError
from agent.structured.number_cap import DigitTokens, NumberCap
from agent.structured.spec import ConstraintSpec
from agent.structured.tool_calls import _ARGS, _HEAD, _TAIL, CALL_OPEN

log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 2.0  # a grammar that takes longer to compile is refused (400)
# waiting for a compilation (its turn on the compile thread included) ends after this: the
# request gets a 400 and the compilation's result, when it comes, is dropped
WAIT_TIMEOUT_S = 5 * COMPILE_TIMEOUT_S
CACHE_ENTRIES = 128  # compiled grammars kept per model (least recently used dropped)
_COMPACT = {"whitespace_flexible": False}


def closed_objects(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing about other properties.

    A small model given an open object keeps inventing properties until max_tokens; every
    output of the closed schema still validates against the original (the extra properties
    were optional), so generating from it keeps the guarantee. Members of ``allOf`` (and
    nodes that use it) are left as they are: closing them would forbid each other's
    properties.
    """
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "allOf" or key == "const" or key == "enum" or key == "default":
            out[key] = value
        elif key in ("properties", "$defs", "definitions", "patternProperties"):
            out[key] = (
                {name: closed_objects(sub) for name, sub in value.items()}
                if isinstance(value, dict)
                else value
            )
        elif key in ("items", "anyOf", "oneOf", "additionalProperties", "prefixItems", "not"):
            out[key] = closed_objects(value)
        else:
            out[key] = value
    if (
        "properties" in out
        and "additionalProperties" not in out
        and "patternProperties" not in out
        and "allOf" not in out
        and "unevaluatedProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


def _compact_schema(schema: dict[str, Any]) -> str:
    """The schema for ``%json``: objects closed (:func:`closed_objects`), compact JSON (no
    free whitespace) forced."""
    return json.dumps({**closed_objects(schema), "x-guidance": _COMPACT})


def _lark_literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: double quotes, backslash escapes


def grammar_source(spec: ConstraintSpec) -> str:
    """The llguidance grammar (Lark with ``%json``) that admits exactly ``spec``'s outputs."""
    if spec.kind in ("json_object", "json_schema"):
        assert spec.schema is not None
        return llguidance.LLMatcher.grammar_from_lark(
            f"start: %json {_compact_schema(spec.schema)}"
        )
    rules: list[str] = []
    calls: list[str] = []
    for i, tool in enumerate(spec.callable_tools):
        head = f"{CALL_OPEN}{_HEAD}{json.dumps(tool.name)}{_ARGS}"
        rules.append(f"call_{i}: {_lark_literal(head)} args_{i} {_lark_literal(_TAIL)}")
        rules.append(f"args_{i}: %json {_compact_schema(tool.parameters)}")
        calls.append(f"call_{i}")
    lines = [f"call: {' | '.join(calls)}", *rules]
    if spec.kind == "tool_auto":
        if spec.schema is not None:
            lines.insert(0, f"text: %json {_compact_schema(spec.schema)}")
        else:
            # free text, which must not start with "<" (that is a call's first character)
            lines.insert(0, r"text: /[^<](.|\n)*/")
        lines.insert(0, "start: call | text")
    else:
        lines.insert(0, "start: call")
    return llguidance.LLMatcher.grammar_from_lark("\n".join(lines))


def llguidance_tokenizer(tokenizer_json: str, eos_token_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a ``tokenizers`` vocabulary.

    SmolLM2's tokenizer.json decodes through a Sequence (ByteFallback, Fuse, Replace,
    ByteLevel); llguidance recognises byte-level BPE only from a plain ByteLevel decoder
    and would otherwise read ``Ġ`` and ``Ċ`` as themselves (a raw newline inside a JSON
    string would then pass as ``Ċ``). The decoder is rewritten for it when its last step
    is ByteLevel.
    """
    data = json.loads(tokenizer_json)
    decoder = data.get("decoder") or {}
    if decoder.get("type") == "Sequence":
        steps = decoder.get("decoders") or []
        if steps and steps[-1].get("type") == "ByteLevel":
            data["decoder"] = steps[-1]
    return llguidance.LLTokenizer(json.dumps(data), eos_token=list(eos_token_ids))


class GrammarMatcher:
    """One sequence's grammar state: which tokens may come next, and what came."""

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, numbers: NumberCap | None = None
    ) -> None:
        self._matcher = matcher
        self._vocab = vocab_size
        self._numbers = numbers  # caps JSON numbers' digits (None: the grammar alone)
        self._bits = np.full(((vocab_size + 31) // 32,), -1, dtype=np.int32)
        self.mask_s = 0.0  # time spent computing masks (for metrics and the benchmark)

    def allowed(self) -> npt.NDArray[np.bool_]:
        """The tokens the grammar admits next (a boolean row over the vocabulary), less
        those that would run a JSON number past its cap of digits."""
        t0 = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab]
        allowed = bits.astype(bool)
        if self._numbers is not None:
            allowed = self._numbers.restrict(allowed)
        self.mask_s += time.perf_counter() - t0
        return allowed

    def apply(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``logits`` with every token the grammar refuses at minus infinity (a copy; logits
        past the tokenizer's vocabulary, if the model has any, are refused too)."""
        allowed = self.allowed()
        masked = np.full_like(logits, -np.inf)
        n = min(self._vocab, logits.shape[-1])
        np.copyto(masked[:n], logits[:n], where=allowed[:n])
        return masked

    def advance(self, token: int) -> bool:
        """Consume one token; False when the grammar refuses it (the matcher is then in error)."""
        if self._numbers is not None:
            self._numbers.consume(token)
        return bool(self._matcher.consume_token(token))

    def accepts(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar admits from here (nothing is consumed)."""
        return int(self._matcher.validate_tokens(tokens))

    @property
    def finished(self) -> bool:
        """The grammar admits nothing more: the output is complete."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self._matcher.get_error()) if self._matcher.is_error() else ""


@dataclass(frozen=True)
class CompiledGrammar:
    """A spec's grammar, compiled for one tokenizer; hands each sequence its own matcher."""

    spec: ConstraintSpec
    _start: llguidance.LLMatcher
    _vocab_size: int
    _digits: DigitTokens
    compile_s: float

    @property
    def key(self) -> str:
        return self.spec.key

    def new_matcher(self) -> GrammarMatcher:
        # tool_auto without a JSON response_format: its text answer is free text, not JSON
        free_text = self.spec.kind == "tool_auto" and self.spec.schema is None
        numbers = NumberCap(self._digits, free_text_unless_call=free_text)
        return GrammarMatcher(self._start.deep_copy(), self._vocab_size, numbers)

    def check_prefix(self, token_ids: list[int], param: str) -> None:
        """A resumed stream's delivered tokens must be a prefix the grammar admits."""
        matcher = self.new_matcher()
        if matcher.accepts(token_ids) != len(token_ids):
            raise InvalidRequestError(
                "continue_token_ids are not a prefix of an output the request's "
                "response_format/tools admit",
                param=param,
            )


def _param_of(spec: ConstraintSpec) -> str:
    return "response_format" if spec.kind in ("json_object", "json_schema") else "tools"


class GrammarCompiler:
    """Compiles and caches grammars for one model's vocabulary, off the event loop."""

    def __init__(
        self,
        tokenizer_json: str | Callable[[], str],
        eos_token_ids: list[int],
        vocab_size: int,
    ) -> None:
        # a model's served tokenizer gives its JSON when the first grammar needs it: kept
        # as text from the start it held 8 MiB for Qwen2.5-Coder (2 for SmolLM2) in every
        # agent, most of which never compile a grammar
        self._tokenizer_json = tokenizer_json
        self._eos = list(eos_token_ids)
        self._vocab_size = vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._digits: DigitTokens | None = None  # read with the tokenizer, for number caps
        self._tokenizer_lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar | InvalidSchemaError] = OrderedDict()
        # one thread: a flood of slow schemas waits its turn instead of taking every thread
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")

    def _llg_tokenizer(self) -> tuple[llguidance.LLTokenizer, DigitTokens]:
        with self._tokenizer_lock:
            if self._tokenizer is None or self._digits is None:
                source = self._tokenizer_json
                tokenizer = llguidance_tokenizer(
                    source() if callable(source) else source, self._eos
                )
                self._digits = DigitTokens.of(tokenizer, self._vocab_size)
                self._tokenizer = tokenizer
            return self._tokenizer, self._digits

    def compile_now(self, spec: ConstraintSpec) -> CompiledGrammar:
        """Compiles on the calling thread (the benchmark and the worker use it); over
        :data:`COMPILE_TIMEOUT_S` of compiling is a 400 (the vocabulary's one-time
        preparation is not counted)."""
        tokenizer, digits = self._llg_tokenizer()
        started = time.perf_counter()
        source = grammar_source(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, tokenizer)
        param = _param_of(spec)
        if is_error:
            raise InvalidSchemaError(
                f"the {param} schema cannot be compiled: {messages[0] if messages else ''}",
                param=param,
            )
        matcher = llguidance.LLMatcher(tokenizer, source, log_level=0)
        if matcher.is_error():
            raise InvalidSchemaError(
                f"the {param} schema cannot be compiled: {matcher.get_error()}", param=param
            )
        # the first mask builds the lexer states the start needs: pay for it here, on the
        # compile thread, rather than in the first decode step of every new grammar
        GrammarMatcher(matcher.deep_copy(), self._vocab_size).allowed()
        spent = time.perf_counter() - started
        if spent > COMPILE_TIMEOUT_S:
            raise InvalidSchemaError(
                f"the {param} schema took {spent:.1f} s to compile (the limit is "
                f"{COMPILE_TIMEOUT_S:g} s); simplify it",
                param=param,
            )
        return CompiledGrammar(spec, matcher, self._vocab_size, digits, spent)

    async def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        """The spec's grammar, from the cache or compiled on the worker thread; a 400
        (:class:`InvalidSchemaError`) when it cannot be compiled within the time limit."""
        key = spec.key
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            if isinstance(hit, InvalidSchemaError):
                raise InvalidSchemaError(hit.message, param=hit.param)
            return hit
        loop = asyncio.get_running_loop()
        if self._tokenizer is None:  # once per model: llguidance reads the vocabulary
            await loop.run_in_executor(self._executor, self._llg_tokenizer)
        future = loop.run_in_executor(self._executor, self.compile_now, spec)
        try:
            compiled: CompiledGrammar | InvalidSchemaError = await asyncio.wait_for(
                asyncio.shield(future), WAIT_TIMEOUT_S
            )
        except InvalidSchemaError as exc:
            compiled = exc
        except TimeoutError as exc:
            # the compilation goes on in its thread; its result is dropped when it ends (and
            # not cached: the wait may have been a queue of other compilations)
            future.add_done_callback(lambda f: f.exception())
            raise InvalidSchemaError(
                f"the {_param_of(spec)} schema was not compiled within {WAIT_TIMEOUT_S:g} s; "
                "simplify it",
                param=_param_of(spec),
            ) from exc
        self._cache[key] = compiled
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        if isinstance(compiled, InvalidSchemaError):
            raise InvalidSchemaError(compiled.message, param=compiled.param)
        log.debug("compiled a %s grammar in %.3f s", spec.kind, compiled.compile_s)
        return compiled

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
