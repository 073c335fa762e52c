"""API keys on disk: ``auth.keys_file`` and the agent's last-known keys section.

One JSON format for both (``version`` 1)::

    {"version": 1, "generation": 0, "keys": [
      {"key_id": "3f9a0c1d2e4b", "secret_sha256": "<64 hex digits>", "name": "kiosk",
       "models": ["smollm2-135m-instruct"], "allow_cloud": false, "max_priority": "normal",
       "max_tokens_per_request": 512, "requests_per_minute": 60, "tokens_per_minute": 20000,
       "expires_at_unix": 0, "max_keep_alive_s": 600, "may_pin_models": false,
       "policy": {"moderation": {"input": {"harassment": "block"}, "output": {},
                                 "stream_mode": "buffered"}}}]}

Only ``key_id`` and ``secret_sha256`` are required; the other fields default as in
``edgefleet.contract.ApiKey`` (every model, no cloud, ceiling ``normal``, no limits, never
expires, the agent's own keep-alive cap, no right to pin models, the default policy:
block sexual/minors, flag the rest, see ``edgefleet.key_policy``). The secret itself is
never stored. Files are written atomically (a temporary file in the same directory, fsync,
rename) with mode 0600.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.auth.keys import PRIORITY_RANK
from agent.errors import ConfigError
from edgefleet.contract import ApiKey, KeysSection
from edgefleet.files import write_private
from edgefleet.key_policy import (
    KeyPolicyError,
    key_policy_from_json,
    key_policy_to_json,
    usable_policy,
)

FORMAT_VERSION = 1
#: The longest keep-alive cap a key may carry (a week), as the coordinator's.
MAX_KEEP_ALIVE_S = 7 * 86_400
#: The last keys section from the coordinator, under ``coordinator.state_dir``.
LAST_KEYS_FILE = "api_keys.json"


def key_to_json(key: ApiKey) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "secret_sha256": key.secret_sha256.hex(),
        "name": key.name,
        "models": list(key.models),
        "allow_cloud": key.allow_cloud,
        "max_priority": key.max_priority,
        "max_tokens_per_request": key.max_tokens_per_request,
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        "expires_at_unix": key.expires_at_unix,
        # a cap out of range (a coordinator's section is saved here too) as the agent's own
        "max_keep_alive_s": key.max_keep_alive_s if _cap_ok(key.max_keep_alive_s) else 0.0,
        "may_pin_models": key.may_pin_models,
        # a newer coordinator's rules this agent cannot read keep their defaults
        "policy": key_policy_to_json(usable_policy(key.policy)),
    }


def _cap_ok(seconds: float) -> bool:
    return 0 <= seconds <= MAX_KEEP_ALIVE_S  # NaN and inf too


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def key_from_json(data: Any, where: str) -> ApiKey:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: each key must be a JSON object")
    try:
        digest = bytes.fromhex(str(data["secret_sha256"]))
        key = ApiKey(
            key_id=str(data["key_id"]),
            secret_sha256=digest,
            models=tuple(str(m) for m in data.get("models", ())),
            allow_cloud=bool(data.get("allow_cloud", False)),
            max_priority=str(data.get("max_priority", "normal")),
            max_tokens_per_request=int(data.get("max_tokens_per_request", 0)),
            requests_per_minute=float(data.get("requests_per_minute", 0.0)),
            tokens_per_minute=float(data.get("tokens_per_minute", 0.0)),
            expires_at_unix=int(data.get("expires_at_unix", 0)),
            name=str(data.get("name", "")),
            max_keep_alive_s=_number(data.get("max_keep_alive_s", 0.0), "max_keep_alive_s"),
            may_pin_models=data.get("may_pin_models", False),
            policy=key_policy_from_json(data.get("policy")),
        )
    except KeyPolicyError as exc:
        key_id = data.get("key_id", "?")
        raise ConfigError(f"{where}: key {key_id}: {exc.field}: {exc.message}") from None
    except KeyError as exc:
        raise ConfigError(f"{where}: a key lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: a key has a malformed field: {exc}") from None
    if len(digest) != 32 or not key.key_id:
        raise ConfigError(f"{where}: key {key.key_id!r}: secret_sha256 must be 64 hex digits")
    if not _cap_ok(key.max_keep_alive_s):
        raise ConfigError(f"{where}: key {key.key_id}: max_keep_alive_s must be seconds within "
                          f"[0, {MAX_KEEP_ALIVE_S}] (0: the agent's own cap)")  # fmt: skip
    if not isinstance(key.may_pin_models, bool):
        raise ConfigError(f"{where}: key {key.key_id}: may_pin_models must be true or false")
    if key.max_priority not in PRIORITY_RANK:
        raise ConfigError(f"{where}: key {key.key_id}: max_priority must be high, normal or low")
    return key


def section_to_json(section: KeysSection) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "generation": section.generation,
        "keys": [key_to_json(k) for k in section.keys],
    }


def read_keys(path: Path) -> KeysSection:
    """Read a keys file; ConfigError (one line, naming the file) when it cannot be used."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"keys file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"keys file {path} cannot be read: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ConfigError(f'keys file {path}: expected {{"version": 1, "keys": [...]}}')
    keys = tuple(key_from_json(k, f"keys file {path}") for k in data["keys"])
    generation = data.get("generation", 0)
    return KeysSection(generation=generation if isinstance(generation, int) else 0, keys=keys)


def write_keys(path: Path, section: KeysSection) -> None:
    """Write atomically with mode 0600 (never a half-written or world-readable file)."""
    write_private(path, json.dumps(section_to_json(section), indent=1))
