"""Whether this agent needs API keys, and the keys it starts with.

- ``auth.insecure_no_auth``: no keys, anywhere (logged as a warning).
- ``auth.keys_file`` or a coordinator (``coordinator.target``): keys required. The
  coordinator's keys arrive in its ``keys`` section; until then the last section received
  (kept in ``coordinator.state_dir``/api_keys.json) is used, so a restarted agent keeps
  checking keys while the coordinator is away.
- Neither, bound to loopback: no keys (development and tests); the start-up log says so.
- Neither, bound beyond loopback: the agent refuses to start.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent.auth.key_files import LAST_KEYS_FILE, read_keys, write_keys
from agent.auth.keys import KeyTable
from agent.config import AgentConfig
from agent.errors import ConfigError
from edgefleet.addresses import is_loopback_host
from edgefleet.contract import DesiredState, KeysSection

log = logging.getLogger(__name__)


def last_keys_path(config: AgentConfig) -> Path:
    return Path(config.coordinator.state_dir).expanduser() / LAST_KEYS_FILE


def check_auth_configured(config: AgentConfig) -> None:
    """Refuse to serve beyond loopback without keys (unless ``auth.insecure_no_auth``)."""
    auth, host = config.auth, config.server.host
    if auth.insecure_no_auth or auth.keys_file or config.coordinator.target:
        return
    if not is_loopback_host(host):
        raise ConfigError(
            f"server.host {host} is reachable beyond this machine but no API keys are "
            "configured: connect to a coordinator (coordinator.target), give "
            "auth.keys_file (see `python -m agent keys add --help`), or pass "
            "--insecure-no-auth to serve anyone who can reach the port"
        )


def key_table_for(config: AgentConfig) -> KeyTable:
    """The agent's KeyTable at start: enabled or not, with the keys it can read now."""
    auth = config.auth
    if auth.insecure_no_auth:
        log.warning(
            "API keys are OFF (auth.insecure_no_auth): anyone who reaches %s:%d is served",
            config.server.host,
            config.server.port,
        )
        return KeyTable(enabled=False)
    if not auth.keys_file and not config.coordinator.target:
        log.info("API keys are off: loopback-only agent with no coordinator and no auth.keys_file")
        return KeyTable(enabled=False)
    table = KeyTable(enabled=True)
    if auth.keys_file:
        section = read_keys(Path(auth.keys_file).expanduser())
        table.set_source("file", section.keys)
        log.info("API keys required: %d from %s", len(section.keys), auth.keys_file)
    if config.coordinator.target:
        path = last_keys_path(config)
        try:
            last = read_keys(path) if path.exists() else None
        except ConfigError as exc:
            log.warning("ignoring the last-known API keys: %s", exc)
            last = None
        if last is not None:
            table.set_source("coordinator", last.keys, last.generation)
        log.info(
            "API keys required: from coordinator %s (%d last-known, generation %d)",
            config.coordinator.target,
            0 if last is None else len(last.keys),
            0 if last is None else last.generation,
        )
    return table


class KeysApplier:
    """The session's ``on_desired_state``: use the coordinator's keys section and keep it."""

    def __init__(self, table: KeyTable, path: Path) -> None:
        self._table = table
        self._path = path

    def __call__(self, desired: DesiredState) -> None:
        section = desired.keys
        if section is None or section.generation == self._table.generation:
            return
        self._table.set_source("coordinator", section.keys, section.generation)
        write_keys(self._path, KeysSection(section.generation, section.keys))
        log.info("API keys: generation %d, %d keys", section.generation, len(section.keys))
