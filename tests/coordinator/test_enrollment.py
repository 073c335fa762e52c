"""Enroll with join tokens: good, expired, exhausted, revoked, unknown; forged sessions."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import grpc
import pytest

from coordinator.api.app_keys import REGISTRY_KEY, STORE_KEY, TOKENS_KEY
from edgefleet.v1 import fleet_pb2 as pb
from tests.coordinator.coordinator_testing import MakeCoordinator, hello
from tests.coordinator.store_backends import on_both_stores

pytestmark = pytest.mark.timeout(30)
# Each test that starts a coordinator runs on SQLite and on PostgreSQL.
pytest_generate_tests = on_both_stores


async def enroll(
    stub: object, token: str, name: str = "edge-1", site: str = ""
) -> pb.EnrollResponse:
    return await stub.Enroll(  # type: ignore[attr-defined, no-any-return]
        pb.EnrollRequest(join_token=token, requested_name=name, site=site)
    )


async def rejected(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value


async def test_good_token_enrolls_and_the_agent_can_open_a_session(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator()
    reply = await enroll(c.stub, await c.new_token(site="berlin"), site="berlin")
    assert reply.agent_id == "edge-1"
    assert reply.credentials and "BEGIN CERTIFICATE" in reply.client_cert_pem
    assert "BEGIN CERTIFICATE" in reply.ca_cert_pem and "PRIVATE KEY" in reply.client_key_pem
    stored = await c.app[STORE_KEY].get_agent("edge-1")
    assert stored is not None and stored.enrolled and stored.site == "berlin"

    call = c.stub.Session()
    await call.write(hello("edge-1", token=reply.credentials, site="elsewhere"))
    assert (await call.read()).WhichOneof("body") == "welcome"
    record = c.app[REGISTRY_KEY].get("edge-1")
    assert record.enrolled
    assert record.hello.site == "berlin"  # the token's site wins over what the agent says
    call.cancel()


async def test_a_taken_name_gets_a_fresh_agent_id(make_coordinator: MakeCoordinator) -> None:
    c = await make_coordinator()
    token = await c.new_token(max_uses=2)
    first = await enroll(c.stub, token)
    second = await enroll(c.stub, token)
    assert first.agent_id == "edge-1"
    assert second.agent_id.startswith("edge-1-") and second.agent_id != first.agent_id


@pytest.mark.parametrize("case", ["expired", "exhausted", "revoked", "unknown", "wrong_secret"])
async def test_unusable_tokens_are_refused_and_nothing_is_registered(
    make_coordinator: MakeCoordinator, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = await make_coordinator()
    token = await c.new_token(expires_in=timedelta(milliseconds=50) if case == "expired" else None)
    if case == "expired":
        await asyncio.sleep(0.1)
    elif case == "exhausted":
        await enroll(c.stub, token, name="first")
    elif case == "revoked":
        await c.app[TOKENS_KEY].revoke(token.split("_", 1)[1].split(".")[0])
    elif case == "unknown":
        token = "eft_0123456789ab." + "x" * 32
    elif case == "wrong_secret":
        token = token.split(".")[0] + "." + "y" * 32
    before = {a.agent_id for a in await c.app[STORE_KEY].list_agents()}
    with caplog.at_level(logging.WARNING, logger="coordinator.rpc.service"):
        error = await rejected(enroll(c.stub, token, name="second"))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    expected = {
        "expired": "expired at",
        "exhausted": "already used 1 of 1",
        "revoked": "was revoked",
        "unknown": "is not known",
        "wrong_secret": "is not known",
    }[case]
    assert expected in error.details()
    assert {a.agent_id for a in await c.app[STORE_KEY].list_agents()} == before
    assert "second" not in before
    assert any("refused enrollment" in r.getMessage() for r in caplog.records)
    metrics = await _metrics(c.http_url)
    assert "edgefleet_coordinator_enrollments_total{result=" in metrics
    reason = {
        "expired": "expired_token",
        "exhausted": "exhausted_token",
        "revoked": "revoked_token",
        "unknown": "unknown_token",
        "wrong_secret": "unknown_token",
    }[case]
    assert f'edgefleet_coordinator_enrollments_total{{result="{reason}"}} 1.0' in metrics


async def test_site_bound_token_refuses_another_site(make_coordinator: MakeCoordinator) -> None:
    c = await make_coordinator()
    error = await rejected(enroll(c.stub, await c.new_token(site="berlin"), site="munich"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "for site 'berlin', not 'munich'" in error.details()


async def test_forged_agent_id_or_credentials_are_refused(
    make_coordinator: MakeCoordinator,
) -> None:
    c = await make_coordinator(require_enrollment="on")
    reply = await enroll(c.stub, await c.new_token())

    cases = [
        (hello("edge-1", token="not-the-credential"), "do not belong to agent 'edge-1'"),
        (hello("edge-1"), "Hello.token must carry its credentials"),
        (hello("someone-else", token=reply.credentials), "is not enrolled"),
    ]
    for message, expected in cases:
        call = c.stub.Session()
        await call.write(message)
        error = await rejected(call.read())
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert expected in error.details()
    assert c.app[REGISTRY_KEY].agents() == []


async def _metrics(http_url: str) -> str:
    import aiohttp

    from tests.coordinator.coordinator_testing import ADMIN_HEADERS

    async with (
        aiohttp.ClientSession(headers=ADMIN_HEADERS) as http,
        http.get(http_url + "/metrics") as response,
    ):
        return await response.text()
