"""The client sends requests (and its API key) only to agents that prove their fleet identity.

Replays the leak: a route answer naming an attacker's plain-HTTP server, or an HTTPS server
whose certificate is not from the fleet CA. Before this change the attacker received the
``Authorization`` header (1 of 1 requests, ``key_leak_replay.py`` on 7475bf3); now it receives
no request at all, and an honest fleet agent in the same answer serves the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.api.app import create_app
from agent.config import load_config
from coordinator.identity.ca import CertificateAuthority
from edgefleet.tls import server_context
from tests.client.key_leak_replay import (
    SECRET,
    ask,
    attacker_app,
    route_app,
    serving,
    write_agent_cert,
)

TINY = "tiny-llama"


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "fleet-ca")


@pytest.fixture
def honest_agent(tmp_path: Path, tiny_artifacts: Path, ca: CertificateAuthority) -> Iterator[str]:
    """A real agent app (tiny model) serving HTTPS with its fleet certificate."""
    files = write_agent_cert(ca, tmp_path, "edge-honest")
    config = load_config(
        environ={},
        overrides={
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 4, "intra_op_threads": 1},
        },
    )
    with serving(create_app(config), server_context(files)) as url:
        yield url


def _foreign_https_context(tmp_path: Path) -> object:
    """A server context whose certificate names 127.0.0.1 but comes from another CA."""
    other = CertificateAuthority.load_or_create(tmp_path / "attacker-ca")
    return server_context(write_agent_cert(other, tmp_path, "edge-attacker"))


async def test_plain_http_agent_in_a_route_answer_never_sees_the_key(
    tmp_path: Path, ca: CertificateAuthority, honest_agent: str
) -> None:
    received: list[str] = []
    with serving(attacker_app(received)) as attacker:
        # the attacker alone: a clear error, nothing sent
        alone = [{"agent_id": "edge-1", "http_url": attacker, "site": "default"}]
        with serving(route_app(alone)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator, ca_pem=ca.cert_pem)
        assert outcome.startswith("DiscoveryError")
        assert "proves its fleet identity" in outcome and attacker in outcome
        # the attacker ranked first, an honest fleet agent second: the honest one serves
        both = [*alone, {"agent_id": "edge-honest", "http_url": honest_agent, "site": "default"}]
        with serving(route_app(both)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator, ca_pem=ca.cert_pem)
        assert not outcome.startswith(("DiscoveryError", "APIConnectionError")), outcome
        assert outcome != "stolen"
    assert received == []


async def test_https_agent_without_a_fleet_certificate_never_sees_the_key(
    tmp_path: Path, ca: CertificateAuthority, honest_agent: str
) -> None:
    received: list[str] = []
    with serving(attacker_app(received), _foreign_https_context(tmp_path)) as attacker:
        alone = [{"agent_id": "edge-1", "http_url": attacker, "site": "default"}]
        with serving(route_app(alone)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator, ca_pem=ca.cert_pem)
        assert outcome.startswith("APIConnectionError"), outcome
        both = [*alone, {"agent_id": "edge-honest", "http_url": honest_agent, "site": "default"}]
        with serving(route_app(both)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator, ca_pem=ca.cert_pem)
        assert not outcome.startswith(("DiscoveryError", "APIConnectionError")), outcome
        assert outcome != "stolen"
        # a client that trusts no fleet CA cannot verify the honest agent either
        with serving(route_app(both)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator)
        assert outcome.startswith("APIConnectionError"), outcome
    assert received == []


async def test_loopback_http_agents_only_with_the_explicit_opt_in(tmp_path: Path) -> None:
    received: list[str] = []
    with serving(attacker_app(received)) as dev_agent:
        answer = [{"agent_id": "edge-dev", "http_url": dev_agent, "site": "default"}]
        with serving(route_app(answer)) as coordinator:
            outcome = await asyncio.to_thread(ask, coordinator, allow_insecure_agents=True)
    assert outcome == "stolen"  # the dev agent answered
    assert received == [f"Bearer {SECRET}"]


def test_plain_http_beyond_loopback_is_refused_even_with_the_opt_in() -> None:
    from edgefleet_client._models import Agent
    from edgefleet_client._trust import refusal

    lan = Agent(agent_id="a", url="http://10.0.0.7:8000")
    assert refusal(lan, allow_insecure_agents=True) is not None
    assert (
        refusal(Agent(agent_id="a", url="https://10.0.0.7:8000"), allow_insecure_agents=False)
        is None
    )
