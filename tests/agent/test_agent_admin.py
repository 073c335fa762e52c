"""A standalone agent's loopback admin API (agent/api/admin.py): load and unload a model's
weights now, with the agent's admin token, from loopback only, with API keys on."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import TestClient, make_mocked_request

from agent.api.admin import ADMIN_TOKEN, AdminToken
from agent.auth.key_files import write_keys
from agent.auth.keys import new_secret, secret_digest
from agent.errors import AdminForbiddenError, InvalidAdminTokenError
from edgefleet.contract import ApiKey, KeysSection
from tests.agent.conftest import TINY, ClientFactory
from tests.netns import needs_netns, run_scenario

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def agent(make_client: ClientFactory, tmp_path: Path) -> tuple[TestClient, str, str]:
    """An agent with API keys on (a keys file) and its admin token file; returns the
    client, the admin token and an API key."""
    key_id, secret = new_secret()
    keys = tmp_path / "keys.json"
    write_keys(keys, KeysSection(1, (ApiKey(key_id, secret_digest(secret)),)))
    client = await make_client(
        auth={"keys_file": str(keys), "admin_token_file": str(tmp_path / "state" / "admin")},
        residency={"min_residency_s": 0},
    )
    # made on first use (the agent's start makes it: see agent/__main__.py serve())
    return client, client.app[ADMIN_TOKEN].value(), secret


async def _call(
    client: TestClient, method: str, path: str, token: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    resp = await client.request(method, path, headers=headers)
    return resp.status, await resp.json()


async def test_load_and_unload_with_the_admin_token(
    agent: tuple[TestClient, str, str], tmp_path: Path
) -> None:
    client, token, api_key = agent
    path = tmp_path / "state" / "admin"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and token.startswith("efa-")
    status, body = await _call(client, "POST", f"/v1/admin/models/{TINY}/unload", token)
    assert status == 200 and body["unloaded"] is True and body["state"] == "available"
    models = await client.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    [card] = (await models.json())["data"]
    assert card["state"] == "available" and card["resident_bytes"] == 0
    status, body = await _call(client, "POST", f"/v1/admin/models/{TINY}/load", token)
    assert status == 200 and body["state"] == "loaded" and body["resident_bytes"] > 0
    status, body = await _call(client, "GET", "/v1/admin/models", token)
    assert status == 200 and [m["model"] for m in body["data"]] == [TINY]
    status, body = await _call(client, "POST", f"/v1/admin/models/{TINY}/unload", token)
    status, body = await _call(client, "POST", f"/v1/admin/models/{TINY}/unload", token)
    assert status == 200 and body["unloaded"] is False  # not loaded: nothing to do


async def test_api_keys_and_wrong_tokens_never_open_it(agent: tuple[TestClient, str, str]) -> None:
    client, token, api_key = agent
    for wrong in (None, api_key, token + "x", token[:-1], "", "efa-" + "A" * 43):
        status, body = await _call(client, "POST", f"/v1/admin/models/{TINY}/unload", wrong)
        assert status == 401 and body["error"]["code"] == "invalid_admin_token", wrong
    # and the admin token is not an API key
    resp = await client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 401
    # bad model names, in the API's own error format
    for model, code, want in (
        ("nope", "model_not_found", 404),
        ("x" * 300, "invalid_request_error", 400),
        (f"{TINY}@v9", "invalid_request_error", 400),
    ):
        status, body = await _call(client, "POST", f"/v1/admin/models/{model}/load", token)
        assert status == want and code in (body["error"]["code"], body["error"]["type"]), body
    status, body = await _call(client, "GET", "/v1/models", None)
    assert status == 401  # keys are on: the admin routes' opening changed nothing else


def _request(path: str, token: str | None, peer: object, local: object = None) -> Any:
    """A request as the admin API sees it, from ``peer`` to the local address ``local``."""
    transport = mock.Mock()
    info = {"peername": peer, "sockname": local}
    transport.get_extra_info.side_effect = lambda name, default=None: info.get(name, default)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return make_mocked_request("POST", path, headers=headers, transport=transport)


def _check(admin: AdminToken, request: Any, refused: bool) -> None:
    if refused:
        with pytest.raises(AdminForbiddenError):
            admin.check(request)
    else:
        admin.check(request)


def test_a_peer_beyond_loopback_is_refused_even_with_the_token(tmp_path: Path) -> None:
    admin = AdminToken(tmp_path / "admin-token")
    token = admin.value()
    for peer, refused in ((("10.0.0.9", 5555), True), (("127.0.0.1", 5555), False),
                          (("::1", 5555, 0, 0), False), (("192.168.1.2", 1), True)):  # fmt: skip
        _check(admin, _request("/v1/admin/models/m/load", token, peer), refused)
    with pytest.raises(InvalidAdminTokenError):  # loopback, no token
        admin.check(_request("/v1/admin/models", None, ("127.0.0.1", 9)))
    # a second agent process on the same state dir reads the token, never overwrites it
    assert AdminToken(tmp_path / "admin-token").value() == token


def test_a_call_to_the_address_it_was_made_to_is_from_this_box(tmp_path: Path) -> None:
    """An agent bound only to a LAN address: a command on the box reaches it there (the
    peer is the local address it connected to); any other LAN peer is still refused."""
    admin = AdminToken(tmp_path / "admin-token")
    token = admin.value()
    cases = (
        (("10.77.0.1", 4000), ("10.77.0.1", 8000), False),
        (("::ffff:10.77.0.1", 4000, 0, 0), ("10.77.0.1", 8000), False),
        (("10.77.0.2", 4000), ("10.77.0.1", 8000), True),
        (("10.77.0.2", 4000), None, True),
    )
    for peer, local, refused in cases:
        _check(admin, _request("/v1/admin/models", token, peer, local), refused)


@pytest.mark.slow
@needs_netns
def test_models_command_reaches_an_agent_bound_only_to_a_lan_address(
    tiny_artifacts: Path,
) -> None:
    """In a private network namespace (never a real NIC; 10.77.0.1 is one of its
    addresses, not a loopback one): an agent on 10.77.0.1 only, HTTPS and API keys on;
    ``python -m agent models list`` on the box lists its model, and a wrong admin token
    is refused."""
    result = run_scenario(
        "ip link set lo up && ip addr add 10.77.0.1/32 dev lo",
        "tests/agent/admin_lan_scenario.py", str(tiny_artifacts), timeout_s=150,
    )  # fmt: skip
    assert result["agent_url"].startswith("https://10.77.0.1:"), result
    assert result["list_rc"] == 0, result
    assert TINY in {m["model"] for m in json.loads(result["list_out"])["data"]}, result
    assert result["wrong_rc"] == 1 and "401" in result["wrong_err"], result
