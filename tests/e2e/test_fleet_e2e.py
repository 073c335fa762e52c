"""End to end: real quantized models, a coordinator and an agent as real processes, the
official ``openai`` SDK as the client.

As a site beyond loopback runs them: the coordinator with TLS (HTTPS API, mutual-TLS
sessions, enrollment required), the agent enrolled with a join token and serving HTTPS on
its enrollment certificate, API keys required; the client trusts the fleet CA and presents
a key minted through the admin API.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import pytest_asyncio

from devtools.fleet import AgentProcess, CoordinatorProcess, enrolled_agent
from devtools.process import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

LLM = "smollm2-135m-instruct"
# SmolLM2-135M is weak: even in fp32 it answers 2 of 6 phrasings of this question with
# French word salad; this phrasing gets "Paris" from fp32 and every quantized variant.
FRANCE = "Name the capital of France."
EMBEDDER = "all-minilm-l6-v2"


class Fleet:
    def __init__(self, coordinator: CoordinatorProcess, agent: AgentProcess, key: str) -> None:
        self.coordinator = coordinator
        self.agent = agent
        self.key = key
        self.client = openai.AsyncOpenAI(
            base_url=agent.url + "/v1", api_key=key, max_retries=0, timeout=120,
            http_client=openai.DefaultAsyncHttpxClient(verify=coordinator.ca_context()),
        )  # fmt: skip

    def http(self) -> aiohttp.ClientSession:
        """A plain HTTP client for the agent: its API key, the fleet CA."""
        return aiohttp.ClientSession(
            headers=self.agent.headers(self.key),
            connector=aiohttp.TCPConnector(ssl=self.coordinator.ca_context()),
        )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(
    real_artifacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    async with CoordinatorProcess(report_interval_ms=500, tls=True) as coordinator:
        agent = enrolled_agent(
            coordinator,
            agent_id="e2e-agent",
            site="lab",
            lat=48.85,
            lon=2.35,
            state_dir=tmp_path_factory.mktemp("e2e-agent"),
            models_dir=str(real_artifacts),
            serve=[LLM, EMBEDDER],
        )
        async with agent:
            fleet = Fleet(coordinator, agent, await coordinator.api_key_for([agent]))
            yield fleet
            await fleet.client.close()


async def test_agent_shows_up_at_the_coordinator(fleet: Fleet) -> None:
    async def registered() -> bool:
        agents = await fleet.coordinator.agents()
        return any(
            a["agent_id"] == "e2e-agent" and a["status"] == "connected" and a.get("load")
            for a in agents
        )

    await wait_until(registered, timeout_s=20, message="agent registered with a load report")
    agent = next(a for a in await fleet.coordinator.agents() if a["agent_id"] == "e2e-agent")
    assert agent["site"] == "lab"
    assert agent["http_url"] == fleet.agent.url
    assert {m["name"] for m in agent["models"]} == {LLM, EMBEDDER}


async def test_chat_knows_the_capital_of_france(fleet: Fleet) -> None:
    reply = await fleet.client.chat.completions.create(
        model=LLM,
        messages=[{"role": "user", "content": FRANCE}],
        temperature=0,
        max_tokens=40,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_streamed_chat_matches_and_counts_usage(fleet: Fleet) -> None:
    messages = [{"role": "user", "content": FRANCE}]
    plain = await fleet.client.chat.completions.create(
        model=LLM,
        messages=messages,
        temperature=0,
        max_tokens=30,  # type: ignore[arg-type]
    )
    stream = await fleet.client.chat.completions.create(
        model=LLM,
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"cache": False},  # compare two real generations, not a cache hit
    )
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == plain.choices[0].message.content
    assert usage is not None and plain.usage is not None
    assert usage.completion_tokens == plain.usage.completion_tokens
    assert "Paris" in "".join(parts)


async def test_completions_plain_and_streamed(fleet: Fleet) -> None:
    # a raw prompt (no server-side template): the model's own chat format, written out
    prompt = f"<|im_start|>user\n{FRANCE}<|im_end|>\n<|im_start|>assistant\n"
    done = await fleet.client.completions.create(
        model=LLM, prompt=prompt, max_tokens=12, temperature=0
    )
    assert "Paris" in done.choices[0].text
    stream = await fleet.client.completions.create(
        model=LLM,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"cache": False},
    )
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == done.choices[0].text


async def test_embeddings_put_paraphrases_closer(fleet: Fleet) -> None:
    sentences = [
        "The cat sat on the mat.",
        "A cat was sitting on the rug.",
        "Quarterly revenue rose by eight percent.",
    ]
    result = await fleet.client.embeddings.create(model=EMBEDDER, input=sentences)
    vectors = np.array([d.embedding for d in result.data])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.3
    floats = await fleet.client.embeddings.create(
        model=EMBEDDER, input=sentences[0], encoding_format="float"
    )
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-6)


async def test_seeded_sampling_repeats(fleet: Fleet) -> None:
    async def once() -> str:
        r = await fleet.client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": "Write a word."}],
            temperature=1.0,
            seed=7,
            max_tokens=12,
            extra_body={"cache": False},
        )
        return r.choices[0].message.content or ""

    assert await once() == await once()


BAD = [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/chat/completions", b'{"model": "\xff"}', 400),
    ("/v1/chat/completions", b"[]", 400),
    ("/v1/chat/completions", b"", 400),
    (
        "/v1/chat/completions",
        {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
        404,
    ),
    ("/v1/chat/completions", {"model": LLM}, 400),
    ("/v1/chat/completions", {"model": LLM, "messages": []}, 400),
    ("/v1/chat/completions", {"model": LLM, "messages": "hello"}, 400),
    ("/v1/chat/completions", {"model": LLM, "messages": [{"role": "user", "content": 5}]}, 400),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "x"}], "temperature": "0"},
        400,
    ),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "x"}], "n": 3},
        400,
    ),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
        400,
    ),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**7},
        400,
    ),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "lorem " * 3000}]},
        400,
    ),
    (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "x" * 2_000_000}]},
        413,
    ),
    ("/v1/completions", {"model": LLM, "prompt": [10**9]}, 400),
    ("/v1/completions", {"model": LLM, "prompt": "x", "echo": True}, 400),
    ("/v1/embeddings", {"model": EMBEDDER, "input": []}, 400),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "word " * 1000}, 400),
    ("/v1/embeddings", {"model": LLM, "input": "x"}, 400),
    ("/v1/models/extra/path", {}, 404),
]


async def test_twenty_kinds_of_bad_requests_then_still_serving(fleet: Fleet) -> None:
    assert len(BAD) >= 20
    async with fleet.http() as http:
        for path, body, status in BAD:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with http.post(
                fleet.agent.url + path,
                data=io.BytesIO(data),
                headers={"Content-Type": "application/json"},
            ) as resp:
                assert resp.status == status, (path, body if len(data) < 200 else "<big>")
                error = (await resp.json())["error"]
                assert error["message"] and error["type"]
    reply = await fleet.client.chat.completions.create(
        model=LLM,
        messages=[{"role": "user", "content": FRANCE}],
        temperature=0,
        max_tokens=20,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert fleet.agent.returncode is None


async def test_health_answers_while_generating(fleet: Fleet) -> None:
    """/healthz answers mid-generation, and says one is running (its latency then:
    ``python -m benchmarks.responsiveness``)."""
    import asyncio

    generation = asyncio.create_task(
        fleet.client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
            max_tokens=120,
            temperature=0,
        )
    )
    await asyncio.sleep(0.5)
    async with (
        fleet.http() as http,
        http.get(fleet.agent.url + "/healthz") as resp,
    ):
        assert resp.status == 200
        health = await resp.json()
    assert health["running"] == 1
    assert not generation.done()  # answered while the generation ran, not after it
    await generation
