"""The structured-output pieces on their own: specs, output validation (what the overflow
path calls), the tool-call stream splitter, closed objects and the grammar compiler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from tokenizers import Tokenizer

import agent.structured.grammar as grammar
from agent.errors import InvalidOutputError, InvalidRequestError, InvalidSchemaError
from agent.structured import (
    CompiledGrammar,
    ConstraintSpec,
    GrammarCompiler,
    GrammarMatcher,
    parse_constraint,
    parse_response_format,
    validate_constrained_output,
)
from agent.structured.grammar import closed_objects
from agent.structured.number_cap import EXPONENT_DIGITS, FRACTION_DIGITS, INTEGER_DIGITS
from agent.structured.tool_calls import ToolCallStreamer, call_text

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}
TOOL = {
    "type": "function",
    "function": {"name": "move", "parameters": POINT},
}


def schema_spec(schema: dict[str, Any]) -> ConstraintSpec:
    spec = parse_response_format(
        {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    )
    assert spec is not None
    return spec


@pytest.fixture(scope="module")
def tokenizer(tiny_artifacts: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_artifacts / "tiny-llama" / "tokenizer.json"))


@pytest.fixture
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.to_str(), [2], tokenizer.get_vocab_size(True))


def test_a_served_models_tokenizer_json_is_read_when_a_grammar_first_needs_it(
    tokenizer: Tokenizer,
) -> None:
    """A model's grammar compiler asks for its tokenizer's JSON only when it compiles a
    first grammar (kept as text from the start, Qwen2.5-Coder's held 8 MiB in every
    agent), and once."""
    asked: list[int] = []

    def tokenizer_json() -> str:
        asked.append(1)
        return str(tokenizer.to_str())

    lazy = GrammarCompiler(tokenizer_json, [2], tokenizer.get_vocab_size(True))
    assert asked == []
    for _ in range(2):
        lazy.compile_now(schema_spec({"type": "string", "maxLength": 5}))
    assert asked == [1]


def test_parse_constraint_kinds_and_refusals() -> None:
    assert parse_constraint(response_format=None) is None
    assert parse_constraint(response_format={"type": "text"}) is None
    assert parse_constraint(response_format={"type": "json_object"}).kind == "json_object"  # type: ignore[union-attr]
    auto = parse_constraint(response_format=None, tools=[TOOL])
    assert auto is not None and auto.kind == "tool_auto"
    assert parse_constraint(response_format=None, tools=[TOOL], tool_choice="none") is None
    named = parse_constraint(
        response_format=None,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "move"}},
    )
    assert named is not None and [t.name for t in named.callable_tools] == ["move"]
    for kwargs, param in [
        ({"tools": [TOOL, TOOL]}, "tools.1.function.name"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
         "tools.0.function.parameters"),
    ]:  # fmt: skip
        with pytest.raises(InvalidRequestError) as raised:
            parse_constraint(response_format=None, **kwargs)  # type: ignore[arg-type]
        assert raised.value.param == param


def test_spec_key_changes_with_what_changes_the_output() -> None:
    a = schema_spec(POINT)
    assert a.key == schema_spec(json.loads(json.dumps(POINT))).key
    assert a.key != schema_spec({**POINT, "required": ["x"]}).key
    required = parse_constraint(response_format=None, tools=[TOOL], tool_choice="required")
    auto = parse_constraint(response_format=None, tools=[TOOL], tool_choice="auto")
    assert required is not None and auto is not None and required.key != auto.key


def test_validate_constrained_output_for_the_overflow_path() -> None:
    spec = schema_spec(POINT)
    validate_constrained_output(spec, '{"x":1,"y":2}')
    for bad in ('{"x":1}', '{"x":1,"y":', "hello"):
        with pytest.raises(InvalidOutputError):
            validate_constrained_output(spec, bad)
    obj = parse_constraint(response_format={"type": "json_object"})
    assert obj is not None
    with pytest.raises(InvalidOutputError):
        validate_constrained_output(obj, "[1]")
    required = parse_constraint(response_format=None, tools=[TOOL], tool_choice="required")
    assert required is not None
    validate_constrained_output(required, call_text("move", '{"x":1,"y":2}'))
    for bad in (call_text("move", '{"x":1}'), call_text("jump", '{"x":1,"y":2}'), "text"):
        with pytest.raises(InvalidOutputError):
            validate_constrained_output(required, bad)
    auto = parse_constraint(response_format=None, tools=[TOOL])
    assert auto is not None
    validate_constrained_output(auto, "Sure, here you go.")
    with pytest.raises(InvalidOutputError):
        validate_constrained_output(auto, "<tool_call>oops")


def test_tool_call_streamer_pieces_join_to_the_arguments() -> None:
    text = call_text("move", '{"x":12,"y":-3}')
    for size in (1, 3, 7, len(text)):
        streamer = ToolCallStreamer("call_1")
        pieces = []
        for i in range(0, len(text), size):
            content, new = streamer.feed(text[i : i + size])
            assert content == ""
            pieces += new
        pieces += streamer.finish()[1]
        assert pieces[0].id == "call_1" and pieces[0].name == "move"
        assert [p.id for p in pieces[1:]] == [None] * (len(pieces) - 1)
        assert "".join(p.arguments for p in pieces) == '{"x":12,"y":-3}'
    streamer = ToolCallStreamer("call_2")
    assert streamer.feed("Hello") == ("Hello", [])
    assert streamer.feed(" <b>") == (" <b>", [])  # text stays text
    assert streamer.finish() == ("", [])


def test_closed_objects_keep_outputs_valid_for_the_original() -> None:
    schema = {
        "type": "object",
        "properties": {"inner": POINT, "tags": {"type": "array", "items": POINT}},
        "allOf": [{"properties": {"z": {"type": "integer"}}}],
    }
    closed = closed_objects(schema)
    assert "additionalProperties" not in closed  # it uses allOf: left open
    assert closed["properties"]["inner"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["allOf"] == schema["allOf"]
    assert closed_objects({**POINT, "additionalProperties": True})["additionalProperties"] is True
    original = jsonschema_rs.validator_for(schema)
    assert original.is_valid({"inner": {"x": 1, "y": 2}, "tags": []})
    assert not jsonschema_rs.validator_for(closed).is_valid({"inner": {"x": 1, "y": 2, "q": 1}})


async def test_compiler_caches_and_refuses_with_the_field_named(
    compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = schema_spec(POINT)
    first = await compiler.compile(spec)
    assert await compiler.compile(schema_spec(POINT)) is first  # cached
    bad = schema_spec({"type": "string", "pattern": "^(?=a)a$"})
    with pytest.raises(InvalidSchemaError) as raised:
        await compiler.compile(bad)
    assert raised.value.param == "response_format"
    monkeypatch.setattr(grammar, "COMPILE_TIMEOUT_S", 0.0)  # every compilation is too slow
    slow = schema_spec({**POINT, "required": ["x"]})
    with pytest.raises(InvalidSchemaError, match="to compile") as raised:
        await compiler.compile(slow)
    assert raised.value.param == "response_format"
    compiler.close()


def test_byte_level_vocabulary_is_read_as_bytes(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    """SmolLM2's decoder is a Sequence ending in ByteLevel: read naively, the token for a
    newline ("Ċ") would pass as a letter inside a JSON string."""
    compiled = compiler.compile_now(schema_spec({"type": "string", "maxLength": 20}))
    ok = tokenizer.encode('"a b"', add_special_tokens=False).ids
    assert compiled.new_matcher().accepts(ok) == len(ok)
    raw_newline = tokenizer.encode('"a\nb"', add_special_tokens=False).ids
    assert compiled.new_matcher().accepts(raw_newline) < len(raw_newline)
    escaped = tokenizer.encode('"a\\nb"', add_special_tokens=False).ids
    assert compiled.new_matcher().accepts(escaped) == len(escaped)
    compiler.close()


def _digit_initial(tokenizer: Tokenizer) -> list[int]:
    """Every token whose text starts with an ASCII digit (read from the tokenizer itself)."""
    firsts = (
        tokenizer.decode([i], skip_special_tokens=False)[:1]
        for i in range(tokenizer.get_vocab_size(True))
    )
    return [i for i, first in enumerate(firsts) if first and first in "0123456789"]


def _fed(compiled: CompiledGrammar, tokenizer: Tokenizer, *texts: str) -> GrammarMatcher:
    """A new matcher of ``compiled`` that consumed ``texts`` (each encoded on its own)."""
    matcher = compiled.new_matcher()
    for text in texts:
        for token in tokenizer.encode(text, add_special_tokens=False).ids:
            assert matcher.advance(token), text
    return matcher


def test_json_numbers_are_capped_digits_in_strings_are_not(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    """A greedy small model writes 0.1111... until max_tokens; past 17 fraction digits (20
    integer, 3 exponent) every token starting with a digit is refused, so the number ends."""
    digits = _digit_initial(tokenizer)
    assert len(digits) >= 10
    one = tokenizer.token_to_id("1")
    close, dot, e = (tokenizer.token_to_id(t) for t in ("}", ".", "e"))
    compiled = compiler.compile_now(
        schema_spec({"type": "object", "properties": {"x": {"type": "number"}}})
    )
    matcher = _fed(compiled, tokenizer, '{"x":0.')
    for _ in range(FRACTION_DIGITS):
        allowed = matcher.allowed()
        assert allowed[digits].all()  # below the cap: every digit is there
        assert matcher.advance(one)
    allowed = matcher.allowed()
    assert not allowed[digits].any()  # at the cap: no digit-initial token at all
    assert allowed[close] and allowed[e]  # the number can end, or take an exponent
    assert matcher.advance(close) and matcher.finished
    # the integer part at 20 digits, the exponent at 3
    for text, cap, after in (
        ('{"x":', INTEGER_DIGITS, dot),
        ('{"x":-1.5e+', EXPONENT_DIGITS, close),
    ):
        matcher = _fed(compiled, tokenizer, text, *["1"] * cap)
        allowed = matcher.allowed()
        assert not allowed[digits].any() and allowed[after], text
    # digits inside a string are never capped
    strings = compiler.compile_now(
        schema_spec({"type": "object", "properties": {"s": {"type": "string"}}})
    )
    matcher = _fed(strings, tokenizer, '{"s":"', *["1"] * 40, '\\"', *["2"] * 40)
    assert matcher.allowed()[digits].all()
    assert _fed(strings, tokenizer, '{"s":"', *["1"] * 40, '"}').finished
    compiler.close()


def test_number_cap_leaves_tool_auto_text_alone_and_caps_call_arguments(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    digits = _digit_initial(tokenizer)
    auto = parse_constraint(response_format=None, tools=[TOOL])
    assert auto is not None and auto.kind == "tool_auto"
    compiled = compiler.compile_now(auto)
    # a text answer is not JSON: a long digit run in it is never cut short
    matcher = _fed(compiled, tokenizer, "Room ", *["1"] * 60)
    assert matcher.allowed()[digits].all()
    # a call's arguments are JSON: an integer argument stops at 20 digits
    matcher = _fed(compiled, tokenizer, '<tool_call>{"name":"move","arguments":{"x":')
    for _ in range(INTEGER_DIGITS):
        assert matcher.allowed()[digits].all()
        assert matcher.advance(tokenizer.token_to_id("7"))
    allowed = matcher.allowed()
    assert not allowed[digits].any() and allowed[tokenizer.token_to_id(",")]
    compiler.close()


def test_number_cap_never_empties_the_mask(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    """A schema whose bounds need more digits than the cap keeps the grammar's mask: a
    number in (0, 1e-20] written without an exponent needs 20 zeros in its fraction."""
    schema = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e-20}
    compiled = compiler.compile_now(schema_spec(schema))
    matcher = _fed(compiled, tokenizer, "0.", *["0"] * FRACTION_DIGITS)
    zero = tokenizer.token_to_id("0")
    assert matcher.allowed()[zero]
    for token in [zero] * 3 + [tokenizer.token_to_id("1")]:
        assert matcher.advance(token)
    assert matcher.allowed()[2]  # 0.000000000000000000001 is complete: it may end here
    compiler.close()
