from pathlib import Path

import pytest

from agent.__main__ import build_parser, overrides_from_args
from agent.config import AgentConfig, load_config
from agent.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_defaults_work_on_a_laptop() -> None:
    config = load_config(environ={})
    assert config == AgentConfig()
    assert config.server.host == "127.0.0.1"
    assert config.models.dir == "models/artifacts"


def test_example_config_in_edge_images_is_valid() -> None:
    config = load_config(REPO / "edge_images" / "agent.example.toml", environ={})
    assert config.identity.site == "store-042"
    assert config.coordinator.target.endswith(":50051")


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[identity]\nsite = "file"\n')
    env = {"EDGEFLEET_AGENT_SERVER_PORT": "9100", "EDGEFLEET_AGENT_MODELS_SERVE": "a, b"}
    args = build_parser().parse_args(["--port", "9200", "--set", "engine.default_max_tokens=64"])
    config = load_config(path, environ=env, overrides=overrides_from_args(args))
    assert config.server.port == 9200  # flag beats environment beats file
    assert config.server.host == "0.0.0.0"  # from the file
    assert config.models.serve == ("a", "b")  # from the environment
    assert config.identity.site == "file"
    assert config.engine.default_max_tokens == 64


@pytest.mark.parametrize(
    ("text", "env", "fragment"),
    [
        ("[server]\nport = 'eighty'\n", {}, "server.port"),
        ("[server]\nprot = 1\n", {}, "prot"),
        ("[engine]\nexecution_provider = 'tpu'\n", {}, "execution_provider"),
        ("not toml = = =", {}, "not valid TOML"),
        ("", {"EDGEFLEET_AGENT_SERVER_PORT": "x"}, "server.port"),
        ("", {"EDGEFLEET_AGENT_MODELS_VERIFY_CHECKSUMS": "maybe"}, "verify_checksums"),
        ("[identity]\nlatitude = 123.0\n", {}, "latitude"),
        ("[engine]\nprefix_cache_bytes = -1\n", {}, "prefix_cache_bytes"),
        ("[engine]\nmax_running = 0\n", {}, "max_running"),
    ],
)
def test_bad_config_is_a_clear_error(
    tmp_path: Path, text: str, env: dict[str, str], fragment: str
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_config(path, environ=env)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml", environ={})
