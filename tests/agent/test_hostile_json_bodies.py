"""Bodies a hostile client sends that Python's JSON reader does not refuse as JSONDecodeError:
nesting deeper than the interpreter's recursion limit (RecursionError) and an integer of
more digits than int() converts (ValueError). Each was a 500 internal_error on every
OpenAI route of the agent; each is a 400 in the API's error format, with keys on, and the
honest request after it is served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agent.api.app import create_app
from agent.auth.key_files import write_keys
from agent.auth.keys import new_secret, secret_digest
from agent.config import load_config
from edgefleet.contract import ApiKey, KeysSection

TINY = "tiny-llama"
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/moderations"]
Client = TestClient[web.Request, web.Application]
HONEST = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(params=["any model", "models listed"])
async def keyed(
    tiny_artifacts: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Client, str]]:
    """The agent with keys on and one key: one for any model, or one listing its models
    (then the key gate reads the body's model before the handler does)."""
    key_id, secret = new_secret()
    path = tmp_path / "keys.json"
    models = () if request.param == "any model" else (TINY, "all-minilm-l6-v2")
    key = ApiKey(key_id=key_id, secret_sha256=secret_digest(secret), models=models)
    write_keys(path, KeysSection(0, (key,)))
    overrides: dict[str, Any] = {
        "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
        "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
        "server": {"max_body_bytes": 64 * 1024},
        "auth": {"keys_file": str(path)},
    }
    client = TestClient(
        TestServer(create_app(load_config(environ={}, overrides=overrides)),
                   handler_cancellation=True)
    )  # fmt: skip
    await client.start_server()
    yield client, secret
    await client.close()


HOSTILE = {
    "nested lists": "[" * 20_000,
    "nested in a field": '{"model": "tiny-llama", "input": ' + "[" * 5_000 + "]" * 5_000 + "}",
    "nested objects": '{"a":' * 3_000 + "1" + "}" * 3_000,
    "a 5,000-digit integer": '{"model": "tiny-llama", "seed": ' + "9" * 5_000 + "}",
    "a 5,000-digit negative integer": '{"model": "tiny-llama", "max_tokens": -' + "7" * 5_000 + "}",
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("what", sorted(HOSTILE))
async def test_a_body_json_cannot_hold_is_a_400(
    keyed: tuple[Client, str], route: str, what: str
) -> None:
    client, secret = keyed
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    response = await client.post(route, data=HOSTILE[what].encode(), headers=headers)
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert "Traceback" not in error["message"] and len(error["message"]) < 300
    honest = await client.post("/v1/chat/completions", json=HONEST, headers=headers)
    assert honest.status == 200, await honest.text()


# JSON's \ud800 escape is valid syntax; Python reads it into a str no UTF-8 encoder takes
# (the tokenizers raised: a 500 on chat, completions, embeddings and moderations)
SURROGATES = {
    "/v1/chat/completions": (
        '{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}, '
        '{"role": "user", "content": "hi \\ud800"}]}',
        "messages.1.content",
    ),
    "/v1/completions": ('{"model": "tiny-llama", "prompt": ["ok", "\\udfff"]}', "prompt.1"),
    "/v1/embeddings": ('{"model": "tiny-llama", "input": "\\ud83d"}', "input"),
    "/v1/moderations": ('{"input": ["fine", "\\ud800\\ud800"]}', "input.1"),
}


@pytest.mark.parametrize("route", ROUTES)
async def test_a_lone_surrogate_is_a_400_naming_the_field(
    keyed: tuple[Client, str], route: str
) -> None:
    client, secret = keyed
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    body, param = SURROGATES[route]
    response = await client.post(route, data=body.encode(), headers=headers)
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    # a real pair (an emoji as two escapes) is a character, not a surrogate
    pair = '{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    honest = await client.post("/v1/chat/completions", data=pair.encode(), headers=headers)
    assert honest.status == 200, await honest.text()
