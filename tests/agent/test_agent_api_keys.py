"""API keys at the agent: refusals an attacker sees, and honest traffic kept being served.

Keys come from ``auth.keys_file`` (written by ``python -m agent keys add``) or a KeyTable
given to the app; the tiny model serves.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.__main__ import main as agent_main
from agent.api.app import KEYS, create_app
from agent.auth.key_files import read_keys, write_keys
from agent.auth.keys import KeyTable, new_secret, secret_digest
from agent.auth.startup import check_auth_configured
from agent.config import load_config
from agent.engine.interface import GenerationRequest
from agent.errors import ConfigError
from agent.load_sampler import LoadSampler
from agent.model_registry import ModelRegistry
from edgefleet.contract import ApiKey, KeysSection

CHAT = "/v1/chat/completions"
TINY = "tiny-llama"


def make_key(**scopes: Any) -> tuple[str, ApiKey]:
    key_id, secret = new_secret()
    return secret, ApiKey(key_id=key_id, secret_sha256=secret_digest(secret), **scopes)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat_body(text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {"model": TINY, "messages": [{"role": "user", "content": text}], "max_tokens": 4,
            "temperature": 0} | fields  # fmt: skip


Start = Callable[..., Awaitable[tuple[TestClient, list[GenerationRequest]]]]


@pytest.fixture
async def start(
    tiny_artifacts: Path, tmp_path: Path, make_tiny_registry: Callable[[], ModelRegistry]
) -> AsyncIterator[Start]:
    """An agent app with keys on, from a keys file holding ``keys``; also returns the
    engine requests seen (to observe priority and timeout)."""
    clients: list[TestClient] = []

    async def make(
        *keys: ApiKey, auth: dict[str, Any] | None = None, **sections: dict[str, Any]
    ) -> tuple[TestClient, list[GenerationRequest]]:
        path = tmp_path / f"keys-{len(clients)}.json"
        write_keys(path, KeysSection(0, keys))
        overrides: dict[str, Any] = {
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
            "auth": {"keys_file": str(path)} | (auth or {}),
            **sections,
        }
        registry = make_tiny_registry()
        seen = _record_requests(registry)
        app = create_app(load_config(environ={}, overrides=overrides), registry)
        client = TestClient(TestServer(app, handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client, seen

    yield make
    for client in clients:
        await client.close()


def _record_requests(registry: ModelRegistry) -> list[GenerationRequest]:
    seen: list[GenerationRequest] = []
    model = registry.text_models[TINY]
    generate = model.generate

    def recording(request: GenerationRequest) -> Any:
        seen.append(request)
        return generate(request)

    model.generate = recording  # type: ignore[method-assign]
    return seen


async def _error(response: Any) -> dict[str, Any]:
    body = await response.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


# --- the attack: no authentication, any caller steers priority and timeout ---------------


async def test_replay_no_auth_priority_and_timeout(start: Start) -> None:
    """Before: any caller was served, with X-Priority: high and X-Request-Timeout: 3600
    reaching the engine. After: 401 without a key; with a key whose ceiling is normal, the
    engine sees priority normal and the timeout clamped to auth.max_request_timeout_s."""
    secret, key = make_key(max_priority="normal")
    client, seen = await start(key)
    steer = {"X-Priority": "high", "X-Request-Timeout": "3600"}
    for headers in (steer, steer | {"Authorization": "Bearer ef-000000000000-guess"}):
        response = await client.post(CHAT, json=chat_body(), headers=headers)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        error = await _error(response)
        assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
    assert seen == []  # nothing reached the engine
    response = await client.post(CHAT, json=chat_body(), headers=steer | bearer(secret))
    assert response.status == 200, await response.text()
    assert [(r.priority, r.timeout_s) for r in seen] == [("normal", 300.0)]


async def test_open_and_closed_routes(start: Start) -> None:
    secret, key = make_key()
    client, _ = await start(key)
    assert (await client.get("/healthz")).status == 200  # liveness stays open
    assert (await client.get("/openapi.json")).status == 200
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/v1/models")).status == 401
    assert (await client.get("/metrics", headers=bearer(secret))).status == 200
    assert (await client.get("/v1/models", headers=bearer(secret))).status == 200


async def test_model_scope_and_max_tokens(start: Start) -> None:
    free_secret, free = make_key()
    other_secret, other = make_key(models=("some-other-model",))
    capped_secret, capped = make_key(models=(TINY,), max_tokens_per_request=3)
    client, seen = await start(free, other, capped)
    response = await client.post(CHAT, json=chat_body(), headers=bearer(other_secret))
    assert response.status == 403
    assert (await _error(response))["code"] == "model_not_allowed"
    response = await client.post(CHAT, json=chat_body(max_tokens=10), headers=bearer(capped_secret))
    assert response.status == 400
    assert "allows per request (3)" in (await _error(response))["message"]
    # Naming no max_tokens: capped at the key's limit, not refused.
    body = chat_body()
    del body["max_tokens"]
    response = await client.post(CHAT, json=body, headers=bearer(capped_secret))
    assert response.status == 200
    assert seen[-1].params.max_tokens == 3
    # Honest traffic with another key kept being served throughout.
    response = await client.post(CHAT, json=chat_body(), headers=bearer(free_secret))
    assert response.status == 200


async def test_model_version_pin(
    start: Start, make_tiny_registry: Callable[[], ModelRegistry]
) -> None:
    version = make_tiny_registry().text_models[TINY].version
    right_secret, right = make_key(models=(f"{TINY}@{version}",))
    wrong_secret, wrong = make_key(models=(f"{TINY}@not-{version}",))
    client, _ = await start(right, wrong)
    assert (await client.post(CHAT, json=chat_body(), headers=bearer(right_secret))).status == 200
    assert (await client.post(CHAT, json=chat_body(), headers=bearer(wrong_secret))).status == 403


async def test_rate_limit_429_while_another_key_is_served(start: Start) -> None:
    limited_secret, limited = make_key(requests_per_minute=2)
    honest_secret, honest = make_key()
    client, _ = await start(limited, honest)
    statuses = []
    for _ in range(4):
        response = await client.post(CHAT, json=chat_body(), headers=bearer(limited_secret))
        statuses.append(response.status)
        if response.status == 429:
            assert int(response.headers["Retry-After"]) >= 1
            error = await _error(response)
            assert error["code"] == "rate_limit_exceeded"
            assert f"API key {limited.key_id} is over its requests/min limit" in error["message"]
        honest_response = await client.post(CHAT, json=chat_body(), headers=bearer(honest_secret))
        assert honest_response.status == 200
    assert statuses == [200, 200, 429, 429]


async def test_tokens_per_minute(start: Start) -> None:
    # Each request is charged prompt + max_tokens up front; unused tokens come back.
    secret, key = make_key(tokens_per_minute=60)
    client, _ = await start(key)
    response = await client.post(CHAT, json=chat_body(max_tokens=100), headers=bearer(secret))
    assert response.status == 429
    assert "tokens/min" in (await _error(response))["message"]
    response = await client.post(CHAT, json=chat_body(max_tokens=2), headers=bearer(secret))
    assert response.status == 200


async def test_expired_key_is_refused(start: Start) -> None:
    expired_secret, expired = make_key(expires_at_unix=int(time.time()) - 1)
    live_secret, live = make_key(expires_at_unix=int(time.time()) + 3600)
    client, _ = await start(expired, live)
    response = await client.post(CHAT, json=chat_body(), headers=bearer(expired_secret))
    assert response.status == 401
    assert "expired" in (await _error(response))["message"]
    assert (await client.post(CHAT, json=chat_body(), headers=bearer(live_secret))).status == 200


async def test_response_cache_is_per_key(start: Start) -> None:
    """Before: a second caller sending the same prompt got X-Edgefleet-Cache: hit, learning
    that someone sent it. After: a hit answers only the key that made the entry."""
    a_secret, a = make_key()
    b_secret, b = make_key()
    client, _ = await start(a, b)
    body = chat_body("a secret question")
    first = await client.post(CHAT, json=body, headers=bearer(a_secret))
    again = await client.post(CHAT, json=body, headers=bearer(a_secret))
    other = await client.post(CHAT, json=body, headers=bearer(b_secret))
    assert [r.headers["X-Edgefleet-Cache"] for r in (first, again, other)] == [
        "miss",
        "hit",
        "miss",
    ]
    assert (await other.json())["choices"] == (await first.json())["choices"]


async def test_usage_is_reported_per_key(start: Start) -> None:
    a_secret, a = make_key()
    b_secret, b = make_key(requests_per_minute=1)
    client, _ = await start(a, b)
    await client.post(CHAT, json=chat_body(max_tokens=3), headers=bearer(a_secret))
    await client.post(CHAT, json=chat_body(max_tokens=3), headers=bearer(b_secret))
    await client.post(CHAT, json=chat_body(max_tokens=3), headers=bearer(b_secret))  # 429
    app = client.server.app
    assert app is not None
    from agent.api.app import METRICS, REGISTRY, STATE

    report = LoadSampler(app[REGISTRY], app[METRICS], app[STATE], app[KEYS])()
    usage = {u.key_id: u for u in report.key_usage}
    assert usage[a.key_id].requests == 1 and usage[a.key_id].completion_tokens == 3
    assert usage[a.key_id].prompt_tokens > 0 and usage[a.key_id].rejected == 0
    assert usage[b.key_id].requests == 1 and usage[b.key_id].rejected == 1
    assert LoadSampler(app[REGISTRY], app[METRICS], app[STATE], app[KEYS])().key_usage == ()


# --- keep_alive per key (issue 26) ----------------------------------------------------------


async def test_keep_alive_is_capped_per_key_and_only_a_key_allowed_to_pin_pins(
    start: Start,
) -> None:
    """A duration is lowered to the key's cap and the agent's (never refused); a negative
    keep_alive reaches the engine as a pin for a key with may_pin_models, and is a 400
    naming keep_alive and the key for any other (nothing reaches the engine)."""
    capped_secret, capped = make_key(max_keep_alive_s=60.0)
    pin_secret, pinner = make_key(may_pin_models=True)
    plain_secret, plain = make_key()
    client, seen = await start(
        capped, pinner, plain, residency={"max_request_keep_alive_s": 1800.0}
    )

    async def applied(secret: str, keep_alive: object) -> tuple[float | None, bool]:
        body = chat_body(keep_alive=keep_alive, cache=False)  # each one reaches the engine
        response = await client.post(CHAT, json=body, headers=bearer(secret))
        assert response.status == 200, await response.text()
        return seen[-1].keep_alive_s, seen[-1].pin_model

    assert await applied(capped_secret, "10m") == (60.0, False)  # the key's cap
    assert await applied(capped_secret, 30) == (30.0, False)  # within it: as asked
    assert await applied(plain_secret, "2h") == (1800.0, False)  # 0: the agent's cap
    assert await applied(pin_secret, "2h") == (1800.0, False)
    assert await applied(pin_secret, -1) == (None, True)
    assert await applied(pin_secret, "-1m") == (None, True)
    body = chat_body(cache=False)
    response = await client.post(CHAT, json=body, headers=bearer(capped_secret))
    assert (seen[-1].keep_alive_s, seen[-1].pin_model) == (None, False)  # none asked

    asked = len(seen)
    for secret, key in ((capped_secret, capped), (plain_secret, plain)):
        response = await client.post(CHAT, json=chat_body(keep_alive=-1), headers=bearer(secret))
        assert response.status == 400
        error = await _error(response)
        assert (error["type"], error["param"]) == ("invalid_request_error", "keep_alive")
        assert key.key_id in error["message"] and "may not pin" in error["message"]
    assert len(seen) == asked  # refused before the engine
    rejected = {u.key_id: u.rejected for u in client.app[KEYS].take_usage()}
    assert rejected[capped.key_id] == 1 and rejected[plain.key_id] == 1


@pytest.mark.parametrize(
    "keep_alive",
    [True, [], {"s": 5}, "5x", "nan", "inf", "-inf", "NaN", "1e999", "", "5m5x", 1e300, -1e300,
     10**30, "9" * 40, " ", "-", "+", "--", "- ", "\t", "+-5m"],
)  # fmt: skip
async def test_a_keep_alive_that_is_no_duration_is_a_400(start: Start, keep_alive: object) -> None:
    pin_secret, pinner = make_key(may_pin_models=True, max_keep_alive_s=60.0)
    client, seen = await start(pinner)
    response = await client.post(CHAT, json=chat_body(keep_alive=keep_alive),
                                 headers=bearer(pin_secret))  # fmt: skip
    assert response.status == 400, await response.text()
    assert (await _error(response))["param"] == "keep_alive"
    assert seen == []


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_a_keep_alive_json_cannot_carry_is_a_400(start: Start, literal: str) -> None:
    pin_secret, pinner = make_key(may_pin_models=True)
    client, seen = await start(pinner)
    body = json.dumps(chat_body())[:-1] + f', "keep_alive": {literal}}}'
    response = await client.post(
        CHAT, data=body, headers=bearer(pin_secret) | {"Content-Type": "application/json"}
    )
    assert response.status == 400, await response.text()
    assert seen == []


async def test_without_keys_insecure_no_request_may_pin(make_client: Any) -> None:
    """Keys off (loopback development, or auth.insecure_no_auth): no key carries the pin
    right, so keep_alive < 0 stays a 400; a duration is capped by the agent."""
    client = await make_client(residency={"keep_alive_s": 5.0, "max_request_keep_alive_s": 120.0})
    response = await client.post(CHAT, json=chat_body(keep_alive=-1))
    assert response.status == 400
    error = await _error(response)
    assert error["param"] == "keep_alive" and "without API keys" in error["message"]
    response = await client.post(CHAT, json=chat_body(keep_alive="1h"))
    assert response.status == 200, await response.text()
    (model,) = [m for m in (await (await client.get("/v1/models")).json())["data"]
                if m["id"] == TINY]  # fmt: skip
    assert model["pinned"] is False
    assert time.time() + 100 < model["expires_at"] <= time.time() + 121  # 120 s, not an hour


def test_keys_file_carries_the_keep_alive_cap_and_pin_right(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent-keys.json"
    assert agent_main(["keys", "add", "--file", str(path), "--name", "ops",
                       "--max-keep-alive", "30m", "--may-pin-models"]) == 0  # fmt: skip
    assert agent_main(["keys", "add", "--file", str(path), "--name", "app"]) == 0
    capsys.readouterr()
    ops, app = read_keys(path).keys
    assert (ops.max_keep_alive_s, ops.may_pin_models) == (1800.0, True)
    assert (app.max_keep_alive_s, app.may_pin_models) == (0.0, False)
    stored = json.loads(path.read_text())["keys"]
    assert [(k["max_keep_alive_s"], k["may_pin_models"]) for k in stored] == [
        (1800.0, True), (0.0, False)
    ]  # fmt: skip
    assert agent_main(["keys", "list", "--file", str(path)]) == 0
    assert '"may_pin_models": true' in capsys.readouterr().out
    for bad in ("nan", "inf", "5x", "-1", "8d"):
        with pytest.raises(SystemExit):
            agent_main(["keys", "add", "--file", str(path), "--max-keep-alive", bad])
        assert "--max-keep-alive" in capsys.readouterr().err
    assert len(read_keys(path).keys) == 2  # nothing added


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("may_pin_models", "yes", "may_pin_models must be true or false"),
        ("may_pin_models", 1, "may_pin_models must be true or false"),
        ("max_keep_alive_s", -1, "max_keep_alive_s must be seconds"),
        ("max_keep_alive_s", 10**9, "max_keep_alive_s must be seconds"),
        ("max_keep_alive_s", "30m", "max_keep_alive_s must be a number"),
        ("max_keep_alive_s", True, "max_keep_alive_s must be a number"),
    ],
)
def test_a_keys_file_with_a_bad_keep_alive_field_is_one_clear_error(
    tmp_path: Path, field: str, value: object, says: str
) -> None:
    path = tmp_path / "bad.json"
    key = {"key_id": "k1", "secret_sha256": "ab" * 32, field: value}
    path.write_text(json.dumps({"version": 1, "keys": [key]}))
    with pytest.raises(ConfigError, match=says):
        read_keys(path)
    path.write_text('{"version": 1, "keys": [{"key_id": "k1", "secret_sha256": "' + "ab" * 32
                    + '", "max_keep_alive_s": NaN}]}')  # fmt: skip
    with pytest.raises(ConfigError, match="max_keep_alive_s must be seconds"):
        read_keys(path)


def test_a_saved_section_with_a_cap_out_of_range_reads_back_as_the_agents_cap(
    tmp_path: Path,
) -> None:
    """The coordinator's keys section is saved in the same format: a cap it should never
    send (NaN, negative) is saved as 0 (the agent's own cap), so the agent still starts."""
    _, odd = make_key(max_keep_alive_s=float("nan"), may_pin_models=True)
    _, negative = make_key(max_keep_alive_s=-5.0)
    path = tmp_path / "api_keys.json"
    write_keys(path, KeysSection(7, (odd, negative)))
    keys = read_keys(path).keys
    assert [(k.max_keep_alive_s, k.may_pin_models) for k in keys] == [(0.0, True), (0.0, False)]


# --- the keys file and its CLI helper -----------------------------------------------------


async def test_keys_file_cli_and_format(
    start: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_artifacts: Path
) -> None:
    path = tmp_path / "agent-keys.json"
    assert agent_main(["keys", "add", "--file", str(path), "--name", "kiosk",
                       "--max-priority", "low", "--requests-per-minute", "30"]) == 0  # fmt: skip
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("ef-") and len(secret) > 40
    text = path.read_text()
    assert secret not in text  # only the digest is kept
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    (stored,) = json.loads(text)["keys"]
    assert stored["secret_sha256"] == secret_digest(secret).hex()
    assert stored["name"] == "kiosk" and stored["requests_per_minute"] == 30
    client, seen = await start(*read_keys(path).keys)
    response = await client.post(
        CHAT, json=chat_body(), headers=bearer(secret) | {"X-Priority": "high"}
    )
    assert response.status == 200 and seen[-1].priority == "low"


def test_malformed_keys_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"keys": [{"key_id": "k"}]}')
    with pytest.raises(ConfigError, match="lacks 'secret_sha256'"):
        read_keys(path)


# --- secure by default ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
def test_refuses_to_serve_beyond_loopback_without_auth(host: str) -> None:
    config = load_config(environ={}, overrides={"server": {"host": host}})
    with pytest.raises(ConfigError, match="no API keys are configured"):
        check_auth_configured(config)
    insecure = load_config(
        environ={}, overrides={"server": {"host": host}, "auth": {"insecure_no_auth": True}}
    )
    check_auth_configured(insecure)  # the explicit switch lets it start


@pytest.mark.slow
def test_agent_process_on_0000_without_auth_exits(tmp_path: Path) -> None:
    """A real agent process bound to 0.0.0.0 with no keys refuses at once, saying why."""
    args = [sys.executable, "-m", "agent", "--host", "0.0.0.0", "--port", "0"]
    done = subprocess.run(
        [*args, "--models-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "no API keys are configured" in done.stderr and "--insecure-no-auth" in done.stderr


def test_loopback_without_keys_stays_open() -> None:
    config = load_config(environ={}, overrides={})
    check_auth_configured(config)
    table = KeyTable(enabled=False)
    assert not table.enabled


@pytest.mark.parametrize("bad", ["inf", "nan", "0.4s", "1e30d", "5x", ""])
def test_keys_add_refuses_an_expiry_that_is_no_duration(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inf`` was an uncaught OverflowError and ``nan`` a ValueError traceback; each bad
    expiry is now argparse's one-line error, and nothing is written."""
    path = tmp_path / "agent-keys.json"
    with pytest.raises(SystemExit) as exit_:
        agent_main(["keys", "add", "--file", str(path), "--expires-in", bad])
    assert exit_.value.code == 2 and "--expires-in" in capsys.readouterr().err
    assert not path.exists()
    assert agent_main(["keys", "add", "--file", str(path), "--expires-in", "1.5s"]) == 0
    (stored,) = json.loads(path.read_text())["keys"]
    assert 0 < stored["expires_at_unix"] - time.time() <= 3
