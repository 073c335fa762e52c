"""Who may open a Session: enrollment credentials, the client certificate, the enrolled site."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from coordinator.errors import AuthenticationError, PermissionDeniedError
from coordinator.identity.join_tokens import sha256_hex
from coordinator.identity.session_auth import SessionAuthenticator
from coordinator.store.interface import FleetStore, JoinToken, StoredAgent
from edgefleet.contract import Hello, LoadedModel
from tests.coordinator.store_backends import StoreFactory, backend, store_factory

pytestmark = pytest.mark.timeout(10)

__all__ = ["backend", "store_factory"]  # fixtures: every test runs on both stores

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CREDENTIAL = "edge-1-credential"


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[FleetStore]:
    """On each store backend (tests/coordinator/store_backends.py)."""
    opened = store_factory()
    await opened.open()
    await opened.add_token(JoinToken("tok", "ab" * 32, NOW, NOW + timedelta(days=1), 5))
    for agent_id, site in (("edge-1", "berlin"), ("edge-free", "")):
        enrolled = StoredAgent(
            agent_id, enrolled_at=NOW, token_id="tok",
            credential_sha256=sha256_hex(CREDENTIAL), site=site,
        )  # fmt: skip
        assert await opened.enroll("tok", NOW, enrolled)
    yield opened
    await opened.close()


def hello(agent_id: str = "edge-1", *, token: str = CREDENTIAL, site: str = "munich") -> Hello:
    return Hello(
        agent_id=agent_id, site=site, http_url="http://10.0.0.7:8000",
        models=(LoadedModel("m", "v1"),), token=token,
    )  # fmt: skip


def auth(
    store: FleetStore, *, enrollment: bool = False, mtls: bool = False
) -> SessionAuthenticator:
    return SessionAuthenticator(store, require_enrollment=enrollment, require_mtls=mtls)


async def test_an_enrolled_agent_with_its_credential_gets_in_at_its_enrolled_site(
    store: FleetStore,
) -> None:
    accepted, enrolled = await auth(store).authenticate(hello(site="munich"), None)
    assert enrolled is True
    assert accepted.site == "berlin"  # the site recorded at enrollment wins
    assert accepted.agent_id == "edge-1" and accepted.models == hello().models


async def test_an_agent_enrolled_without_a_site_keeps_the_one_it_says(
    store: FleetStore,
) -> None:
    accepted, enrolled = await auth(store).authenticate(hello("edge-free", site="munich"), None)
    assert enrolled and accepted.site == "munich"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "agent 'edge-1' is enrolled; Hello.token must carry its credentials"),
        ("someone-elses", "the credentials do not belong to agent 'edge-1'"),
        (CREDENTIAL + "x", "the credentials do not belong to agent 'edge-1'"),
    ],
)
async def test_an_enrolled_agent_without_its_credential_is_refused(
    store: FleetStore, token: str, message: str
) -> None:
    with pytest.raises(AuthenticationError, match=message):
        await auth(store).authenticate(hello(token=token), None)


async def test_an_unenrolled_agent_is_let_in_only_when_enrollment_is_optional(
    store: FleetStore,
) -> None:
    accepted, enrolled = await auth(store).authenticate(hello("stranger", token=""), None)
    assert enrolled is False and accepted.site == "munich"
    with pytest.raises(AuthenticationError, match="'stranger' is not enrolled"):
        await auth(store, enrollment=True).authenticate(hello("stranger", token=""), None)
    # An agent that only ever said Hello (stored, not enrolled) is still not enrolled.
    await store.save_hello(hello("stranger", token=""), NOW)
    with pytest.raises(AuthenticationError, match="not enrolled"):
        await auth(store, enrollment=True).authenticate(hello("stranger", token=""), None)


async def test_mutual_tls_needs_a_certificate_for_the_same_agent(store: FleetStore) -> None:
    with pytest.raises(AuthenticationError, match="requires mutual TLS"):
        await auth(store, mtls=True).authenticate(hello(), None)
    with pytest.raises(PermissionDeniedError, match="certificate is for agent 'edge-free'"):
        await auth(store, mtls=True).authenticate(hello(), "edge-free")
    accepted, enrolled = await auth(store, mtls=True).authenticate(hello(), "edge-1")
    assert enrolled and accepted.site == "berlin"


async def test_a_certificate_does_not_replace_the_credential(store: FleetStore) -> None:
    with pytest.raises(AuthenticationError, match="do not belong"):
        await auth(store, mtls=True).authenticate(hello(token="forged"), "edge-1")
