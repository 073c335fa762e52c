"""Every key, environment variable and flag of both processes loads as it always has.

A snapshot of every setting's default, of what each example config in ``edge_images/``
loads to, and of the errors for a few keys of each kind; and, for every key, a value other
than its default set from a file, from the environment and with ``--set`` (and from its
named flag, where it has one) reaches that key. A key that stops loading from any source
fails here. Changing a default on purpose means updating the snapshot.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types as at
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from agent.config import FLAGS as AGENT_FLAGS
from agent.config import AgentConfig
from agent.config import load_config as load_agent
from agent.errors import ConfigError as AgentConfigError
from agent.redaction.modes import RedactionMode
from coordinator.config import FLAGS as COORDINATOR_FLAGS
from coordinator.config import CoordinatorConfig
from coordinator.config import load_config as load_coordinator
from coordinator.errors import ConfigError as CoordinatorConfigError
from edgefleet import config_loading

EXAMPLES = Path(__file__).resolve().parents[2] / "edge_images"
ALL_TYPES = (
    "SECRET", "EMAIL", "IBAN", "CREDIT_CARD", "US_SSN", "IP_ADDRESS", "PHONE", "ADDRESS", "PERSON",
)  # fmt: skip

AGENT_DEFAULTS: dict[str, Any] = {
    "server.host": "127.0.0.1", "server.port": 8000, "server.max_body_bytes": 1048576,
    "server.public_url": "", "server.tls": "auto", "server.tls_cert_file": "",
    "server.tls_key_file": "", "server.tls_reload_interval_s": 5.0,
    "server.header_timeout_s": 10.0, "server.body_timeout_s": 30.0,
    "server.max_connections": 1024,
    "models.dir": "models/artifacts", "models.serve": (), "models.verify_checksums": True,
    "models.source": "auto", "models.store_dir": "", "models.seed_dir": "",
    "models.keep_versions": 2, "models.max_store_bytes": 0, "models.download_concurrency": 4,
    "models.download_bytes_per_s": 0, "models.download_timeout_s": 60.0,
    "models.peer_wait_s": 15.0, "models.trusted_keys": (), "models.trusted_keys_file": "",
    "models.allow_unsigned": False, "models.self_check": True, "models.self_check_threads": 1,
    "models.self_check_prompts": 8, "models.load_memory_factor": 1.5,
    "models.drain_timeout_s": 600.0, "models.serve_blobs": True,
    "engine.intra_op_threads": 0, "engine.inter_op_threads": 1, "engine.malloc_arenas": 0,
    "engine.execution_provider": "auto", "engine.max_context_tokens": 2048,
    "engine.default_max_tokens": 256, "engine.max_running": 16,
    "engine.max_batched_tokens": 256, "engine.max_prefill_step_s": 0.5,
    "engine.kv_cache_bytes": 536870912,
    "engine.kv_budget_tokens": None, "engine.max_queue": 64,
    "engine.max_queue_wait_s": 60.0, "engine.request_timeout_s": 300.0,
    "engine.prefix_cache_bytes": 33554432, "engine.idle_release_s": 2.0,
    "engine.speculative_tokens": 0, "engine.speculative_max_batch": 1,
    "engine.speculative_max_extra_positions": 16, "engine.speculative_ngram_min": 2,
    "engine.speculative_ngram_max": 8, "engine.speculative_lookback": 2048,
    "embeddings.max_batch_size": 32, "embeddings.max_queue_delay_us": 2000,
    "embeddings.max_queue": 4096,
    "residency.budget_bytes": None, "residency.budget_share": 0.75, "residency.max_loaded": 0,
    "residency.keep_alive_s": 300.0, "residency.pinned": (), "residency.min_residency_s": 10.0,
    "residency.max_waiting": 32, "residency.room_wait_s": 30.0,
    "residency.failed_retry_s": 30.0, "residency.max_request_keep_alive_s": 3600.0,
    "cache.enabled": True, "cache.max_bytes": 67108864, "cache.semantic_max_bytes": 33554432,
    "cache.semantic_ttl_s": 3600.0, "cache.semantic_max_prompt_chars": 2000,
    "coordinator.target": "", "coordinator.join_token": "", "coordinator.enroll_target": "",
    "coordinator.tls": False, "coordinator.ca_file": "",
    "coordinator.state_dir": "~/.local/state/edgefleet/agent", "coordinator.max_backoff_s": 2.0,
    "identity.agent_id": "", "identity.site": "default", "identity.latitude": None,
    "identity.longitude": None,
    "mdns.enabled": False, "mdns.interfaces": (),
    "auth.keys_file": "", "auth.insecure_no_auth": False, "auth.admin_token_file": "",
    "auth.max_request_timeout_s": 300.0,
    "audit.spool_max_bytes": 67108864,
    "redaction.default_mode": RedactionMode.REDACT_RESTORE, "redaction.models": {},
    "redaction.types": ALL_TYPES, "redaction.redact_logs": True,
    "overflow.enabled": True, "overflow.allow_cloud": False,
    "overflow.trust_unauthenticated_hop": False, "overflow.max_retries": 2,
    "overflow.backoff_s": 0.1, "overflow.connect_timeout_s": 5.0,
    "overflow.first_token_timeout_s": 30.0, "overflow.total_timeout_s": 300.0,
    "overflow.breaker_failures": 5, "overflow.breaker_error_rate": 0.5,
    "overflow.breaker_window": 20, "overflow.breaker_cooldown_s": 30.0,
    "log_level": "INFO",
}  # fmt: skip

COORDINATOR_DEFAULTS: dict[str, Any] = {
    "grpc_host": "127.0.0.1", "grpc_port": 50051, "http_host": "127.0.0.1", "http_port": 8080,
    "report_interval_ms": 2000, "hello_timeout_s": 10.0, "shutdown_grace_s": 5.0,
    "restart_grace_s": 30.0, "log_level": "INFO", "event_loop": "auto",
    "grpc_thread_nice": 10,
    "http_header_timeout_s": 10.0,
    "http_body_timeout_s": 30.0, "http_max_connections": 1024,
    "grpc_max_concurrent_rpcs": 25000, "grpc_max_concurrent_streams": 256,
    "grpc_max_message_bytes": 4194304, "enroll_rate_per_minute": 30.0, "enroll_burst": 10,
    "max_agents": 20000, "stale_unenrolled_after_s": 3600.0,
    "data_dir": "~/.local/share/edgefleet/coordinator", "store_url": "",
    "store_password": "", "store_password_file": "", "store_max_connections": 10,
    "store_statement_timeout_s": 5.0,
    "coordinator_id": "", "coordinator_heartbeat_s": 1.0, "leader_lease_s": 5.0,
    "tls": "auto", "enroll_port": 50052,
    "tls_server_names": "", "require_enrollment": "auto", "agent_cert_days": 7.0,
    "agent_cert_grace_days": 90.0, "check_agent_url_host": True,
    "max_agent_tokens_per_second": 100000.0, "max_agent_sequences": 10000,
    "dashboard_session_ttl_s": 28800, "http_tls": "auto", "http_tls_cert_file": "",
    "http_tls_key_file": "", "admin_token": "", "admin_token_file": "",
    "request_records_max_rows": 5000000, "suspect_after_reports": 2, "down_after_reports": 5,
    "route_weight_proximity": 0.45, "route_weight_queue": 0.2, "route_weight_kv": 0.1,
    "route_weight_wait": 0.25, "route_distance_scale_km": 300.0, "route_rtt_scale_ms": 20.0,
    "route_expected_tokens": 128, "route_saturation_queue_depth": 64,
    "route_saturation_kv_fraction": 0.98, "route_limit": 8, "route_candidate_pool": 64,
    "site_networks": "", "warm_by_demand": True, "warm_interval_s": 30.0,
    "warm_recent_window_s": 1800.0, "warm_yesterday_window_s": 3600.0, "warm_min_lookups": 4,
    "warm_backoff_s": 300.0, "warm_refresh_s": 120.0, "warm_max_commands_per_cycle": 10,
    "warm_max_pairs": 4096,
    "blob_base_url": "", "overflow_targets_file": "",
    "overflow_name": "", "overflow_url": "",
}  # fmt: skip

# What each example config changes from the defaults.
EXAMPLE_CONFIGS: dict[str, dict[str, Any]] = {
    "agent.example.toml": {
        "server.host": "0.0.0.0",
        "models.dir": "/var/lib/edgefleet/models",
        "coordinator.target": "coordinator.example.net:50051",
        "identity.site": "store-042",
        "identity.latitude": 48.8566,
        "identity.longitude": 2.3522,
    },
    "agent.bundle.toml": {
        "server.host": "0.0.0.0",
        "models.source": "store",
        "models.seed_dir": "@MODELS_DIR@",
        "models.trusted_keys_file": "@MODELS_DIR@/signing-key.pub",
        "coordinator.tls": True,
    },
    "agent.image.toml": {
        "server.host": "0.0.0.0",
        "models.source": "store",
        "models.seed_dir": "/opt/edgefleet/models",
        "models.trusted_keys_file": "/opt/edgefleet/models/signing-key.pub",
        "coordinator.state_dir": "/var/lib/edgefleet/agent",
    },
    "agent.image-empty.toml": {
        "server.host": "0.0.0.0",
        "models.source": "store",
        "coordinator.state_dir": "/var/lib/edgefleet/agent",
    },
    "coordinator.image.toml": {
        "grpc_host": "0.0.0.0",
        "http_host": "0.0.0.0",
        "data_dir": "/var/lib/edgefleet/coordinator",
    },
}


@dataclass(frozen=True)
class Process:
    name: str
    model: type[BaseModel]
    load: Callable[..., Any]
    error: type[Exception]
    prefix: str
    flags: tuple[config_loading.Flag, ...]
    defaults: dict[str, Any]


AGENT = Process(
    "agent", AgentConfig, load_agent, AgentConfigError, "EDGEFLEET_AGENT_", AGENT_FLAGS,
    AGENT_DEFAULTS,
)  # fmt: skip
COORDINATOR = Process(
    "coordinator", CoordinatorConfig, load_coordinator, CoordinatorConfigError,
    "EDGEFLEET_COORDINATOR_", COORDINATOR_FLAGS, COORDINATOR_DEFAULTS,
)  # fmt: skip
PROCESSES = {"agent": AGENT, "coordinator": COORDINATOR}


def fields(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Dotted key -> field, sections flattened."""
    found: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found |= fields(kind, f"{prefix}{name}.")
        else:
            found[prefix + name] = info
    return found


def values(config: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value, sections flattened."""
    found: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            found |= values(value, f"{prefix}{name}.")
        else:
            found[prefix + name] = value
    return found


def parser(process: Process) -> argparse.ArgumentParser:
    """The process's own parser: ``--config``, the named flags, ``--set``."""
    if process is AGENT:
        from agent.__main__ import build_parser
    else:
        from coordinator.__main__ import build_parser
    return build_parser()


def from_flags(process: Process, argv: list[str]) -> dict[str, Any]:
    args = parser(process).parse_args(argv)
    if process is AGENT:
        from agent.__main__ import overrides_from_args

        return overrides_from_args(args)
    return config_loading.overrides_from_args(args, COORDINATOR_FLAGS)


# --- a value other than the default for every key


SPECIAL: dict[str, Any] = {
    "identity.latitude": 12.5,
    "identity.longitude": 45.25,
    "engine.kv_budget_tokens": 4096,  # deprecated, unset by default
    "residency.budget_bytes": 2 << 30,  # unset: a share of the memory limit
    "redaction.types": ("EMAIL", "PHONE"),
    "redaction.models": {"llm-a": RedactionMode.BLOCK},
    "site_networks": "10.0.0.0/8=lab",
    "admin_token": "A" * 40,
    "store_url": "postgresql://fleet@db.example:5432/fleet",
}
# Keys that are only valid together with another.
COMPANIONS: dict[str, dict[str, Any]] = {
    "identity.latitude": {"identity.longitude": 1.5},
    "identity.longitude": {"identity.latitude": 1.5},
    "server.tls_cert_file": {"server.tls_key_file": "key.pem"},
    "server.tls_key_file": {"server.tls_cert_file": "cert.pem"},
    "http_tls_cert_file": {"http_tls_key_file": "key.pem"},
    "http_tls_key_file": {"http_tls_cert_file": "cert.pem"},
}


def bounds(field: FieldInfo) -> Callable[[float], bool]:
    checks = [
        (at.Ge, lambda v, m: v >= m.ge),
        (at.Gt, lambda v, m: v > m.gt),
        (at.Le, lambda v, m: v <= m.le),
        (at.Lt, lambda v, m: v < m.lt),
    ]
    metadata = field.metadata
    return lambda v: all(ok(v, m) for m in metadata for cls, ok in checks if isinstance(m, cls))


def sample(key: str, field: FieldInfo, default: Any) -> Any:
    if key in SPECIAL:
        return SPECIAL[key]
    kind = field.annotation
    if isinstance(default, bool):
        return not default
    if get_origin(kind) is Literal:
        return next(choice for choice in get_args(kind) if choice != default)
    if isinstance(default, Enum):
        return next(member for member in type(default) if member != default)
    if isinstance(default, int):
        return default + 1 if bounds(field)(default + 1) else default - 1
    if isinstance(default, float):
        return default + 0.5 if bounds(field)(default + 0.5) else default / 2
    if isinstance(default, str):
        return "sample-value"
    if isinstance(default, tuple):
        return ("a", "b")
    raise AssertionError(f"no sample for {key} ({kind})")


def samples(process: Process) -> list[tuple[str, Any]]:
    known = fields(process.model)
    return [(key, sample(key, known[key], process.defaults[key])) for key in known]


def as_text(value: Any) -> str:
    """How the environment and flags write a value."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={as_text(v)}" for k, v in value.items())
    return str(value)


def as_toml(settings: Mapping[str, Any]) -> str:
    def literal(value: Any) -> str:
        if isinstance(value, Enum):
            return json.dumps(value.value)
        if isinstance(value, dict):
            return (
                "{ " + ", ".join(f"{json.dumps(k)} = {literal(v)}" for k, v in value.items()) + " }"
            )
        return json.dumps(list(value) if isinstance(value, tuple) else value)

    tables: dict[str, list[str]] = {}
    for key, value in settings.items():
        section, _, name = key.rpartition(".")
        tables.setdefault(section, []).append(f"{name} = {literal(value)}")
    lines = tables.pop("", [])
    for section, rows in tables.items():
        lines += [f"[{section}]", *rows]
    return "\n".join(lines) + "\n"


def env_name(process: Process, key: str) -> str:
    return process.prefix + key.replace(".", "__").upper()


def case_ids(cases: list[tuple[Process, str, Any]]) -> list[str]:
    return [f"{process.name}:{key}" for process, key, _ in cases]


KEY_CASES = [(p, key, value) for p in (AGENT, COORDINATOR) for key, value in samples(p)]


def test_defaults_are_as_before() -> None:
    for process in (AGENT, COORDINATOR):
        assert values(process.load(environ={})) == process.defaults
        assert list(fields(process.model)) == list(process.defaults)


@pytest.mark.parametrize("name", list(EXAMPLE_CONFIGS))
def test_example_configs_load_as_before(name: str) -> None:
    process = COORDINATOR if name.startswith("coordinator") else AGENT
    config = process.load(EXAMPLES / name, environ={})
    assert values(config) == {**process.defaults, **EXAMPLE_CONFIGS[name]}
    # ... also when the file is named in the environment, as the images do
    named = process.load(environ={process.prefix + "CONFIG": str(EXAMPLES / name)})
    assert named == config


def test_every_example_config_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.toml")) == sorted(EXAMPLE_CONFIGS)


@pytest.mark.parametrize(("process", "key", "value"), KEY_CASES, ids=case_ids(KEY_CASES))
def test_every_key_loads_from_file_environment_and_set(
    process: Process, key: str, value: Any, tmp_path: Path
) -> None:
    settings = {key: value, **COMPANIONS.get(key, {})}
    path = tmp_path / "config.toml"
    path.write_text(as_toml(settings))
    assert values(process.load(path, environ={}))[key] == value

    environ = {env_name(process, k): as_text(v) for k, v in settings.items()}
    assert values(process.load(environ=environ))[key] == value

    argv = [arg for k, v in settings.items() for arg in ("--set", f"{k}={as_text(v)}")]
    if key in ("admin_token", "store_password"):  # never a flag: refused
        with pytest.raises(process.error, match="cannot be given as a flag"):
            process.load(environ={}, overrides=from_flags(process, argv))
        return
    assert values(process.load(environ={}, overrides=from_flags(process, argv)))[key] == value


FLAG_CASES = [(p, f.key, f) for p in (AGENT, COORDINATOR) for f in p.flags]


@pytest.mark.parametrize(("process", "key", "flag"), FLAG_CASES, ids=case_ids(FLAG_CASES))
def test_every_named_flag_sets_its_key(
    process: Process, key: str, flag: config_loading.Flag
) -> None:
    value = sample(key, fields(process.model)[key], process.defaults[key])
    if flag.repeat:
        argv = [arg for item in value for arg in (flag.flag, item)]
    else:
        argv = [flag.flag, as_text(value)]
    for k, v in COMPANIONS.get(key, {}).items():
        argv += ["--set", f"{k}={as_text(v)}"]
    assert values(process.load(environ={}, overrides=from_flags(process, argv)))[key] == value


def test_agent_switch_flags() -> None:
    config = load_agent(environ={}, overrides=from_flags(AGENT, ["--insecure-no-tls"]))
    assert (config.server.tls, config.auth.insecure_no_auth) == ("off", False)
    config = load_agent(environ={}, overrides=from_flags(AGENT, ["--insecure-no-auth"]))
    assert (config.server.tls, config.auth.insecure_no_auth) == ("auto", True)


@pytest.mark.parametrize(
    ("process", "environ", "key", "value"),
    [
        # text is read the way it always was: trimmed, case-folded, comma-separated
        (AGENT, {"MODELS__SERVE": " a, ,b "}, "models.serve", ("a", "b")),
        (AGENT, {"MODELS__SERVE": ""}, "models.serve", ()),
        (AGENT, {"MODELS__VERIFY_CHECKSUMS": "off"}, "models.verify_checksums", False),
        (AGENT, {"MODELS__VERIFY_CHECKSUMS": "1"}, "models.verify_checksums", True),
        (AGENT, {"REDACTION__TYPES": "email, phone"}, "redaction.types", ("EMAIL", "PHONE")),
        (
            AGENT,
            {"REDACTION__MODELS": "m=BLOCK, n = off"},
            "redaction.models",
            {"m": RedactionMode.BLOCK, "n": RedactionMode.OFF},
        ),
        (
            AGENT,
            {"REDACTION__DEFAULT_MODE": " Block "},
            "redaction.default_mode",
            RedactionMode.BLOCK,
        ),
        (AGENT, {"LOG_LEVEL": "debug"}, "log_level", "DEBUG"),
        (AGENT, {"SERVER__TLS": "OFF"}, "server.tls", "off"),
        (AGENT, {"ENGINE__MAX_QUEUE_WAIT_S": "1e1"}, "engine.max_queue_wait_s", 10.0),
        (AGENT, {"SERVER__PUBLIC_URL": ""}, "server.public_url", ""),
        (AGENT, {"COORDINATOR__JOIN_TOKEN": "s3cret"}, "coordinator.join_token", "s3cret"),
        (COORDINATOR, {"REQUIRE_ENROLLMENT": "false"}, "require_enrollment", "off"),
        (COORDINATOR, {"REQUIRE_ENROLLMENT": "Yes"}, "require_enrollment", "on"),
        (COORDINATOR, {"GRPC_PORT": "6000"}, "enroll_port", 6001),
        (COORDINATOR, {"ADMIN_TOKEN": "B" * 32}, "admin_token", "B" * 32),
        (COORDINATOR, {"DATA_DIR": "~/fleet"}, "data_dir", "~/fleet"),
    ],
)
def test_environment_text_is_read_as_before(
    process: Process, environ: dict[str, str], key: str, value: Any
) -> None:
    config = process.load(environ={process.prefix + k: v for k, v in environ.items()})
    assert values(config)[key] == value


def test_unrelated_and_lower_case_environment_is_ignored() -> None:
    environ = {"edgefleet_agent_server__port": "1", "EDGEFLEET_AGENTS": "x", "HOME": "/"}
    assert load_agent(environ=environ) == AgentConfig()


@pytest.mark.parametrize(
    ("process", "environ", "argv", "message"),
    [
        (
            AGENT, {"MODELS__VERIFY_CHECKSUMS": "maybe"}, [],
            "environment variable EDGEFLEET_AGENT_MODELS__VERIFY_CHECKSUMS: "
            "models.verify_checksums: got 'maybe', expected true or false",
        ),
        (
            AGENT, {}, ["--port", "70000"],
            "flag --port: server.port: got '70000', expected an integer in 0..65535",
        ),
        (
            AGENT, {}, ["--execution-provider", "tpu"],
            "flag --execution-provider: engine.execution_provider: got 'tpu', expected one of "
            "'auto', 'cpu', 'cuda'",
        ),
        (
            AGENT, {}, ["--set", "coordinator.max_backoff_s=0.1"],
            "flag --set coordinator.max_backoff_s: coordinator.max_backoff_s: got '0.1', "
            "expected a number in 0.5..600",
        ),
        (
            AGENT, {}, ["--models-dir", ""],
            "flag --models-dir: models.dir: got '', expected a non-empty string",
        ),
        (
            AGENT, {"IDENTITY__LATITUDE": "", "IDENTITY__LONGITUDE": ""}, [],
            "environment variable EDGEFLEET_AGENT_IDENTITY__LATITUDE: identity.latitude: got '', "
            "expected a number in -90..90, or unset",
        ),
        (
            AGENT, {"REDACTION__MODELS": "m"}, [],
            "environment variable EDGEFLEET_AGENT_REDACTION__MODELS: redaction.models: expected "
            "model=mode pairs separated by commas, got 'm'",
        ),
        (
            AGENT, {}, ["--set", "server=1"],
            "flags: server: got '1', expected a table of settings",
        ),
        (
            AGENT, {"SERVER": "1"}, [],
            "environment variable EDGEFLEET_AGENT_SERVER: no such setting "
            "(did you mean EDGEFLEET_AGENT_SERVER__TLS?)",
        ),
        (
            AGENT, {"server__port": "1"}, [],
            "environment variable EDGEFLEET_AGENT_server__port: no such setting",
        ),
        (
            AGENT, {}, ["--set", "engine.max_runing=3"],
            "flag --set engine.max_runing: unknown setting 'engine.max_runing' "
            "(did you mean 'engine.max_running'?)",
        ),
        (
            COORDINATOR, {"ADMIN_TOKEN": "short"}, [],
            "environment variable EDGEFLEET_COORDINATOR_ADMIN_TOKEN: admin_token: admin_token is "
            "5 characters; an admin token needs at least 32 (e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`)",
        ),
        (
            COORDINATOR, {}, ["--tls", "maybe"],
            "flag --tls: tls: got 'maybe', expected one of 'auto', 'on', 'off'",
        ),
        (
            COORDINATOR, {}, ["--data-dir", ""],
            "flag --data-dir: data_dir: got '', expected a non-empty string",
        ),
        (
            COORDINATOR, {"CHECK_AGENT_URL_HOST": "nah"}, [],
            "environment variable EDGEFLEET_COORDINATOR_CHECK_AGENT_URL_HOST: "
            "check_agent_url_host: got 'nah', expected true or false",
        ),
        (
            COORDINATOR, {"HELLO_TIMEOUT_S": "0"}, [],
            "environment variable EDGEFLEET_COORDINATOR_HELLO_TIMEOUT_S: hello_timeout_s: "
            "got '0', expected a number > 0",
        ),
        (
            COORDINATOR, {}, ["--set", "admin_token=" + "C" * 40],
            "the admin token cannot be given as a flag (anyone on the host can read a process's "
            "flags in /proc/PID/cmdline): set EDGEFLEET_COORDINATOR_ADMIN_TOKEN in the "
            "environment, or admin_token_file = PATH (a 0600 file) in the config file",
        ),
        (
            COORDINATOR, {}, ["--set", "store_password=hunter2"],
            "the store password cannot be given as a flag (anyone on the host can read a "
            "process's flags in /proc/PID/cmdline): set EDGEFLEET_COORDINATOR_STORE_PASSWORD "
            "in the environment, or store_password_file = PATH (a 0600 file) in the config file",
        ),
        (
            COORDINATOR, {"STORE_URL": "postgresql://fleet:hunter2@db/fleet"}, [],
            "environment variable EDGEFLEET_COORDINATOR_STORE_URL: store_url: store_url must "
            "not hold the password (it would show in logs and in /proc/PID/cmdline): set "
            "store_password in the environment, or store_password_file",
        ),
        (
            COORDINATOR, {"STORE_URL": "mysql://db/fleet"}, [],
            "environment variable EDGEFLEET_COORDINATOR_STORE_URL: store_url: store_url must be "
            "empty (SQLite in data_dir) or postgresql://USER@HOST:PORT/DB, got a URL with "
            "scheme 'mysql'",
        ),
    ],
    ids=lambda value: value.name if isinstance(value, Process) else None,
)  # fmt: skip
def test_errors_are_as_before(
    process: Process, environ: dict[str, str], argv: list[str], message: str
) -> None:
    with pytest.raises(process.error) as info:
        process.load(
            environ={process.prefix + k: v for k, v in environ.items()},
            overrides=from_flags(process, argv),
        )
    assert str(info.value) == message


def test_a_key_set_twice_keeps_the_last_sources_value(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[server]\nport = 1\nhost = 'file'\n[engine]\nmax_running = 3\n")
    environ = {"EDGEFLEET_AGENT_SERVER__PORT": "2", "EDGEFLEET_AGENT_ENGINE__MAX_QUEUE": "5"}
    overrides = {"server.port": "3", "engine": {"max_queue": 6}}
    config = load_agent(path, environ=environ, overrides=overrides)
    assert (config.server.port, config.server.host) == (3, "file")
    assert (config.engine.max_running, config.engine.max_queue) == (3, 6)
    # a table-valued setting is replaced whole, not merged with the file's
    path.write_text("[redaction]\nmodels = { a = 'block' }\n")
    for overrides in ({"redaction": {"models": {"b": "off"}}}, {"redaction.models": "b=off"}):
        config = load_agent(path, environ={}, overrides=overrides)
        assert config.redaction.models == {"b": RedactionMode.OFF}
    config = load_agent(path, environ={"EDGEFLEET_AGENT_REDACTION__MODELS": "b=off"})
    assert config.redaction.models == {"b": RedactionMode.OFF}
