"""Resuming a broken stream on another agent, and agents kept while the coordinator is away.

Two agent apps serve the tiny model on real loopback sockets as shipped: API keys on, HTTPS
with certificates of a fleet CA the client trusts. The first one fails each generation
after a few tokens (an ``engine_error`` event mid-stream, as an agent whose engine dies
sends). The coordinator address points at a closed port: the client works from
the agents it discovered last, kept on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from agent.api.app import REGISTRY, create_app
from agent.auth.key_files import write_keys
from agent.auth.keys import new_secret, secret_digest
from agent.config import load_config
from agent.errors import EngineError
from coordinator.identity.ca import CertificateAuthority
from edgefleet.contract import ApiKey, KeysSection
from edgefleet.tls import fleet_client_context, server_context
from edgefleet_client import Agent, DiscoveryError, FleetClient
from tests.certs import write_agent_cert

pytestmark = [pytest.mark.timeout(120)]

TINY = "tiny-llama"


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclasses.dataclass
class Fleet:
    """Agents with keys on and HTTPS, and what a client needs to reach them."""

    servers: list[TestServer]
    api_key: str
    ca_file: Path


async def _agent(artifacts: Path, keys_file: Path, tls: ssl.SSLContext) -> TestServer:
    config = load_config(
        environ={},
        overrides={
            "models": {"dir": str(artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 256, "default_max_tokens": 16},
            "auth": {"keys_file": str(keys_file)},
        },
    )
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server(ssl=tls)
    return server


def _fail_after(server: TestServer, n: int) -> None:
    model = server.app[REGISTRY].text_model(TINY)
    real = model.generate

    async def generate(request: Any) -> Any:
        produced = 0
        async for output in real(request):
            if produced == n:
                raise EngineError("the engine died")
            produced += 1
            yield output

    model.generate = generate  # type: ignore[method-assign]


@pytest.fixture
async def two_agents(tiny_artifacts: Path, tmp_path: Path) -> AsyncIterator[Fleet]:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    ca_file = tmp_path / "fleet-ca.pem"
    ca_file.write_text(ca.cert_pem)
    key_id, secret = new_secret()
    keys_file = tmp_path / "keys.json"
    write_keys(
        keys_file, KeysSection(0, (ApiKey(key_id=key_id, secret_sha256=secret_digest(secret)),))
    )
    servers = [
        await _agent(tiny_artifacts, keys_file, server_context(write_agent_cert(ca, tmp_path, n)))
        for n in ("edge-0", "edge-1")
    ]
    yield Fleet(servers, secret, ca_file)
    for server in servers:
        await server.close()


def _client(fleet: Fleet, kept: Path) -> FleetClient:
    """A client of those agents, from the kept list (its coordinator is away)."""
    _kept(kept, fleet.servers)
    return FleetClient(
        TINY, coordinator_url=_closed_port_url(), cache_path=kept, ca_file=fleet.ca_file,
        api_key=fleet.api_key,
    )  # fmt: skip


def _direct(fleet: Fleet, server: TestServer) -> openai.AsyncOpenAI:
    """The SDK straight to one agent (the uninterrupted reference)."""
    return openai.AsyncOpenAI(
        base_url=str(server.make_url("/v1")), api_key=fleet.api_key, max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(verify=fleet_client_context(
            fleet.ca_file.read_text())),
    )  # fmt: skip


def _kept(path: Path, servers: list[TestServer]) -> None:
    agents = [
        {"agent_id": f"edge-{i}", "url": str(s.make_url("")).rstrip("/"), "site": "lab"}
        for i, s in enumerate(servers)
    ]
    path.write_text(json.dumps({"model": TINY, "agents": agents}))


async def test_stream_broken_mid_way_resumes_on_the_next_agent(
    two_agents: Fleet, tmp_path: Path
) -> None:
    _fail_after(two_agents.servers[0], 5)
    fleet = _client(two_agents, tmp_path / "agents.json")
    client = fleet.openai(timeout=30)
    body: dict[str, Any] = {
        "model": TINY,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 12,
        "temperature": 0.9,
        "seed": 11,
        "extra_body": {"cache": False},
    }

    def streamed() -> tuple[list[Any], Any]:
        stream = client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **body
        )
        return list(stream), stream.response.extensions["edgefleet_segments"]

    chunks, segments = await asyncio.to_thread(streamed)
    direct = _direct(two_agents, two_agents.servers[1])
    reference = await direct.chat.completions.create(**body)
    await direct.close()
    # one uninterrupted stream for the caller
    assert [(s.agent_id, s.first_token, s.tokens) for s in segments] == [
        ("edge-0", 0, 5),
        ("edge-1", 5, 7),
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference.choices[0].message.content
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]  # the resumed segment's role chunk is not repeated
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    assert chunks[-1].usage is not None and reference.usage is not None
    assert chunks[-1].usage.model_dump() == reference.usage.model_dump()
    # the failed agent is avoided for a while
    assert fleet.candidates()[0].agent_id == "edge-1"


def _fail_before_finish(server: TestServer) -> None:
    """The agent delivers every token and dies before its finish reaches the caller."""
    model = server.app[REGISTRY].text_model(TINY)
    real = model.generate

    async def generate(request: Any) -> Any:
        async for output in real(request):
            if output.finish_reason is not None:
                yield dataclasses.replace(output, finish_reason=None)
                raise EngineError("the engine died")
            yield output

    model.generate = generate  # type: ignore[method-assign]


@pytest.mark.parametrize("chat", [True, False])
async def test_a_stream_broken_after_its_last_token_ends_at_max_tokens(
    two_agents: Fleet, tmp_path: Path, chat: bool
) -> None:
    """Every token max_tokens allows was delivered and the agent died before its finish:
    the resumed segment (max_tokens cannot be 0) generates one more, which the caller
    never sees; the stream ends with "length" and the usage of one completion of
    max_tokens, as the uninterrupted one does (a SIGKILLed agent in the e2e resume test
    once left a stream with 81 tokens of 80)."""
    _fail_before_finish(two_agents.servers[0])
    client = _client(two_agents, tmp_path / "agents.json").openai(timeout=30)
    common: dict[str, Any] = {
        "model": TINY, "max_tokens": 10, "temperature": 0.9, "seed": 5,
        "extra_body": {"cache": False, "min_tokens": 10},
    }  # fmt: skip
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Say hi"}]} if chat else {"prompt": "Say hi"}
    )

    def streamed() -> tuple[list[Any], Any]:
        create = client.chat.completions.create if chat else client.completions.create
        stream = create(stream=True, stream_options={"include_usage": True}, **common, **prompt)
        return list(stream), stream.response.extensions["edgefleet_segments"]

    chunks, segments = await asyncio.to_thread(streamed)
    direct = _direct(two_agents, two_agents.servers[1])
    if chat:
        reference: Any = await direct.chat.completions.create(**common, **prompt)
    else:
        reference = await direct.completions.create(**common, **prompt)
    await direct.close()
    assert [(s.agent_id, s.first_token) for s in segments] == [("edge-0", 0), ("edge-1", 10)]
    assert segments[0].tokens == 10

    def piece(c: Any) -> str:
        return (c.choices[0].delta.content or "") if chat else c.choices[0].text

    text = "".join(piece(c) for c in chunks if c.choices)
    expected = reference.choices[0].message.content if chat else reference.choices[0].text
    assert text == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage is not None and reference.usage is not None
    assert chunks[-1].usage.model_dump() == reference.usage.model_dump()


async def test_non_resumable_error_event_reaches_the_caller(
    two_agents: Fleet, tmp_path: Path
) -> None:
    two_agents.servers = two_agents.servers[:1]  # nowhere to resume
    _fail_after(two_agents.servers[0], 3)
    client = _client(two_agents, tmp_path / "agents.json").openai(timeout=30)

    def streamed() -> None:
        stream = client.chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            stream=True, extra_body={"cache": False},
        )  # fmt: skip
        list(stream)

    with pytest.raises(openai.APIConnectionError):
        await asyncio.to_thread(streamed)


def test_kept_agents_serve_when_the_coordinator_is_away(tmp_path: Path) -> None:
    kept = tmp_path / "agents.json"
    away = _closed_port_url()
    fresh = FleetClient(TINY, coordinator_url=away, cache_path=kept)
    with pytest.raises(DiscoveryError):
        fresh.candidates()  # nothing discovered yet, nothing kept
    kept.write_text(
        json.dumps({"model": TINY, "agents": [{"agent_id": "a1", "url": "https://10.0.0.7:8000"}]})
    )
    restarted = FleetClient(TINY, coordinator_url=away, cache_path=kept)
    assert restarted.candidates() == [Agent(agent_id="a1", url="https://10.0.0.7:8000")]
    other_model = FleetClient("other-model", coordinator_url=away, cache_path=kept)
    with pytest.raises(DiscoveryError):
        other_model.candidates()
