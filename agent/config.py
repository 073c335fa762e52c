"""The agent's typed configuration: a TOML file, overridden by environment, then flags.

Every option has a default that works on a laptop. Environment variables are named
``EDGEFLEET_AGENT_<SECTION>_<KEY>`` (upper case), e.g. ``EDGEFLEET_AGENT_SERVER_PORT=8001``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from agent.errors import ConfigError

ENV_PREFIX = "EDGEFLEET_AGENT_"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # address the HTTP API listens on
    port: int = 8000  # port of the HTTP API (0 picks a free one)
    max_body_bytes: int = 1_048_576  # larger request bodies get 413
    public_url: str = ""  # URL clients use to reach this agent; default http://host:port


@dataclass(frozen=True)
class ModelsConfig:
    dir: str = "models/artifacts"  # where artifact directories (manifest.json each) live
    serve: tuple[str, ...] = ()  # artifact names to serve; empty serves all found
    verify_checksums: bool = True  # check sha256 of every file before loading


@dataclass(frozen=True)
class EngineConfig:
    intra_op_threads: int = 0  # ONNX Runtime threads per operator; 0 = one per core
    inter_op_threads: int = 1  # ONNX Runtime threads across operators
    execution_provider: str = "auto"  # auto (CUDA when present, else CPU), cpu or cuda
    max_context_tokens: int = 2048  # cap on prompt + completion per sequence
    default_max_tokens: int = 256  # completion length when a request names none
    max_running: int = 16  # sequences decoded together in one batched step
    max_batched_tokens: int = 256  # prompt tokens per step: a chunk, or short prompts together
    kv_budget_tokens: int = 32768  # cache tokens (prompt + max_tokens) reserved at once
    max_queue: int = 64  # waiting requests; more get 429
    max_queue_wait_s: float = 60.0  # longer in the queue gets 429
    request_timeout_s: float = 300.0  # default whole-request timeout (X-Request-Timeout)
    prefix_cache_bytes: int = 64 << 20  # keys/values of prompts' shared prefixes; 0: off


@dataclass(frozen=True)
class EmbeddingsConfig:
    max_batch_size: int = 32  # inputs per ONNX Runtime call, across requests
    max_queue_delay_us: int = 2000  # how long an input waits for others to batch with


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True  # exact-match response cache for deterministic requests
    max_bytes: int = 64 * 1024 * 1024  # least recently used entries go beyond this


@dataclass(frozen=True)
class CoordinatorLinkConfig:
    target: str = ""  # host:port of the coordinator's gRPC API; empty runs standalone
    join_token: str = ""  # join token for the first enrollment; empty: no enrollment
    enroll_target: str = ""  # host:port of the coordinator's Enroll port; empty = target
    tls: bool = False  # TLS to the coordinator (mutual TLS on the session once enrolled)
    ca_file: str = ""  # PEM of the coordinator's CA, trusted for the first enrollment
    state_dir: str = "~/.local/state/edgefleet/agent"  # where enrollment credentials live


@dataclass(frozen=True)
class MdnsConfig:
    enabled: bool = False  # advertise this agent on the LAN as _edgefleet._tcp (zeroconf)
    interfaces: tuple[str, ...] = ()  # IPv4 addresses to advertise on; empty = all


@dataclass(frozen=True)
class IdentityConfig:
    agent_id: str = ""  # stable id; empty derives one from the host name and port
    site: str = "default"  # site label (agents at one site are "near" each other)
    latitude: float = 0.0  # where the box is, for proximity routing
    longitude: float = 0.0


@dataclass(frozen=True)
class AgentConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    coordinator: CoordinatorLinkConfig = field(default_factory=CoordinatorLinkConfig)
    identity: IdentityConfig = field(default_factory=IdentityConfig)
    mdns: MdnsConfig = field(default_factory=MdnsConfig)
    log_level: str = "INFO"


T = TypeVar("T")


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Check (and for strings from the environment, convert) one value."""
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        kind = next(a for a in get_args(kind) if a is not type(None))
        origin = get_origin(kind)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(value)
    if kind is bool:
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind is int or kind is float:
        if isinstance(value, str):
            try:
                value = kind(value)
            except ValueError as exc:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from exc
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if kind is int and not float(value).is_integer():
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return kind(value)
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported option type {kind!r}")


def _build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown option(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        kind = hints[name]
        path = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: expected a table")
            values[name] = _build(cast(type[Any], kind), value, path)
        else:
            values[name] = _coerce(value, kind, path)
    return cls(**values)


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    hints = get_type_hints(AgentConfig)
    for name, kind in hints.items():
        if dataclasses.is_dataclass(kind):
            for sub in dataclasses.fields(kind):
                key = f"{ENV_PREFIX}{name}_{sub.name}".upper()
                if key in environ:
                    found.setdefault(name, {})[sub.name] = environ[key]
        else:
            key = f"{ENV_PREFIX}{name}".upper()
            if key in environ:
                found[name] = environ[key]
    return found


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """File < environment < ``overrides`` (nested dicts, as from the command line)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    data = _merge(data, _from_environment(os.environ if environ is None else environ))
    data = _merge(data, overrides or {})
    config = _build(AgentConfig, data, "")
    _validate(config)
    return config


def _validate(config: AgentConfig) -> None:
    s, e = config.server, config.engine
    if not 0 <= s.port <= 65535:
        raise ConfigError(f"server.port must be 0..65535, got {s.port}")
    if s.max_body_bytes < 1024:
        raise ConfigError(f"server.max_body_bytes must be at least 1024, got {s.max_body_bytes}")
    if e.execution_provider not in ("auto", "cpu", "cuda"):
        raise ConfigError(
            f"engine.execution_provider must be auto, cpu or cuda, got {e.execution_provider!r}"
        )
    if e.intra_op_threads < 0 or e.inter_op_threads < 0:
        raise ConfigError("engine thread counts must be >= 0")
    if e.max_context_tokens < 16:
        raise ConfigError(f"engine.max_context_tokens must be >= 16, got {e.max_context_tokens}")
    for name in ("max_running", "max_batched_tokens", "kv_budget_tokens", "max_queue"):
        if getattr(e, name) < 1:
            raise ConfigError(f"engine.{name} must be >= 1, got {getattr(e, name)}")
    if e.prefix_cache_bytes < 0:
        raise ConfigError(
            f"engine.prefix_cache_bytes must be >= 0 (0 turns it off), got {e.prefix_cache_bytes}"
        )
    if config.embeddings.max_batch_size < 1 or config.embeddings.max_queue_delay_us < 0:
        raise ConfigError("embeddings.max_batch_size must be >= 1, max_queue_delay_us >= 0")
    if e.max_queue_wait_s <= 0 or e.request_timeout_s <= 0:
        raise ConfigError("engine.max_queue_wait_s and engine.request_timeout_s must be > 0")
    if not 1 <= e.default_max_tokens <= e.max_context_tokens:
        raise ConfigError("engine.default_max_tokens must be in 1..engine.max_context_tokens")
    if not -90 <= config.identity.latitude <= 90 or not -180 <= config.identity.longitude <= 180:
        raise ConfigError("identity.latitude/longitude out of range")
    if config.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"log_level must be DEBUG, INFO, WARNING or ERROR, got {config.log_level}"
        )
