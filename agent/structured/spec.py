"""What a request constrains its output to: parsed from ``response_format``, ``tools`` and
``tool_choice`` into one :class:`ConstraintSpec`, before anything is compiled or decoded.

Kinds of constraint:

- ``json_object``: any JSON object (compact: no whitespace between tokens).
- ``json_schema``: JSON that validates against the request's schema (compact, properties in
  the schema's order).
- ``tool_required`` / ``tool_named``: exactly one call to one of the tools (the named one),
  written as ``<tool_call>{"name":NAME,"arguments":ARGS}</tool_call>`` with ARGS valid for
  that tool's parameters (see :mod:`agent.structured.tool_calls`).
- ``tool_auto``: either a text answer (which must not start with ``<``) or one call as
  above; the model's first token decides. With a JSON ``response_format`` the text answer
  is that JSON.

The same spec validates an output after the fact (:func:`validate_constrained_output`):
the overflow path uses it on what a remote target returned.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema_rs

from agent.errors import InvalidOutputError, InvalidRequestError, InvalidSchemaError
from agent.structured.tool_calls import ToolSpec, parse_tool_call

ConstraintKind = Literal["json_object", "json_schema", "tool_required", "tool_named", "tool_auto"]

#: A schema (response_format's, or all tools' parameters together) serialized larger than
#: this is refused with a 400 before anything is compiled.
MAX_SCHEMA_BYTES = 64 * 1024
#: Tools per request.
MAX_TOOLS = 64
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ConstraintSpec:
    """A request's output constraint (see the module docstring for the kinds)."""

    kind: ConstraintKind
    schema: dict[str, Any] | None = field(default=None, repr=False)  # the JSON modes' schema
    schema_name: str | None = None  # response_format.json_schema.name
    tools: tuple[ToolSpec, ...] = ()
    tool_name: str | None = None  # tool_named: the only tool the model may call

    @property
    def constrained(self) -> bool:
        """Always true: a request without a constraint has no spec (None)."""
        return True

    @property
    def calls_tools(self) -> bool:
        return self.kind in ("tool_required", "tool_named", "tool_auto")

    @property
    def callable_tools(self) -> tuple[ToolSpec, ...]:
        """The tools the output may call: the named one, or all of them."""
        if self.kind == "tool_named":
            return tuple(t for t in self.tools if t.name == self.tool_name)
        return self.tools if self.calls_tools else ()

    def canonical(self) -> dict[str, Any]:
        """Everything about the constraint that changes the output (response cache key)."""
        return {
            "kind": self.kind,
            "schema": self.schema,
            "tools": [[t.name, t.description, t.parameters] for t in self.tools],
            "tool_name": self.tool_name,
        }

    @property
    def key(self) -> str:
        """A digest of :meth:`canonical`."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _schema_size_checked(schema: Any, param: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise InvalidSchemaError(f"{param} must be a JSON object (a JSON Schema)", param=param)
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise InvalidSchemaError(
            f"{param} is {size} bytes serialized; schemas up to {MAX_SCHEMA_BYTES} bytes are "
            "accepted",
            param=param,
        )
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        first = str(exc).split("\n", 1)[0]
        raise InvalidSchemaError(
            f"{param} is not a valid JSON Schema: {first}", param=param
        ) from exc
    except Exception as exc:  # a $ref that cannot be resolved, an unknown draft
        raise InvalidSchemaError(f"{param} is not a valid JSON Schema: {exc}", param=param) from exc
    return schema


def parse_response_format(response_format: dict[str, Any] | None) -> ConstraintSpec | None:
    """``response_format`` as OpenAI defines it: text (None), json_object or json_schema."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object", schema=dict(_OBJECT_SCHEMA))
    if kind != "json_schema":
        raise InvalidRequestError(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}",
            param="response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequestError(
            "response_format.json_schema is required with type json_schema",
            param="response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise InvalidRequestError(
            "response_format.json_schema.name must be 1 to 64 letters, digits, _ or -",
            param="response_format.json_schema.name",
        )
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise InvalidRequestError(
            "response_format.json_schema.strict must be a boolean",
            param="response_format.json_schema.strict",
        )
    # strict or not, the output is constrained to the schema (strict: true is what we do)
    schema = spec.get("schema", _OBJECT_SCHEMA)
    schema = _schema_size_checked(schema, "response_format.json_schema.schema")
    return ConstraintSpec("json_schema", schema=schema, schema_name=name)


def _parse_tools(tools: list[Any]) -> tuple[ToolSpec, ...]:
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"at most {MAX_TOOLS} tools are accepted", param="tools")
    parsed: list[ToolSpec] = []
    total = 0
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidRequestError(
                f"{where}.type must be 'function' (the only tool type)", param=f"{where}.type"
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequestError(f"{where}.function is required", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidRequestError(
                f"{where}.function.name must be 1 to 64 letters, digits, _ or -",
                param=f"{where}.function.name",
            )
        if any(t.name == name for t in parsed):
            raise InvalidRequestError(
                f"two tools are named {name!r}", param=f"{where}.function.name"
            )
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise InvalidRequestError(
                f"{where}.function.description must be a string",
                param=f"{where}.function.description",
            )
        parameters = function.get("parameters", _OBJECT_SCHEMA)
        parameters = _schema_size_checked(parameters, f"{where}.function.parameters")
        total += len(json.dumps(parameters, separators=(",", ":")))
        if total > MAX_SCHEMA_BYTES:
            raise InvalidSchemaError(
                f"the tools' parameters are over {MAX_SCHEMA_BYTES} bytes together",
                param="tools",
            )
        parsed.append(ToolSpec(name, description, parameters))
    return tuple(parsed)


def parse_constraint(
    *,
    response_format: dict[str, Any] | None,
    tools: list[Any] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    functions: list[Any] | None = None,
) -> ConstraintSpec | None:
    """The request's constraint, or None for free text. Raises a 400 naming the field."""
    if functions:
        raise InvalidRequestError(
            "functions (deprecated) is not supported; use tools", param="functions"
        )
    text_spec = parse_response_format(response_format)
    parsed_tools = _parse_tools(tools) if tools else ()
    if tool_choice is None:
        choice: str = "auto" if parsed_tools else "none"
        named = None
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise InvalidRequestError(
                f"tool_choice must be none, auto, required or a named function, got "
                f"{tool_choice!r}",
                param="tool_choice",
            )
        choice, named = tool_choice, None
    else:
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidRequestError(
                'a named tool_choice is {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        choice, named = "named", name
    if choice != "none" and not parsed_tools:
        raise InvalidRequestError(f"tool_choice {choice!r} needs tools", param="tool_choice")
    if named is not None and all(t.name != named for t in parsed_tools):
        raise InvalidRequestError(
            f"tool_choice names {named!r}, which is not among the tools", param="tool_choice"
        )
    if choice == "none":
        return text_spec
    if choice == "auto":
        return ConstraintSpec(
            "tool_auto",
            schema=text_spec.schema if text_spec else None,
            schema_name=text_spec.schema_name if text_spec else None,
            tools=parsed_tools,
        )
    if choice == "required":
        return ConstraintSpec("tool_required", tools=parsed_tools)
    return ConstraintSpec("tool_named", tools=parsed_tools, tool_name=named)


def _validate_json(schema: dict[str, Any], text: str, what: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidOutputError(f"{what} is not JSON: {exc}") from exc
    error = next(iter(jsonschema_rs.validator_for(schema).iter_errors(value)), None)
    if error is not None:
        raise InvalidOutputError(f"{what} does not validate: {str(error).split(chr(10), 1)[0]}")
    return value


def validate_constrained_output(spec: ConstraintSpec, text: str) -> None:
    """Raises :class:`InvalidOutputError` unless ``text`` is an output ``spec`` admits: JSON
    that validates (JSON modes), one well-formed call whose arguments validate (tool modes),
    or, for ``tool_auto``, a text answer that does not start with ``<`` (validated as JSON
    too when a JSON response_format came with the tools)."""
    if spec.kind in ("json_object", "json_schema"):
        assert spec.schema is not None
        value = _validate_json(spec.schema, text, "the output")
        if spec.kind == "json_object" and not isinstance(value, dict):
            raise InvalidOutputError("the output is not a JSON object")
        return
    call = parse_tool_call(text, spec.callable_tools)
    if call is None:
        if spec.kind != "tool_auto" or text.startswith("<"):
            raise InvalidOutputError("the output is not a tool call")
        if spec.schema is not None:
            _validate_json(spec.schema, text, "the output")
        return
    tool = next(t for t in spec.callable_tools if t.name == call.name)
    _validate_json(tool.parameters, call.arguments, f"the arguments of {call.name}")
