"""The HTTP API while the engine is busy: admission, priorities, health, cache, disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient

ClientFactory = Callable[..., Awaitable[TestClient]]

TINY = "tiny-llama"
CHAT = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": TINY,
        "messages": [{"role": "user", "content": "Tell me everything"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    body.update(extra)
    return body


async def metric(client: TestClient, name: str) -> float:
    text = await (await client.get("/metrics")).text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await predicate():
            await asyncio.sleep(0.005)


async def health(client: TestClient) -> dict[str, Any]:
    return dict(await (await client.get("/healthz")).json())


async def test_queue_full_gives_429_with_retry_after(make_client: ClientFactory) -> None:
    client = await make_client(engine={"max_running": 1, "max_queue": 1})
    long = chat(max_tokens=200, cache=False)
    first = asyncio.create_task(client.post(CHAT, json=long))
    await until(lambda: _running(client, 1))
    second = asyncio.create_task(client.post(CHAT, json=long))
    await until(lambda: _waiting(client, 1))
    rejected = await client.post(CHAT, json=chat())
    assert rejected.status == 429
    assert int(rejected.headers["Retry-After"]) >= 1
    error = (await rejected.json())["error"]
    assert error["type"] == "rate_limit_error" and "queue" in error["message"]
    assert await metric(client, 'edgefleet_agent_rejections_total{reason="queue_full"}') == 1
    assert (await first).status == 200 and (await second).status == 200


async def _running(client: TestClient, n: int) -> bool:
    return (await health(client))["running"] == n


async def _waiting(client: TestClient, n: int) -> bool:
    return (await health(client))["waiting"] == n


async def test_streamed_chat_with_the_queue_full_gets_429(make_client: ClientFactory) -> None:
    client = await make_client(engine={"max_running": 1, "max_queue": 1})
    long = chat(max_tokens=200, cache=False)
    first = asyncio.create_task(client.post(CHAT, json=long))
    await until(lambda: _running(client, 1))
    second = asyncio.create_task(client.post(CHAT, json=long))
    await until(lambda: _waiting(client, 1))
    rejected = await client.post(CHAT, json=chat(stream=True, cache=False))
    assert rejected.status == 429  # a real status, not 200 and an error event
    assert int(rejected.headers["Retry-After"]) >= 1
    assert (await rejected.json())["error"]["type"] == "rate_limit_error"
    assert (await first).status == 200 and (await second).status == 200


async def test_health_answers_while_the_engine_is_saturated(make_client: ClientFactory) -> None:
    """/healthz answers, and reports the saturation, while every slot is taken and requests
    wait (its latency then: ``python -m benchmarks.responsiveness``)."""
    client = await make_client(engine={"max_running": 4})
    busy = [
        asyncio.create_task(client.post(CHAT, json=chat(max_tokens=150, cache=False)))
        for _ in range(8)
    ]
    await until(lambda: _waiting(client, 4))
    answers = [await health(client) for _ in range(20)]
    assert answers[0]["running"] == 4 and answers[0]["waiting"] >= 1
    assert not all(task.done() for task in busy)  # answered while they were served
    for response in await asyncio.gather(*busy):
        assert response.status == 200


async def test_priority_header_and_body_are_honoured(make_client: ClientFactory) -> None:
    client = await make_client(engine={"max_running": 1})
    done: list[str] = []

    async def send(tag: str, **kw: Any) -> None:
        resp = await client.post(CHAT, json=chat(cache=False, **kw.get("body", {})),
                                 headers=kw.get("headers", {}))  # fmt: skip
        assert resp.status == 200
        done.append(tag)

    blocker = asyncio.create_task(client.post(CHAT, json=chat(max_tokens=100, cache=False)))
    await until(lambda: _running(client, 1))
    low = asyncio.create_task(send("low", headers={"X-Priority": "low"}))
    await until(lambda: _waiting(client, 1))
    high = asyncio.create_task(send("high", body={"priority": "high"}))
    await until(lambda: _waiting(client, 2))
    await asyncio.gather(blocker, low, high)
    assert done == ["high", "low"]
    bad = await client.post(CHAT, json=chat(), headers={"X-Priority": "urgent"})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "X-Priority"


async def test_request_timeout_header(make_client: ClientFactory) -> None:
    client = await make_client(engine={"max_context_tokens": 512})
    resp = await client.post(
        CHAT, json=chat(max_tokens=450, cache=False), headers={"X-Request-Timeout": "0.01"}
    )
    assert resp.status == 504
    assert (await resp.json())["error"]["code"] == "request_timeout"
    bad = await client.post(CHAT, json=chat(), headers={"X-Request-Timeout": "soon"})
    assert bad.status == 400


async def test_cache_returns_identical_result_without_the_engine(client: TestClient) -> None:
    body = chat(max_tokens=12)
    first = await client.post(CHAT, json=body)
    assert first.headers["X-Edgefleet-Cache"] == "miss"
    generated = await metric(client, "edgefleet_agent_generation_tokens_total")
    second = await client.post(CHAT, json=body)
    assert second.headers["X-Edgefleet-Cache"] == "hit"
    a, b = await first.json(), await second.json()
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    assert await metric(client, "edgefleet_agent_generation_tokens_total") == generated
    assert await metric(client, "edgefleet_agent_cache_hits_total") == 1
    streamed = await client.post(CHAT, json={**body, "stream": True})
    assert streamed.headers["X-Edgefleet-Cache"] == "hit"
    text = (await streamed.read()).decode()
    assert a["choices"][0]["message"]["content"].split()[0] in text
    sampled = await client.post(CHAT, json=chat(temperature=0.9))
    assert sampled.headers["X-Edgefleet-Cache"] == "bypass"  # not deterministic: not cached


async def test_client_disconnect_cancels_its_sequence(make_client: ClientFactory) -> None:
    client = await make_client(engine={"max_context_tokens": 512})
    resp = await client.post(CHAT, json=chat(max_tokens=450, stream=True, cache=False))
    assert resp.status == 200
    await resp.content.readline()
    assert (await health(client))["running"] == 1
    resp.close()  # the client goes away mid-stream
    await until(lambda: _running(client, 0), timeout_s=2.0)
    assert (await health(client))["kv_cache_used_tokens"] == 0
    # counted as "client closed request", not as a server error
    text = await (await client.get("/metrics")).text()
    assert 'endpoint="/v1/chat/completions",status="499"} 1.0' in text
    assert 'status="500"' not in text


async def test_metrics_cover_the_engine(client: TestClient) -> None:
    resp = await client.post(CHAT, json=chat(cache=False))
    assert resp.status == 200
    usage = (await resp.json())["usage"]
    text = await (await client.get("/metrics")).text()
    for name in [
        "edgefleet_agent_requests_total",
        "edgefleet_agent_time_to_first_token_seconds_bucket",
        "edgefleet_agent_time_per_output_token_seconds_bucket",
        "edgefleet_agent_request_latency_seconds_bucket",
        "edgefleet_agent_queue_wait_seconds_bucket",
        "edgefleet_agent_running_sequences",
        "edgefleet_agent_waiting_sequences",
        "edgefleet_agent_kv_cache_used_tokens",
        "edgefleet_agent_kv_cache_used_ratio",
        "edgefleet_agent_batch_size_bucket",
        "edgefleet_agent_step_seconds_bucket",
        "edgefleet_agent_prompt_tokens_total",
        "edgefleet_agent_generation_tokens_total",
        "edgefleet_agent_cache_hits_total",
        "edgefleet_agent_cache_misses_total",
        "edgefleet_agent_rejections",
    ]:
        assert name in text, name
    # the names alone are there without traffic (HELP lines): the request must be counted
    samples = {
        'edgefleet_agent_requests_total{endpoint="/v1/chat/completions",status="200"}': 1,
        'edgefleet_agent_request_latency_seconds_count{endpoint="/v1/chat/completions"}': 1,
        f'edgefleet_agent_time_to_first_token_seconds_count{{model="{TINY}"}}': 1,
        f'edgefleet_agent_time_per_output_token_seconds_count{{model="{TINY}"}}': (
            usage["completion_tokens"] - 1
        ),
        f'edgefleet_agent_prompt_tokens_total{{model="{TINY}"}}': usage["prompt_tokens"],
        f'edgefleet_agent_generation_tokens_total{{model="{TINY}"}}': usage["completion_tokens"],
        "edgefleet_agent_queue_wait_seconds_count": 1,
    }
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 1
    for sample, value in samples.items():
        assert await metric(client, sample) == value, sample
    assert await metric(client, "edgefleet_agent_batch_size_count") >= 1
    assert await metric(client, 'edgefleet_agent_step_seconds_count{part="total"}') >= 1
    # the prompt's whole 16-token blocks stay in the prefix cache (tiny-llama: 512 bytes a
    # token); the slots' buffers are freed once the engine is idle
    blocks = usage["prompt_tokens"] // 16
    prefix = 'edgefleet_agent_kv_cache_bytes{part="prefix"}'
    assert blocks >= 1 and await metric(client, prefix) >= blocks * 16 * 512
    await until(lambda: _slots_freed(client), timeout_s=5.0)


async def _slots_freed(client: TestClient) -> bool:
    return await metric(client, 'edgefleet_agent_kv_cache_bytes{part="slots"}') == 0
