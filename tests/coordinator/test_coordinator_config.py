"""Coordinator configuration: defaults < file < environment < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from coordinator.__main__ import main
from coordinator.config import CoordinatorConfig, load_config
from coordinator.errors import ConfigError, FatalError
from coordinator.routing.scorer import RoutePolicy
from coordinator.routing.service import policy_from_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_work_on_a_laptop() -> None:
    config = load_config(environ={})
    assert config == CoordinatorConfig()
    assert (config.grpc_host, config.grpc_port) == ("127.0.0.1", 50051)
    assert (config.http_host, config.http_port) == ("127.0.0.1", 8080)
    assert config.report_interval_ms == 2000
    assert config.log_level == "INFO"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'grpc_host = "0.0.0.0"\ngrpc_port = 1000\nhttp_port = 2000\n'
        'report_interval_ms = 500\nshutdown_grace_s = 3\nlog_level = "debug"\n',
    )
    environ = {
        "EDGEFLEET_COORDINATOR_HTTP_PORT": "3000",
        "EDGEFLEET_COORDINATOR_REPORT_INTERVAL_MS": "600",
        "EDGEFLEET_COORDINATOR_LOG_LEVEL": "warning",
        "UNRELATED": "x",
    }
    config = load_config(
        path,
        environ=environ,
        overrides={"report_interval_ms": 700, "grpc_port": None, "log_level": None},
    )
    assert config.grpc_host == "0.0.0.0"  # file
    assert config.grpc_port == 1000  # file (flag not given)
    assert config.http_port == 3000  # environment beats file
    assert config.report_interval_ms == 700  # flag beats environment
    assert config.log_level == "WARNING"  # environment, normalised
    assert config.shutdown_grace_s == 3.0  # TOML integer accepted for a float
    assert config.enroll_port == 1001  # follows grpc_port


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "grpc_port = 1234\n")
    config = load_config(environ={"EDGEFLEET_COORDINATOR_CONFIG": str(path)})
    assert config.grpc_port == 1234


@pytest.mark.parametrize(
    ("toml", "environ", "overrides", "expected"),
    [
        (
            "grpc_prot = 1\n",
            {},
            {},
            r"coordinator\.toml: unknown setting 'grpc_prot' \(did you mean 'grpc_port'\?\)",
        ),
        ("grpc_port = true\n", {}, {}, r"grpc_port: got True, expected an integer in 0\.\.65535"),
        ("grpc_port = \n", {}, {}, r"is not valid TOML"),
        (
            "",
            {"EDGEFLEET_COORDINATOR_HTTP_PORT": "eighty"},
            {},
            r"environment variable EDGEFLEET_COORDINATOR_HTTP_PORT: http_port: got 'eighty', "
            r"expected an integer in 0\.\.65535",
        ),
        (
            "",
            {"EDGEFLEET_COORDINATOR_HTTP_PROT": "1"},
            {},
            r"EDGEFLEET_COORDINATOR_HTTP_PROT: no such setting "
            r"\(did you mean EDGEFLEET_COORDINATOR_HTTP_PORT\?\)",
        ),
        (
            "",
            {},
            {"grpc_port": 70000},
            r"flag --grpc-port: grpc_port: got 70000, expected an integer in 0\.\.65535",
        ),
        (
            "",
            {},
            {"report_interval_ms": 5},
            r"--report-interval-ms: report_interval_ms: got 5, expected an integer in "
            r"100\.\.3600000",
        ),
        (
            'log_level = "LOUD"\n',
            {},
            {},
            r"log_level: got 'LOUD', expected one of 'DEBUG', 'INFO', 'WARNING', 'ERROR', "
            r"'CRITICAL'",
        ),
        ('tls = "maybe"\n', {}, {}, r"tls: got 'maybe', expected one of 'auto', 'on', 'off'"),
        (
            "",
            {},
            {"restart_grace_s": "-1"},
            r"flag --restart-grace-s: restart_grace_s: got '-1', expected a number >= 0",
        ),
        (
            "",
            {},
            {"route_saturation_kv_fraction": "1.5"},
            r"flag --set route_saturation_kv_fraction: route_saturation_kv_fraction: got '1\.5', "
            r"expected a number > 0 and <= 1",
        ),
        ("down_after_reports = 2\n", {}, {}, r"down_after_reports must be greater than"),
        (
            "route_weight_proximity = 0\nroute_weight_queue = 0\nroute_weight_kv = 0\n"
            "route_weight_wait = 0\n",
            {},
            {},
            r"at least one of the route_weight_\* settings must be above 0",
        ),
        ('site_networks = "10.0.0.0/8"\n', {}, {}, r"coordinator\.toml: site_networks: "),
    ],
)
def test_bad_settings_name_the_key_and_the_source(
    tmp_path: Path,
    toml: str,
    environ: dict[str, str],
    overrides: dict[str, object],
    expected: str,
) -> None:
    path = write(tmp_path, toml)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path, environ=environ, overrides=overrides)
    assert "\n" not in str(info.value)


def test_missing_config_file_is_a_fatal_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist") as info:
        load_config(tmp_path / "nope.toml", environ={})
    assert isinstance(info.value, FatalError)


def test_config_built_in_code_is_validated_too() -> None:
    with pytest.raises(ValidationError, match="http_port"):
        CoordinatorConfig(http_port=-1)


def test_route_defaults_are_the_route_policys_own() -> None:
    # One source: the config passes RoutePolicy's defaults straight through.
    assert policy_from_config(CoordinatorConfig()) == RoutePolicy()
    changed = load_config(environ={"EDGEFLEET_COORDINATOR_ROUTE_LIMIT": "3"})
    assert policy_from_config(changed).limit == 3


def test_restart_grace_and_enroll_port_defaults() -> None:
    config = load_config(environ={})
    assert config.restart_grace_s == 30.0
    assert config.enroll_port == 50052
    # The enroll port follows the session port unless set: what agents assume with TLS.
    assert load_config(environ={}, overrides={"grpc_port": "6000"}).enroll_port == 6001
    moved = load_config(environ={}, overrides={"grpc_port": 6000, "enroll_port": 7000})
    assert moved.enroll_port == 7000
    assert load_config(environ={}, overrides={"grpc_port": 0}).enroll_port == 0


def test_cli_reports_bad_config_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_COORDINATOR_GRPC_PORT", "abc")
    with pytest.raises(SystemExit) as info:
        main(["--http-port", "9000"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "edgefleet-coordinator: error: environment variable EDGEFLEET_COORDINATOR_GRPC_PORT: "
        "grpc_port: got 'abc', expected an integer in 0..65535\n"
    )


@pytest.mark.parametrize("key", ["admin_token_file", "store_password_file"])
def test_a_secret_file_is_read_once_warned_about_when_others_may_read_it(
    tmp_path: Path, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The admin token and the store password come from a file by the same rule: its first
    line, trimmed; a warning when other users may read it; a missing file is a ConfigError
    naming the setting and the path."""
    secret = "s3cr3t-" + "x" * 40
    path = tmp_path / "secret"

    def read(config: CoordinatorConfig) -> str:
        if key == "admin_token_file":
            return config.bootstrap_admin_token()
        return config.store_location("postgresql://edgefleet@db.example/fleet").password

    path.write_text(f"  {secret}  \nsecond line\n")
    path.chmod(0o600)
    assert read(CoordinatorConfig(**{key: str(path)})) == secret
    assert "readable by other users" not in caplog.text
    path.chmod(0o644)
    assert read(CoordinatorConfig(**{key: str(path)})) == secret
    assert f"{key} {path} is readable by other users" in caplog.text
    with pytest.raises(ConfigError, match=f"cannot read {key} {tmp_path / 'missing'}"):
        read(CoordinatorConfig(**{key: str(tmp_path / "missing")}))
