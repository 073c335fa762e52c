"""Typed coordinator configuration.

Sources, later ones winning: built-in defaults < TOML file < environment
(``EDGEFLEET_COORDINATOR_<KEY>``) < command-line flags. The file is flat::

    grpc_port = 50051
    http_port = 8080
    report_interval_ms = 2000

Every key has a default that works on a laptop. Bad values raise ConfigError
naming the key and the source it came from.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.errors import ConfigError

ENV_PREFIX = "EDGEFLEET_COORDINATOR_"
# Names the config file; not itself a setting.
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Settings of one coordinator process."""

    # Address the gRPC server (agents' sessions, Enroll, Route) listens on; port 0 = any free.
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    # Address of the HTTP server (admin API, /metrics, /healthz); port 0 = any free.
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    # How often agents send a LoadReport (told to them in Welcome).
    report_interval_ms: int = 2000
    # How long a new session may take to send its Hello.
    hello_timeout_s: float = 10.0
    # How long shutdown waits for in-flight RPCs before cancelling them.
    shutdown_grace_s: float = 5.0
    # Root log level.
    log_level: str = "INFO"

    # --- persistence
    # Directory for the SQLite database (fleet.db) and the CA (ca/); "~" is expanded.
    data_dir: str = "~/.local/share/edgefleet/coordinator"

    # --- enrollment and TLS
    # "auto": TLS unless grpc_host is loopback; "on": always; "off": plaintext (dev only).
    tls: str = "auto"
    # With TLS on: port for Enroll (server-authenticated TLS, no client certificate);
    # the Session port (grpc_port) then requires mutual TLS. 0 = any free port.
    enroll_port: int = 50052
    # Extra host names / IPs for the server certificate, comma-separated.
    tls_server_names: str = ""
    # "auto": agents must be enrolled whenever TLS is on; "on": always; "off": never checked
    # for agents that never enrolled (enrolled agents are always checked).
    require_enrollment: str = "auto"
    # Bearer token for the admin API; empty = admin API only from loopback clients.
    admin_token: str = ""

    # --- liveness
    # Missed load reports before an agent is suspect (routed last) and down (not routed).
    suspect_after_reports: int = 2
    down_after_reports: int = 5

    # --- routing (see coordinator/routing.py for why these defaults)
    route_weight_proximity: float = 0.45
    route_weight_queue: float = 0.2
    route_weight_kv: float = 0.1
    route_weight_wait: float = 0.25
    # Distance at which the proximity term halves (km).
    route_distance_scale_km: float = 300.0
    # Client-measured RTT at which the proximity term halves (ms).
    route_rtt_scale_ms: float = 20.0
    # Tokens a typical request generates, for predicted wait = backlog * this / tokens per s.
    route_expected_tokens: int = 128
    # Agents at or above either limit are saturated and get no new routes.
    route_saturation_queue_depth: int = 64
    route_saturation_kv_fraction: float = 0.98
    # Most agents returned per answer, and how many nearest candidates are scored.
    route_limit: int = 8
    route_candidate_pool: int = 64
    # "CIDR=site,CIDR=site": which site a client IP belongs to.
    site_networks: str = ""
    # Placeholder overflow answer when no edge agent fits (the overflow issue refines it).
    overflow_name: str = ""
    overflow_url: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            problem = _VALIDATORS[f.name](getattr(self, f.name))
            if problem is not None:
                raise ConfigError(f"{f.name}: {problem}")
        if self.down_after_reports <= self.suspect_after_reports:
            raise ConfigError(
                "down_after_reports must be greater than suspect_after_reports, got "
                f"{self.down_after_reports} <= {self.suspect_after_reports}"
            )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def tls_enabled(self) -> bool:
        if self.tls == "auto":
            return not is_loopback_host(self.grpc_host)
        return self.tls == "on"

    @property
    def enrollment_required(self) -> bool:
        if self.require_enrollment == "auto":
            return self.tls_enabled
        return self.require_enrollment == "on"


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback IP addresses."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _port(value: Any) -> str | None:
    return None if 0 <= value <= 65535 else f"must be a port number 0..65535, got {value}"


def _host(value: Any) -> str | None:
    return None if value.strip() else "must not be empty"


def _positive(value: Any) -> str | None:
    return None if value > 0 else f"must be greater than 0, got {value}"


def _log_level(value: Any) -> str | None:
    if value in LOG_LEVELS:
        return None
    return f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value in choices:
            return None
        return f"must be one of {', '.join(choices)}, got {value!r}"

    return check


def _anything(value: Any) -> str | None:
    return None


def _non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be 0 or more, got {value}"


def _fraction(value: Any) -> str | None:
    return None if 0 < value <= 1 else f"must be in (0, 1], got {value}"


def _site_networks(value: Any) -> str | None:
    from coordinator.site_networks import parse_site_networks

    try:
        parse_site_networks(value)
    except ValueError as exc:
        return str(exc)
    return None


def _report_interval(value: Any) -> str | None:
    if 100 <= value <= 3_600_000:
        return None
    return f"must be between 100 and 3600000 milliseconds, got {value}"


_VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "grpc_host": _host,
    "grpc_port": _port,
    "http_host": _host,
    "http_port": _port,
    "report_interval_ms": _report_interval,
    "hello_timeout_s": _positive,
    "shutdown_grace_s": _positive,
    "log_level": _log_level,
    "data_dir": _host,
    "tls": _one_of("auto", "on", "off"),
    "enroll_port": _port,
    "tls_server_names": _anything,
    "require_enrollment": _one_of("auto", "on", "off"),
    "admin_token": _anything,
    "suspect_after_reports": _positive,
    "down_after_reports": _positive,
    "route_weight_proximity": _non_negative,
    "route_weight_queue": _non_negative,
    "route_weight_kv": _non_negative,
    "route_weight_wait": _non_negative,
    "route_distance_scale_km": _positive,
    "route_rtt_scale_ms": _positive,
    "route_expected_tokens": _positive,
    "route_saturation_queue_depth": _positive,
    "route_saturation_kv_fraction": _fraction,
    "route_limit": _positive,
    "route_candidate_pool": _positive,
    "site_networks": _site_networks,
    "overflow_name": _anything,
    "overflow_url": _anything,
}

_FIELD_TYPES: dict[str, type] = {
    f.name: {"str": str, "int": int, "float": float}[str(f.type)]
    for f in dataclasses.fields(CoordinatorConfig)
}


def config_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(CoordinatorConfig)]


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> CoordinatorConfig:
    """Build the config from file < environment < overrides (flags).

    ``path`` falls back to ``$EDGEFLEET_COORDINATOR_CONFIG``; ``environ`` defaults
    to ``os.environ``; ``overrides`` values of None are ignored (flag not given).
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    if path is None and env.get(CONFIG_FILE_ENV):
        path = Path(env[CONFIG_FILE_ENV])
    if path is not None:
        for key, raw in _read_toml(path).items():
            source = f"{path}: {key}"
            values[key] = _coerce(key, raw, source, from_text=False)
            sources[key] = source

    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV:
            continue
        key = name.removeprefix(ENV_PREFIX).lower()
        _check_known(key, f"environment variable {name}")
        values[key] = _coerce(key, raw, f"environment variable {name}", from_text=True)
        sources[key] = f"environment variable {name}"

    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        flag = "--" + key.replace("_", "-")
        _check_known(key, f"flag {flag}")
        values[key] = _coerce(key, raw, f"flag {flag}", from_text=isinstance(raw, str))
        sources[key] = f"flag {flag}"

    for key, value in values.items():
        problem = _VALIDATORS[key](value)
        if problem is not None:
            raise ConfigError(f"{sources[key]}: {problem}")
    return CoordinatorConfig(**values)


def log_level_number(config: CoordinatorConfig) -> int:
    return int(getattr(logging, config.log_level))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for key in data:
        _check_known(key, f"config file {path}")
    return data


def _check_known(key: str, source: str) -> None:
    if key not in _FIELD_TYPES:
        raise ConfigError(
            f"{source}: unknown setting {key!r}; known settings: {', '.join(config_keys())}"
        )


def _coerce(key: str, raw: Any, source: str, *, from_text: bool) -> Any:
    wanted = _FIELD_TYPES[key]
    if from_text:
        text = str(raw).strip()
        if wanted is str:
            return text.upper() if key == "log_level" else text.lower() if key in _LOWER else text
        try:
            return wanted(text)
        except ValueError:
            raise ConfigError(f"{source}: expected {_type_words(wanted)}, got {raw!r}") from None
    # Values from TOML or typed flags: no silent conversions except int -> float.
    if wanted is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, bool) or not isinstance(raw, wanted):
        raise ConfigError(f"{source}: expected {_type_words(wanted)}, got {raw!r}")
    if key == "log_level" and isinstance(raw, str):
        return raw.upper()
    if key in _LOWER and isinstance(raw, str):
        return raw.lower()
    return raw


_LOWER = frozenset({"tls", "require_enrollment"})


def _type_words(wanted: type) -> str:
    return {int: "an integer", float: "a number", str: "a string"}[wanted]
