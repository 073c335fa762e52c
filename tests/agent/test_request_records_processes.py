"""Per-request records across real processes: none lost, none twice, no text anywhere.

A coordinator and a tiny-model agent with an API key. Requests (some streamed) are
served while the coordinator is away, and the agent is SIGKILLed with their records
still in its spool; it comes back on the same state directory to a restarted
coordinator, serves more requests and is SIGKILLed again while those records are being
sent; then its acknowledgement file is rolled back (a SIGKILL after the coordinator
stored a batch but before the agent saved the ack) and it comes back once more. The
coordinator must end up with exactly one record per request, each with the key id,
model@version, served-by and the token counts the client was told, a latency and a time
to first token, and the distinctive prompt must appear in no file on either side.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.fleet import AgentProcess, CoordinatorProcess
from devtools.process import wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MODEL = "tiny-llama"
AGENT_ID = "edge-records"
SECRET_PROMPT = "zebra-quartz-7731 confidential prompt"


async def post(url: str, path: str, body: Any, secret: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, json=body, headers={"Authorization": f"Bearer {secret}"}) as r,
    ):
        return r.status, await r.json()


async def complete(url: str, secret: str, i: int, *, stream: bool) -> tuple[int, int]:
    """One completion; returns its usage (prompt_tokens, completion_tokens)."""
    body: dict[str, Any] = {
        "model": MODEL,
        # prompts of different lengths, so the records' token counts tell them apart
        "prompt": SECRET_PROMPT + " word" * i,
        "max_tokens": 1 + i % 4,
        "temperature": 0.7,  # no response cache: every request reaches the engine
    }
    if not stream:
        status, done = await post(url, "/v1/completions", body, secret)
        assert status == 200, done
        return done["usage"]["prompt_tokens"], done["usage"]["completion_tokens"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, int] | None = None
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
        ) as response,
    ):
        assert response.status == 200
        async for line in response.content:
            text = line.decode().strip()
            if text.startswith("data: {"):
                chunk = json.loads(text[6:])
                usage = chunk.get("usage") or usage
    assert usage is not None
    return usage["prompt_tokens"], usage["completion_tokens"]


async def serve_requests(agent: AgentProcess, secret: str, indices: range) -> list[tuple[int, int]]:
    return [await complete(agent.url, secret, i, stream=i % 2 == 0) for i in indices]


async def records(coordinator: CoordinatorProcess) -> list[dict[str, Any]]:
    body = await coordinator.get_json(f"/v1/admin/request-records?agent_id={AGENT_ID}&limit=10000")
    return list(body["data"])


async def test_records_survive_sigkills_once_each_with_usage_and_no_text(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    state_dir = tmp_path / "agent-state"
    data_dir = tmp_path / "coordinator-data"
    spool_dir = state_dir / "request-log" / AGENT_ID

    def agent(target: str) -> AgentProcess:
        return AgentProcess(
            models_dir=str(tiny_artifacts), serve=[MODEL], coordinator=target,
            agent_id=AGENT_ID, insecure_no_auth=False,
            extra_args=["--set", f"coordinator.state_dir={state_dir}"],
        )  # fmt: skip

    usages: list[tuple[int, int]] = []
    calls: list[int] = []
    # 1. The key reaches the agent; then the coordinator goes away and the agent serves
    #    requests whose records can only wait in its spool; SIGKILL.
    coordinator = CoordinatorProcess(report_interval_ms=300, data_dir=data_dir)
    await coordinator.start()
    first = agent(coordinator.grpc_target)
    try:
        status, key = await post(
            coordinator.http_url, "/v1/admin/keys", {"name": "records"}, coordinator.admin_token
        )
        assert status == 201, key
        secret = key["secret"]
        await first.start()

        async def key_works() -> bool:
            calls.append(1)  # every try, refused or not, is a request with its record
            body = {"model": MODEL, "prompt": "warm", "max_tokens": 1}
            return (await post(first.url, "/v1/completions", body, secret))[0] == 200

        await wait_until(key_works, timeout_s=30, message="the key at the agent")
    finally:
        await coordinator.terminate()
    try:
        usages += await serve_requests(first, secret, range(0, 6))
    finally:
        assert await first.kill() != 0
    spooled = (spool_dir / "requests.spool").read_bytes()
    assert SECRET_PROMPT.encode() not in spooled

    # 2. A restarted coordinator and agent: the spooled records go; more requests, and a
    #    SIGKILL while their records are on their way.
    coordinator = CoordinatorProcess(report_interval_ms=300, data_dir=data_dir)
    await coordinator.start()
    try:
        second = agent(coordinator.grpc_target)
        await second.start()
        try:
            usages += await serve_requests(second, secret, range(6, 12))
        finally:
            assert await second.kill() != 0

        acked_at_kill = (spool_dir / "requests.acked").read_text().strip()
        print(f"second SIGKILL: {acked_at_kill} of {len(calls) + len(usages)} records acked")
        # 3. The ack lost with the process: everything is sent again, stored once.
        (spool_dir / "requests.acked").write_text("0")
        third = agent(coordinator.grpc_target)
        await third.start()
        try:

            async def acked() -> bool:
                text = (spool_dir / "requests.acked").read_text().strip()
                return int(text or 0) >= len(calls) + len(usages)

            await wait_until(acked, timeout_s=30, message="every record acknowledged again")
            await asyncio.sleep(1.0)  # three report intervals: nothing more arrives
            stored = await records(coordinator)
            async with (
                aiohttp.ClientSession(headers=coordinator.admin_headers) as http,
                http.get(coordinator.http_url + "/metrics") as response,
            ):
                metrics = await response.text()
        finally:
            await third.terminate()
    finally:
        await coordinator.terminate()

    # The key check's tries come first; then one record per request, in order.
    assert len(stored) == len(calls) + len(usages)
    assert [r["seq"] for r in stored] == list(range(1, len(stored) + 1)), "no loss, no twice"
    assert all(r["dropped"] == 0 for r in stored)
    # The restarted coordinator counts what it stored (the re-sent duplicates are not
    # stored twice, so not counted twice), and no loss.
    counted = re.search(r'request_records_total\{outcome="stored"\} (\d+)', metrics)
    assert counted is not None and 0 < int(counted.group(1)) <= len(stored)
    assert 'outcome="lost_at_agent"' not in metrics and 'outcome="pruned"' not in metrics
    assert stored[len(calls) - 1]["status"] == 200  # the try that found the key
    tail = stored[len(calls) :]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in tail] == usages
    for r in tail:
        assert r["status"] == 200 and r["endpoint"] == "/v1/completions"
        assert r["key_id"] == key["key_id"]
        assert r["model"] == MODEL and r["version"]
        assert r["served_by"] == AGENT_ID
        assert r["latency_ms"] > 0
        assert r["ttft_ms"] is not None and 0 <= r["ttft_ms"] <= r["latency_ms"]
    # Never any text, on either side (the spool, the coordinator's database and its WAL).
    for path in [*state_dir.rglob("*"), *data_dir.rglob("*")]:
        if path.is_file():
            assert SECRET_PROMPT.encode() not in path.read_bytes(), path
