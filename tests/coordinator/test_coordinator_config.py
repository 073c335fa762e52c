"""Coordinator configuration: defaults < file < environment < flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.__main__ import main
from coordinator.config import CoordinatorConfig, load_config
from coordinator.errors import ConfigError, FatalError


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


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "grpc_port = 1234\n")
    config = load_config(environ={"EDGEFLEET_COORDINATOR_CONFIG": str(path)})
    assert config.grpc_port == 1234


@pytest.mark.parametrize(
    ("toml", "environ", "overrides", "expected"),
    [
        ("grpc_prot = 1\n", {}, {}, r"coordinator\.toml: unknown setting 'grpc_prot'; known"),
        ('grpc_port = "50051"\n', {}, {}, r"grpc_port: expected an integer, got '50051'"),
        ("grpc_port = true\n", {}, {}, r"grpc_port: expected an integer, got True"),
        ("grpc_port = \n", {}, {}, r"is not valid TOML"),
        (
            "",
            {"EDGEFLEET_COORDINATOR_HTTP_PORT": "eighty"},
            {},
            r"environment variable EDGEFLEET_COORDINATOR_HTTP_PORT: expected an integer, "
            r"got 'eighty'",
        ),
        (
            "",
            {"EDGEFLEET_COORDINATOR_HTTP_PROT": "1"},
            {},
            r"EDGEFLEET_COORDINATOR_HTTP_PROT: unknown setting 'http_prot'",
        ),
        ("", {}, {"grpc_port": 70000}, r"flag --grpc-port: must be a port number 0\.\.65535"),
        ("", {}, {"report_interval_ms": 5}, r"--report-interval-ms: must be between 100 and"),
        ('log_level = "LOUD"\n', {}, {}, r"log_level: must be one of DEBUG, INFO"),
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
    with pytest.raises(ConfigError, match=expected):
        load_config(path, environ=environ, overrides=overrides)


def test_missing_config_file_is_a_fatal_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist") as info:
        load_config(tmp_path / "nope.toml", environ={})
    assert isinstance(info.value, FatalError)


def test_config_built_in_code_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="http_port"):
        CoordinatorConfig(http_port=-1)


def test_cli_reports_bad_config_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_COORDINATOR_GRPC_PORT", "abc")
    with pytest.raises(SystemExit) as info:
        main(["--http-port", "9000"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "edgefleet-coordinator: error:" in err
    assert "EDGEFLEET_COORDINATOR_GRPC_PORT: expected an integer, got 'abc'" in err
