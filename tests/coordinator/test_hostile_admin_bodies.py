"""Admin API bodies Python's JSON reader refuses with something other than ValueError:
nesting deeper than the interpreter's recursion limit raised RecursionError out of
coordinator/api/common.json_body, a 500 internal_error on every admin route that reads a
body (the key PATCH issue 26 added among them). Now a 400 in the API's error format with
param "body", nothing changed, and the honest request after it is served."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.coordinator.coordinator_testing import ADMIN_HEADERS, Coordinator, MakeCoordinator

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
