"""One rule for both processes: defaults < file < environment < flags, same names, same errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agent.__main__ as agent_main
import coordinator.__main__ as coordinator_main
from agent.config import AgentConfig
from agent.config import load_config as load_agent
from agent.errors import ConfigError as AgentConfigError
from coordinator.config import CoordinatorConfig
from coordinator.config import load_config as load_coordinator
from coordinator.errors import ConfigError as CoordinatorConfigError
from edgefleet.config_loading import env_name, leaf_fields, overrides_from_args


@dataclass(frozen=True)
class Process:
    name: str
    load: Callable[..., Any]
    parser: Callable[[], argparse.ArgumentParser]
    flags: Any
    error: type[Exception]
    prefix: str
    key: str  # a port setting
    toml: str  # sets it to 1000
    flag: str


AGENT = Process(
    "agent", load_agent, agent_main.build_parser, agent_main.FLAGS, AgentConfigError,
    "EDGEFLEET_AGENT_", "server.port", "[server]\nport = 1000\n", "--port",
)  # fmt: skip
COORDINATOR = Process(
    "coordinator", load_coordinator, coordinator_main.build_parser, coordinator_main.FLAGS,
    CoordinatorConfigError, "EDGEFLEET_COORDINATOR_", "http_port", "http_port = 1000\n",
    "--http-port",
)  # fmt: skip
BOTH = pytest.mark.parametrize("process", [AGENT, COORDINATOR], ids=lambda p: p.name)


def port(config: Any, key: str) -> int:
    for part in key.split("."):
        config = getattr(config, part)
    return int(config)


@BOTH
def test_precedence_is_defaults_file_environment_flags(process: Process, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(process.toml)
    env = {env_name(process.prefix, process.key): "2000"}
    flags = overrides_from_args(process.parser().parse_args([process.flag, "3000"]), process.flags)
    via_set = process.parser().parse_args(["--set", f"{process.key}=4000"])

    assert port(process.load(environ={}), process.key) not in (1000, 2000, 3000)
    assert port(process.load(path, environ={}), process.key) == 1000
    assert port(process.load(path, environ=env), process.key) == 2000
    assert port(process.load(path, environ=env, overrides=flags), process.key) == 3000
    overrides = overrides_from_args(via_set, process.flags)
    assert port(process.load(path, environ=env, overrides=overrides), process.key) == 4000
    # the file may also be named in the environment
    named = {process.prefix + "CONFIG": str(path)}
    assert port(process.load(environ=named), process.key) == 1000


@BOTH
def test_unknown_keys_are_rejected_from_every_source(process: Process, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("no_such_key = 1\n")
    with pytest.raises(process.error, match=r"config file .*: unknown setting 'no_such_key'"):
        process.load(path, environ={})
    with pytest.raises(process.error, match=r"environment variable .*NO_SUCH_KEY: no such"):
        process.load(environ={process.prefix + "NO_SUCH_KEY": "1"})
    with pytest.raises(process.error, match=r"flag --set no_such_key: unknown setting"):
        process.load(environ={}, overrides={"no_such_key": "1"})


@BOTH
def test_errors_name_the_source_key_and_range(process: Process) -> None:
    name = env_name(process.prefix, process.key)
    with pytest.raises(process.error) as info:
        process.load(environ={name: "99999"})
    expected = f"environment variable {name}: {process.key}: got '99999', expected an integer"
    assert str(info.value) == expected + " in 0..65535"
    args = process.parser().parse_args([process.flag, "-5"])
    with pytest.raises(process.error, match=f"flag {process.flag}: {process.key}: got '-5'"):
        process.load(environ={}, overrides=overrides_from_args(args, process.flags))


@pytest.mark.parametrize("model", [AgentConfig, CoordinatorConfig])
def test_every_key_has_one_environment_name(model: type[Any]) -> None:
    keys = [key for key, _ in leaf_fields(model)]
    names = {env_name("P_", key) for key in keys}
    assert len(names) == len(keys)
    assert env_name("EDGEFLEET_AGENT_", "engine.max_running") == (
        "EDGEFLEET_AGENT_ENGINE__MAX_RUNNING"
    )


@pytest.mark.parametrize("model", [AgentConfig, CoordinatorConfig])
def test_every_setting_and_section_is_described(model: type[Any]) -> None:
    # the reference pages are generated from these descriptions
    undescribed = [key for key, field in leaf_fields(model) if not field.description]
    assert undescribed == []
    kinds = [field.annotation for field in model.model_fields.values()]
    sections = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
    assert model.__doc__ and all(section.__doc__ for section in sections)


@BOTH
def test_a_config_built_in_code_reads_no_environment(
    process: Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(process.prefix, process.key), "2000")
    model = AgentConfig if process is AGENT else CoordinatorConfig
    assert port(model(), process.key) != 2000
    assert port(process.load(), process.key) == 2000  # what loading is for
