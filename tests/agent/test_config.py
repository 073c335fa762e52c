import dataclasses
from pathlib import Path

import pytest

from agent.__main__ import build_parser, main, overrides_from_args
from agent.api.serving_common import GenerationLimits
from agent.config import (
    AgentConfig,
    CoordinatorLinkConfig,
    EmbeddingsConfig,
    EngineConfig,
    load_config,
)
from agent.engine.continuous_batcher import BatcherConfig
from agent.engine.embed_batcher import EmbeddingBatchConfig
from agent.engine.ort_session import SessionConfig
from agent.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_defaults_work_on_a_laptop() -> None:
    config = load_config(environ={})
    assert config == AgentConfig()
    assert config.server.host == "127.0.0.1"
    assert config.models.dir == "models/artifacts"
    # No configured place is an unknown place, not 0°N 0°E.
    assert (config.identity.latitude, config.identity.longitude) == (None, None)


def test_example_config_in_edge_images_is_valid() -> None:
    config = load_config(REPO / "edge_images" / "agent.example.toml", environ={})
    assert config.identity.site == "store-042"
    assert config.coordinator.target.endswith(":50051")
    assert (config.identity.latitude, config.identity.longitude) == (48.8566, 2.3522)
    assert config.coordinator.max_backoff_s == 2.0


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[identity]\nsite = "file"\n')
    env = {"EDGEFLEET_AGENT_SERVER__PORT": "9100", "EDGEFLEET_AGENT_MODELS__SERVE": "a, b"}
    args = build_parser().parse_args(
        ["--port", "9200", "--serve", "c", "--set", "engine.default_max_tokens=64"]
    )
    config = load_config(path, environ=env, overrides=overrides_from_args(args))
    assert config.server.port == 9200  # flag beats environment beats file
    assert config.server.host == "0.0.0.0"  # from the file
    assert config.models.serve == ("c",)  # flag beats environment
    assert config.identity.site == "file"
    assert config.engine.default_max_tokens == 64
    assert load_config(path, environ=env).models.serve == ("a", "b")  # comma-separated


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "[server]\nport = 'eighty'\n",
            {},
            "server.port: got 'eighty', expected an integer in 0..65535",
        ),
        ("[server]\nport = true\n", {}, "server.port: got True, expected an integer in 0..65535"),
        ("[server]\nprot = 1\n", {}, "unknown setting 'server.prot' (did you mean 'server.port'?)"),
        ("server = 5\n", {}, "server: got 5, expected a table of settings"),
        (
            "[engine]\nexecution_provider = 'tpu'\n",
            {},
            "engine.execution_provider: got 'tpu', expected one of 'auto', 'cpu', 'cuda'",
        ),
        (
            "",
            {"EDGEFLEET_AGENT_SERVER__PORT": "x"},
            "environment variable EDGEFLEET_AGENT_SERVER__PORT: server.port: got 'x', "
            "expected an integer in 0..65535",
        ),
        (
            "",
            {"EDGEFLEET_AGENT_MODELS__VERIFY_CHECKSUMS": "maybe"},
            "models.verify_checksums: got 'maybe', expected true or false",
        ),
        (
            "",  # the single-underscore names of before: an error that gives the new name
            {"EDGEFLEET_AGENT_SERVER_PORT": "9000"},
            "EDGEFLEET_AGENT_SERVER_PORT: no such setting "
            "(did you mean EDGEFLEET_AGENT_SERVER__PORT?)",
        ),
        (
            "[identity]\nlatitude = 123.0\nlongitude = 2.0\n",
            {},
            "identity.latitude: got 123.0, expected a number in -90..90, or unset",
        ),
        (
            "[identity]\nlatitude = 12.0\n",
            {},
            "identity.latitude and identity.longitude go together",
        ),
        (
            "[engine]\nprefix_cache_bytes = -1\n",
            {},
            "engine.prefix_cache_bytes: got -1, expected an integer >= 0",
        ),
        ("[engine]\nmax_running = 0\n", {}, "engine.max_running: got 0, expected an integer >= 1"),
        (
            "[engine]\nmax_context_tokens = 100\ndefault_max_tokens = 200\n",
            {},
            "engine.default_max_tokens (200) must be at most engine.max_context_tokens (100)",
        ),
        ("log_level = 'LOUD'\n", {}, "expected one of 'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
        (
            "[coordinator]\ntarget = 'c:50051'\nenroll_target = 'c:50051'\ntls = true\n"
            "join_token = 'j'\n",
            {},
            "set coordinator.enroll_target to c:50052",
        ),
        ("not toml = = =", {}, "is not valid TOML"),
        (
            "[redaction]\ndefault_mode = 'loud'\n",
            {},
            "redaction.default_mode: got 'loud', expected one of 'redact_restore', "
            "'redact_only', 'block', 'off'",
        ),
        (
            "[redaction]\nmodels = { m = 'loud' }\n",
            {},
            "agent.toml: redaction.models: got 'loud', expected a table of names to one of "
            "'redact_restore', 'redact_only', 'block', 'off'",
        ),
        (
            "",
            {"EDGEFLEET_AGENT_REDACTION__TYPES": "EMAIL,NOPE"},
            "environment variable EDGEFLEET_AGENT_REDACTION__TYPES: redaction.types: got "
            "'NOPE', expected a non-empty list, each one of 'SECRET', 'EMAIL', 'IBAN'",
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_key_and_what_it_allows(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[server]\nport = 1234\n")
    assert load_config(environ={"EDGEFLEET_AGENT_CONFIG": str(path)}).server.port == 1234


def test_engine_defaults_are_the_engines_own() -> None:
    # One source: the batcher's, the session's and the API's defaults, passed straight through.
    engine, embeddings = EngineConfig(), EmbeddingsConfig()
    assert engine.batcher() == BatcherConfig()
    assert engine.session() == SessionConfig()
    assert engine.default_max_tokens == GenerationLimits().default_max_tokens
    assert embeddings.batch() == EmbeddingBatchConfig()
    names = {f.name for f in dataclasses.fields(BatcherConfig)}
    assert names <= set(EngineConfig.model_fields)
    # ... and a value set in the config reaches the batcher.
    config = load_config(environ={"EDGEFLEET_AGENT_ENGINE__MAX_RUNNING": "3"})
    assert config.engine.batcher().max_running == 3


def test_enrollment_goes_to_the_enroll_port_when_tls_is_on() -> None:
    def link(**values: object) -> str:
        overrides = {"coordinator": {"target": "coord.lan:50051", **values}}
        return load_config(environ={}, overrides=overrides).coordinator.enrollment_target

    assert link() == "coord.lan:50051"  # plaintext: one port serves both
    assert link(tls=True) == "coord.lan:50052"  # TLS: the coordinator's default enroll_port
    assert link(tls=True, enroll_target="coord.lan:6000") == "coord.lan:6000"


def test_cli_reports_bad_config_in_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_AGENT_ENGINE__MAX_QUEUE", "0")
    with pytest.raises(SystemExit) as info:
        main(["--port", "9000"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "edgefleet-agent: error: environment variable EDGEFLEET_AGENT_ENGINE__MAX_QUEUE: "
        "engine.max_queue: got '0', expected an integer >= 1\n"
    )


def test_several_coordinators_from_a_toml_array_the_environment_or_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[coordinator]\ntarget = ['coord-a:50051', 'coord-b:50051']\n")
    from_file = load_config(path, environ={}).coordinator
    assert from_file.targets == ("coord-a:50051", "coord-b:50051")
    env = {"EDGEFLEET_AGENT_COORDINATOR__TARGET": "coord-a:50051, coord-b:50051"}
    assert load_config(environ=env).coordinator.targets == from_file.targets
    args = build_parser().parse_args(["--coordinator", "coord-a:50051,coord-b:50051"])
    from_flags = load_config(environ={}, overrides=overrides_from_args(args)).coordinator
    assert from_flags.targets == from_file.targets
    # one target, as always: the same text, one entry
    one = load_config(environ={}, overrides={"coordinator": {"target": "c:1"}}).coordinator
    assert (one.target, one.targets) == ("c:1", ("c:1",))
    assert load_config(environ={}).coordinator.targets == ()


def test_each_enroll_target_goes_with_its_target() -> None:
    def link(**values: object) -> CoordinatorLinkConfig:
        overrides = {"coordinator": {"target": "a.lan:50051,b.lan:7000", **values}}
        return load_config(environ={}, overrides=overrides).coordinator

    both = link(tls=True)
    assert [both.enrollment_target_for(t) for t in both.targets] == ["a.lan:50052", "b.lan:7001"]
    listed = link(tls=True, enroll_target="a.lan:9,b.lan:10")
    assert [listed.enrollment_target_for(t) for t in listed.targets] == ["a.lan:9", "b.lan:10"]
    one = link(tls=True, enroll_target="lb.lan:9")
    assert [one.enrollment_target_for(t) for t in one.targets] == ["lb.lan:9", "lb.lan:9"]
    with pytest.raises(ConfigError, match="lists 3 addresses for 2 targets"):
        link(enroll_target="a:1,b:2,c:3")


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("coord-a:50051,coord-b:99999", "'coord-b:99999' is not host:port (port '99999'"),
        ("coord-a:50051,,coord-b:1", "'' is not host:port (an empty entry)"),
        ("coord-a:50051,::1:50051", "'::1:50051' is not host:port (an IPv6 address must be"),
        ("coord-a:x", "'coord-a:x' is not host:port (port 'x'"),
        (":50051", "':50051' is not host:port (no host)"),
    ],
)
def test_a_bad_coordinator_target_is_named(value: str, named: str) -> None:
    with pytest.raises(ConfigError, match=r"coordinator\.target") as info:
        load_config(environ={"EDGEFLEET_AGENT_COORDINATOR__TARGET": value})
    assert named in str(info.value)
