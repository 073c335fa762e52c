"""Admin API bodies Python's JSON reader refuses with something other than ValueError:
nesting deeper than the interpreter's recursion limit raised RecursionError out of
coordinator/api/common.json_body, a 500 internal_error on every admin route that reads a
body (the key PATCH issue 26 added among them). Now a 400 in the API's error format with
param "body", nothing changed, and the honest request after it is served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.process import wait_until
from tests.coordinator.coordinator_testing import ADMIN_HEADERS, Coordinator, MakeCoordinator
from tests.coordinator.test_coordinator_api_keys import Agent, accepts

pytestmark = pytest.mark.timeout(60)

HOSTILE = {
    "nested lists": "[" * 20_000,
    "nested in a field": '{"policy": ' + '{"moderation":' * 3_000 + "{}" + "}" * 3_001,
    "nested objects": '{"a":' * 3_000 + "1" + "}" * 3_000,
}


async def _send(c: Coordinator, method: str, path: str, data: str) -> tuple[int, Any]:
    headers = ADMIN_HEADERS | {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.request(method, c.http_url + path, data=data.encode()) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize("what", sorted(HOSTILE))
async def test_a_body_nested_too_deeply_is_a_400(
    make_coordinator: MakeCoordinator, what: str
) -> None:
    c = await make_coordinator()
    status, minted = await _send(c, "POST", "/v1/admin/keys", '{"name": "app"}')
    assert status == 201, minted
    key = f"/v1/admin/keys/{minted['key_id']}"
    routes = [("POST", "/v1/admin/keys"), ("PATCH", key), ("POST", "/v1/admin/tokens"),
              ("POST", "/v1/admin/rollouts")]  # fmt: skip
    for method, path in routes:
        status, body = await _send(c, method, path, HOSTILE[what])
        assert status == 400, (method, path, body)
        error = body["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "body"), error
        assert "Traceback" not in error["message"] and len(error["message"]) < 300
    status, listed = await _send(c, "GET", "/v1/admin/keys", "")
    assert status == 200 and [k["key_id"] for k in listed["data"]] == [minted["key_id"]]
    status, changed = await _send(c, "PATCH", key, '{"max_keep_alive_s": 60}')
    assert status == 200 and changed["max_keep_alive_s"] == 60, changed


# JSON's \ud800 escape is valid syntax; Python reads it into a str that neither protobuf
# nor the stores encode. A key minted with such a model name was stored (201), and then
# every keys section the coordinator built for its agents failed to serialize.
SURROGATES = [
    ('{"name": "k", "models": ["m\\udfff"]}', "models.0"),
    ('{"name": "a\\ud800"}', "name"),
    ('{"name": "k", "policy": {"moderation": {"input": {"\\ud800": "block"}}}}',
     "policy.moderation.input.\\ud800"),
]  # fmt: skip


async def test_a_lone_surrogate_is_a_400_and_keys_still_reach_agents(
    make_coordinator: MakeCoordinator, tmp_path: Path
) -> None:
    c = await make_coordinator(report_interval_ms=1000)
    async with Agent(c, "edge-1", tmp_path / "a1") as agent:
        for body, param in SURROGATES:
            status, answer = await _send(c, "POST", "/v1/admin/keys", body)
            assert status == 400, answer
            error = answer["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        status, minted = await _send(c, "POST", "/v1/admin/keys", '{"name": "app"}')
        assert status == 201, minted
        status, changed = await _send(
            c, "PATCH", f"/v1/admin/keys/{minted['key_id']}",
            '{"policy": {"moderation": {"output": {"hate": "block"}}, "x\\udfff": 1}}',
        )  # fmt: skip
        assert status == 400 and changed["error"]["param"] == "policy.x\\udfff", changed
        await wait_until(lambda: accepts(agent.table, minted["secret"]), timeout_s=5,
                         message="the honest key reached the agent")  # fmt: skip
        status, listed = await _send(c, "GET", "/v1/admin/keys", "")
        assert status == 200 and [k["name"] for k in listed["data"]] == ["app"], listed
