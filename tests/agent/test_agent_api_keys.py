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
        *keys: ApiKey, auth: dict[str, Any] | None = None
    ) -> tuple[TestClient, list[GenerationRequest]]:
        path = tmp_path / f"keys-{len(clients)}.json"
        write_keys(path, KeysSection(0, keys))
        overrides: dict[str, Any] = {
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
            "auth": {"keys_file": str(path)} | (auth or {}),
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
