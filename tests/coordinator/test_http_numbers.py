"""Numbers at the coordinator's HTTP boundary: what JSON cannot say (NaN, Infinity), what a
double cannot hold (1e400, which Python's json turns into inf) and integers beyond a
field's range are a 400 in the API's own error format on every admin route with a JSON
body, never a 500 nor a value stored or answered as ``NaN``. (API keys' own fields:
test_coordinator_api_keys.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.coordinator.coordinator_testing import ADMIN_HEADERS, Coordinator, MakeCoordinator

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def coordinator(make_coordinator: MakeCoordinator) -> AsyncIterator[Coordinator]:
    yield await make_coordinator()


async def send(c: Coordinator, method: str, path: str, raw: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.request(method, c.http_url + path, data=raw,
                     headers={"Content-Type": "application/json"}) as response,
    ):  # fmt: skip
        return response.status, await response.json()


ROLLOUT = '"model": "m", "version": "v2", '


@pytest.mark.parametrize(
    ("method", "path", "raw", "param"),
    [
        # each of these was a 500 (OverflowError or ValueError from int() of inf or NaN)
        ("POST", "/v1/admin/tokens", '{"max_uses": Infinity}', "body"),
        ("POST", "/v1/admin/tokens", '{"max_uses": NaN}', "body"),
        ("POST", "/v1/admin/tokens", '{"expires_in_s": 1e400}', "body"),
        ("POST", "/v1/admin/tokens", '{"expires_in_s": -1e400}', "body"),
        # and these were answered as before: in range or not, now with the range named
        ("POST", "/v1/admin/tokens", '{"max_uses": 1e300}', "max_uses"),
        ("POST", "/v1/admin/tokens", f'{{"max_uses": {10**400}}}', "max_uses"),
        ("POST", "/v1/admin/tokens", '{"expires_in_s": 0}', "expires_in_s"),
        ("POST", "/v1/admin/tokens", '{"lat": NaN, "lon": 0}', "body"),
        ("PATCH", "/v1/admin/agents/edge-1", '{"lat": 1e400, "lon": 0}', "body"),
        ("POST", "/v1/admin/rollouts", "{" + ROLLOUT + '"soak_s": NaN}', "body"),
        ("POST", "/v1/admin/rollouts", "{" + ROLLOUT + '"waves": [Infinity]}', "body"),
        ("POST", "/v1/admin/models/m/v1/deploy", '{"selector": {"sites": [NaN]}}', "body"),
    ],
)
async def test_numbers_beyond_json_or_the_field_are_a_400(
    coordinator: Coordinator, method: str, path: str, raw: str, param: str
) -> None:
    status, body = await send(coordinator, method, path, raw)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "invalid_parameter"
    assert body["error"]["param"] == param, body


@pytest.mark.parametrize("rtt", ["nan", "inf", "-inf", "1e400", "-1"])
async def test_a_route_lookup_with_an_rtt_that_is_not_a_time_is_a_400(
    coordinator: Coordinator, rtt: str
) -> None:
    """As the gRPC Route refuses it: "nan" was taken, scored the agent NaN and answered
    ``"score": NaN``, which no JSON parser reads."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(coordinator.http_url + f"/v1/route?model=m&rtt=edge-1:{rtt}") as response,
    ):
        body = await response.json()
    assert response.status == 400, body
    assert body["error"]["param"] == "rtt"
