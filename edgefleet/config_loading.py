"""Reading a process's settings: one rule for the agent and the coordinator.

Each process declares its settings once, as a pydantic-settings model built from
:class:`ProcessSettings` (sections are :class:`Settings` models). pydantic-settings reads
and merges the sources, later ones winning::

    defaults (the model) < TOML file < environment < command-line flags

- File: ``--config FILE``, else ``$<PREFIX>CONFIG``. Sections are TOML tables.
- Environment: the model's ``env_prefix`` followed by the dotted key in upper case, a
  double underscore between a section and its key: ``engine.max_running`` is
  ``EDGEFLEET_AGENT_ENGINE__MAX_RUNNING``, ``log_level`` is ``EDGEFLEET_AGENT_LOG_LEVEL``,
  ``grpc_port`` is ``EDGEFLEET_COORDINATOR_GRPC_PORT``.
- Flags (argparse): a few named flags (``--port``), and ``--set KEY=VALUE`` with the dotted
  key for any; what was given is the highest-priority source.

Text from the environment and flags is converted to the key's type; lists are
comma-separated. A key no model declares is an error from every source. Every error is
one line naming the source, the dotted key, the value and what the key allows.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

M = TypeVar("M", bound="ProcessSettings")


def split_commas(value: Any) -> Any:
    return (
        tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value
    )


def _folded(fold: Callable[[str], str]) -> BeforeValidator:
    return BeforeValidator(lambda value: fold(value.strip()) if isinstance(value, str) else value)


Lower, Upper = _folded(str.lower), _folded(str.upper)  # text read in any case, trimmed
# A list of strings; from the environment or a flag, comma-separated.
Names = Annotated[tuple[str, ...], BeforeValidator(split_commas)]
Switch = Annotated[Literal["auto", "on", "off"], Lower]


class Settings(BaseModel):
    """Base of every settings section: frozen, a misspelt key is an error, defaults (often
    another module's) are checked like any value, and the docstring under a setting is its
    description."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, use_attribute_docstrings=True
    )


class ProcessSettings(BaseSettings):
    """Base of a process's settings. Built in code, it holds what it is given and nothing
    else; :func:`load_settings` adds the file, the environment and the flags."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=True,  # each setting's description: the docstring below it
        env_nested_delimiter="__",
        enable_decoding=False,  # lists are comma-separated text, not JSON
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


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


def env_name(prefix: str, key: str) -> str:
    return prefix + key.replace(".", "__").upper()


def default_of(model: type[BaseModel], key: str) -> Any:
    value: Any = model()
    for part in key.split("."):
        value = getattr(value, part)
    return value


class _ConfigFile(TomlConfigSettingsSource):
    """The TOML file named at run time, which must exist and parse (pydantic-settings'
    own skips a missing file)."""

    def _read_files(self, files: Any, deep_merge: bool = False) -> dict[str, Any]:
        try:
            return self._read_file(Path(files))
        except FileNotFoundError:
            raise SettingsError(f"config file {files} does not exist") from None
        except OSError as exc:
            raise SettingsError(f"config file {files} cannot be read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {files} is not valid TOML: {exc}") from None


class _Environment(EnvSettingsSource):
    """The variables of ``environ`` (checked: each names a setting), not ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = {name.lower(): value for name, value in environ.items()}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._environ


def load_settings(
    model: type[M],
    *,
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
    prefix = model.model_config.get("env_prefix", "")
    known = dict(leaf_fields(model))
    tables = {key[:i] for key in known for i, char in enumerate(key) if char == "."}
    origin: dict[str, str] = {}  # dotted key -> the source its value comes from

    def check(settings: Iterable[tuple[str, Any]], where: Callable[[str], str]) -> dict[str, Any]:
        """``settings`` by dotted key, each one known and recorded as from ``where(key)``."""
        found: dict[str, Any] = {}
        for key, value in settings:
            if key not in known:
                hint = _suggest(key, known) if key not in tables else " (a section: set its keys)"
                raise error(f"{where(key)}: unknown setting {key!r}{hint}")
            if isinstance(value, bool) and not _accepts_bool(known[key]):
                raise error(f"{where(key)}: {key}: got {value!r}, expected {describe(known[key])}")
            found[key], origin[key] = value, where(key)
        return found

    config_env = prefix + "CONFIG"
    if path is None and environ.get(config_env):
        path = Path(environ[config_env])
    sources: list[PydanticBaseSettingsSource] = []
    if path is not None:
        source = f"config file {path}"
        try:
            file = _ConfigFile(model, toml_file=path)
        except SettingsError as exc:
            raise error(str(exc)) from None
        settings = check(_flatten(file.toml_data, tables, error, source), lambda _: source)
        file.init_kwargs = _nest(settings)  # as checked: a quoted "section.key" is the key
        sources.append(file)
    by_env = {env_name(prefix, key): key for key in known}
    ours = {name: value for name, value in environ.items() if name.startswith(prefix)}
    ours.pop(config_env, None)
    for name in sorted(ours):
        if name not in by_env:
            near = difflib.get_close_matches(name, [*by_env, config_env], n=1, cutoff=0.8)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise error(f"environment variable {name}: no such setting{hint}")
        origin[by_env[name]] = f"environment variable {name}"
    sources.append(_Environment(model, ours))
    flag_of = {f.key: f.flag for f in flags}
    given = _flatten(overrides or {}, tables, error, "flags")
    given = ((key.replace("-", "_"), value) for key, value in given if value is not None)
    by_flag = check(given, lambda key: f"flag {flag_of.get(key, '--set ' + key)}")
    sources.append(InitSettingsSource(model, init_kwargs=_nest(by_flag)))
    try:
        # BaseSettings' own argument, unknown to the __init__ mypy derives from the fields
        return model(_build_sources=(tuple(reversed(sources)), {}))  # type: ignore[call-arg]
    except ValidationError as exc:
        raise error(explain(exc, model, origin)) from None


def explain(exc: ValidationError, model: type[BaseModel], sources: Mapping[str, str]) -> str:
    """The first problem of ``exc`` in one line: source, dotted key, value, what is allowed."""
    first = exc.errors(include_url=False)[0]
    key = ".".join(str(part) for part in first["loc"] if isinstance(part, str))
    known = dict(leaf_fields(model))
    while "." in key and key not in known:  # an item of a table or list: its setting
        key = key.rpartition(".")[0]
    source = sources.get(key)
    if first["type"] == "value_error":  # a check across keys: its message names them
        message = str(first["msg"]).removeprefix("Value error, ")
        return ": ".join(part for part in (source, key, message) if part)
    field = known.get(key)
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
    text = _describe_type(kind)
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
        text = "a non-empty " + text.removeprefix("a ")
    return text + (", or unset" if optional else "")


def _describe_type(kind: Any) -> str:
    while get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(kind))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(repr(member.value) for member in kind)
    if get_origin(kind) is tuple:
        item = _describe_type(get_args(kind)[0])
        return "a list of strings" if item == "a string" else f"a list, each {item}"
    if get_origin(kind) is dict:
        return f"a table of names to {_describe_type(get_args(kind)[1]).removeprefix('a ')}"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words.get(kind, str(kind))


def add_arguments(
    parser: argparse.ArgumentParser,
    model: type[ProcessSettings],
    flags: Sequence[Flag],
    *,
    example: str,
) -> None:
    """``--config``, the named ``flags`` and ``--set`` for ``model``'s keys."""
    known = dict(leaf_fields(model))
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"TOML config file (default: ${model.model_config.get('env_prefix')}CONFIG, "
        "else none)",
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
        # A table-valued setting replaces a lower source's whole, as any value does (not a
        # dict, so pydantic-settings does not merge the two).
        node[name] = MappingProxyType(value) if isinstance(value, dict) else value
    return nested
