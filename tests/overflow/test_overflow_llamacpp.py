"""The cloud pool is a real, independently written OpenAI-compatible server: llama.cpp's
(llama-cpp-python's server with SmolLM2-135M-Instruct's GGUF), started on loopback.

Why llama.cpp rather than ``transformers serve``: the benchmarks already run it
(benchmarks/llamacpp_server.py; benchmarks/llamacpp_build.py builds its venv once per kind
of CPU into ``~/.cache/edgefleet/llamacpp/<key>/``, shared by tests, benchmarks and CI on
the machine), it loads in about a second, and it ends its streams with ``[DONE]`` as OpenAI
does (the forwarder copes without one too). ``transformers serve`` would bring a 1.2 GB
torch venv. The first run on a machine builds the venv (minutes, once).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from benchmarks.llamacpp_build import describe
from benchmarks.llamacpp_server import LlamaCppServer
from edgefleet.contract import OverflowApi, OverflowEndpoint, OverflowKind, OverflowTarget
from models.sources import SMOLLM2, locate
from tests.overflow.overflow_testing import TINY, AgentFactory, chat, set_targets, sse

# the first run on a machine builds llama.cpp: 5-8 min on 2 quiet cores, 24 min seen beside
# other work
pytestmark = pytest.mark.timeout(1800)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def peer_state(server: LlamaCppServer) -> str:
    """How the peer is, for failure messages: a build for instructions this machine does not
    run dies on its first request (exit status -4, SIGILL)."""
    await asyncio.sleep(0.5)  # a peer that just died is reaped
    return (
        f"llama.cpp peer exit status {server.returncode}, built as {describe(server.build)}; "
        "its last log lines:\n" + "".join(list(server.log)[-30:])
    )


@pytest.fixture
async def llamacpp_server() -> AsyncIterator[LlamaCppServer]:
    async with LlamaCppServer(locate(SMOLLM2).path, _free_port(), threads=1) as server:
        yield server


async def test_saturation_and_a_missing_model_overflow_to_the_llamacpp_pool(
    make_agent: AgentFactory, llamacpp_server: LlamaCppServer
) -> None:
    llamacpp = llamacpp_server.url + "/v1"
    agent = await make_agent(
        engine={"max_running": 1, "max_queue": 1}, overflow={"allow_cloud": True}
    )
    set_targets(
        agent,
        OverflowTarget(
            "llamacpp",
            OverflowKind.GPU_POOL,
            llamacpp,
            api=OverflowApi.OPENAI,
            endpoints=(OverflowEndpoint(llamacpp, 1.0, 4),),
            prompt_price_per_1k=0.1,
            completion_price_per_1k=0.2,
        ),
    )
    body = chat("Name a colour.", model="smollm2-135m-instruct", max_tokens=8, temperature=0)
    r = await agent.post("/v1/chat/completions", json=body)
    answer = await r.json()
    assert r.status == 200, (answer, await peer_state(llamacpp_server))
    assert r.headers["X-Edgefleet-Served-By"] == "llamacpp"
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0
    r = await agent.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "llamacpp"
    text, events, done = await sse(r)
    assert text.strip() and done and not any("error" in e for e in events)
    # saturation: the tiny model's queue holds one; the rest go to llama.cpp
    tiny = chat("Count.", model=TINY, max_tokens=120)
    replies = await asyncio.gather(
        *(agent.post("/v1/chat/completions", json=tiny) for _ in range(5))
    )
    assert all(r.status == 200 for r in replies)
    served = [r.headers["X-Edgefleet-Served-By"] for r in replies]
    assert "llamacpp" in served and any(by != "llamacpp" for by in served), served
    for r in replies:
        if r.headers["X-Edgefleet-Served-By"] == "llamacpp":
            forwarded = await r.json()
            assert forwarded["model"] == TINY and forwarded["choices"][0]["message"]["content"]
    assert llamacpp_server.returncode is None, await peer_state(llamacpp_server)
