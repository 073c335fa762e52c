"""Reading a process's settings: one rule for the agent and the coordinator.

Each process declares its settings once, as a pydantic model built from :class:`Settings`
(sections are nested models). Sources, later ones winning::

    defaults (the model) < TOML file < environment < command-line flags

- File: ``--config FILE``, else ``$<PREFIX>CONFIG``. Sections are TOML tables.
- Environment: ``<PREFIX>`` followed by the dotted key in upper case, a double underscore
  between a section and its key: ``engine.max_running`` is ``EDGEFLEET_AGENT_ENGINE__MAX_RUNNING``,
  ``log_level`` is ``EDGEFLEET_AGENT_LOG_LEVEL``, ``grpc_port`` is
  ``EDGEFLEET_COORDINATOR_GRPC_PORT``.
- Flags: a few named flags (``--port``), and ``--set KEY=VALUE`` with the dotted key for any.

Text from the environment and flags is converted to the key's type; lists are
comma-separated. A key no model declares is an error from every source. Every error is
one line naming the source, the dotted key, the value and what the key allows.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

M = TypeVar("M", bound="Settings")


def _split_commas(value: Any) -> Any:
    return (
        tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value
    )


# A list of strings; from the environment or a flag, comma-separated.
Names = Annotated[tuple[str, ...], BeforeValidator(_split_commas)]


class Settings(BaseModel):
    """Base of every settings model and section: frozen, a misspelt key is an error, and
    defaults (often another module's) are checked like any value."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


@dataclass(frozen=True, slots=True)
class Flag:
    """A named command-line flag for one key (``--set KEY=VALUE`` reaches every key)."""

    flag: str
    key: str
    metavar: str | None = None
    repeat: bool = False  # may be given several times; the values form a list
    default: str = ""  # the default in words, when the model's value does not say it


def leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted key, field) for every setting, sections flattened."""
    for name, info in model.model_fields.items():
        section = _section(info)
        if section is None:
            yield prefix + name, info
        else:
            yield from leaf_fields(section, f"{prefix}{name}.")


def sections(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        section = _section(info)
        if section is not None:
            yield prefix + name
            yield from sections(section, f"{prefix}{name}.")


def env_name(prefix: str, key: str) -> str:
    return prefix + key.replace(".", "__").upper()


def default_of(model: type[BaseModel], key: str) -> Any:
    value: Any = model()
    for part in key.split("."):
        value = getattr(value, part)
    return value


def load_settings(
    model: type[M],
    *,
    prefix: str,
    error: Callable[[str], Exception],
    path: Path | None = None,
    environ: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    flags: Sequence[Flag] = (),
) -> M:
    """Build ``model`` from defaults < ``path`` < ``environ`` < ``overrides`` (flags).

    ``path`` falls back to ``$<prefix>CONFIG``. ``overrides`` holds dotted keys or nested
    dicts; None values (a flag not given) are skipped. Raises ``error(message)``.
    """
    known = dict(leaf_fields(model))
    tables = set(sections(model))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: Any, source: str) -> None:
        if key not in known:
            hint = _suggest(key, known) if key not in tables else " (a section: set its keys)"
            raise error(f"{source}: unknown setting {key!r}{hint}")
        field = known[key]
        if isinstance(value, bool) and not _accepts_bool(field):
            raise error(f"{source}: {key}: got {value!r}, expected {describe(field)}")
        values[key], sources[key] = value, source

    config_env = prefix + "CONFIG"
    if path is None and environ.get(config_env):
        path = Path(environ[config_env])
    if path is not None:
        for key, value in _flatten(_read_toml(path, error), tables, error, f"config file {path}"):
            put(key, value, f"config file {path}")
    by_env = {env_name(prefix, key): key for key in known}
    for name, value in sorted(environ.items()):
        if not name.startswith(prefix) or name == config_env:
            continue
        if name not in by_env:
            near = difflib.get_close_matches(name, [*by_env, config_env], n=1, cutoff=0.8)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise error(f"environment variable {name}: no such setting{hint}")
        put(by_env[name], value, f"environment variable {name}")
    flag_of = {f.key: f.flag for f in flags}
    for key, value in _flatten(overrides or {}, tables, error, "flags"):
        if value is not None:
            key = key.replace("-", "_")
            put(key, value, f"flag {flag_of.get(key, '--set ' + key)}")
    try:
        return model.model_validate(_nest(values))
    except ValidationError as exc:
        raise error(explain(exc, model, sources)) from None


def explain(exc: ValidationError, model: type[BaseModel], sources: Mapping[str, str]) -> str:
    """The first problem of ``exc`` in one line: source, dotted key, value, what is allowed."""
    first = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in first["loc"] if isinstance(part, str))
    source = sources.get(key)
    if first["type"] == "value_error":  # a check across keys: its message names them
        message = str(first["msg"]).removeprefix("Value error, ")
        return ": ".join(part for part in (source, key, message) if part)
    field = dict(leaf_fields(model)).get(key)
    if field is None:
        return f"{source or 'config'}: {key}: {first['msg']}"
    return f"{source or 'config'}: {key}: got {first['input']!r}, expected {describe(field)}"


_BOUNDS = ((at.Ge, ">=", "ge"), (at.Gt, ">", "gt"), (at.Le, "<=", "le"), (at.Lt, "<", "lt"))


def describe(field: FieldInfo) -> str:
    """What a key accepts, in words: its type, its choices, its range."""
    kind, optional = field.annotation, False
    if get_origin(kind) in (Union, types.UnionType):
        optional = type(None) in get_args(kind)
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(kind))
    words: dict[Any, str] = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
    }
    text = words.get(kind, "a list of strings" if get_origin(kind) is tuple else str(kind))
    bounds = {
        attr: (op, getattr(m, attr))
        for m in field.metadata
        for cls, op, attr in _BOUNDS
        if isinstance(m, cls)
    }
    if "ge" in bounds and "le" in bounds:
        text += f" in {bounds['ge'][1]}..{bounds['le'][1]}"
    elif bounds:
        text += " " + " and ".join(f"{op} {limit}" for op, limit in bounds.values())
    if any(isinstance(m, at.MinLen) for m in field.metadata):
        text = "a non-empty string"
    return text + (", or unset" if optional else "")


def add_arguments(
    parser: argparse.ArgumentParser,
    model: type[Settings],
    flags: Sequence[Flag],
    *,
    env_prefix: str,
    example: str,
) -> None:
    """``--config``, the named ``flags`` and ``--set`` for ``model``'s keys."""
    known = dict(leaf_fields(model))
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"TOML config file (default: ${env_prefix}CONFIG, else none)",
    )
    for f in flags:
        default = default_of(model, f.key)
        allowed = describe(known[f.key])
        parser.add_argument(
            f.flag,
            dest=f.key,
            metavar=f.metavar,
            action="append" if f.repeat else "store",
            help=f"{f.key}: {allowed} (default {f.default or repr(default)})",
        )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"set any key, e.g. --set {example}",
    )


def overrides_from_args(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, Any]:
    """Dotted key -> value for the flags given (``--set`` after the named flags).

    Raises ValueError for a ``--set`` without ``=``.
    """
    found: dict[str, Any] = {}
    for f in flags:
        value = getattr(args, f.key, None)
        if value is not None:
            found[f.key] = value
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        found[key.strip()] = value
    return found


def _section(info: FieldInfo) -> type[BaseModel] | None:
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _accepts_bool(field: FieldInfo) -> bool:
    kind = field.annotation
    return kind is bool or (get_origin(kind) in (Union, types.UnionType) and bool in get_args(kind))


def _suggest(key: str, known: Mapping[str, Any]) -> str:
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _flatten(
    data: Mapping[str, Any],
    tables: set[str],
    error: Callable[[str], Exception],
    source: str,
    prefix: str = "",
) -> Iterator[tuple[str, Any]]:
    for name, value in data.items():
        key = prefix + name
        if key in tables:
            if not isinstance(value, Mapping):
                raise error(f"{source}: {key}: got {value!r}, expected a table of settings")
            yield from _flatten(value, tables, error, source, key + ".")
        else:
            yield key, value


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, name = key.split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return nested


def _read_toml(path: Path, error: Callable[[str], Exception]) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise error(f"config file {path} does not exist") from None
    except OSError as exc:
        raise error(f"config file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"config file {path} is not valid TOML: {exc}") from None
