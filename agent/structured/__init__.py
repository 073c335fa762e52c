"""Structured outputs: constraint specs from requests, grammars, per-sequence matchers."""

from agent.structured.grammar import CompiledGrammar, GrammarCompiler, GrammarMatcher
from agent.structured.spec import (
    ConstraintSpec,
    parse_constraint,
    parse_response_format,
    validate_constrained_output,
)
from agent.structured.tool_calls import ToolSpec

__all__ = [
    "CompiledGrammar",
    "ConstraintSpec",
    "GrammarCompiler",
    "GrammarMatcher",
    "ToolSpec",
    "parse_constraint",
    "parse_response_format",
    "validate_constrained_output",
]
