"""Each API request leaves one record with its usage, streamed or not, and no text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from agent.api.app import REQUEST_LOG
from tests.agent.conftest import ClientFactory

TINY = "tiny-llama"
CHAT = "/v1/chat/completions"
SECRET = "okapi-marmalade-4411"


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": TINY,
        "messages": [{"role": "user", "content": f"Say hi {SECRET}"}],
        "max_tokens": 5,
        "temperature": 0,
        **extra,
    }


async def test_streamed_cached_and_refused_requests_each_leave_a_record(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = await make_client()
    log = client.app[REQUEST_LOG].open(tmp_path, "edge-1")
    plain = await (await client.post(CHAT, json=chat())).json()  # a miss, then cached
    again = await client.post(CHAT, json=chat())
    assert again.headers["X-Edgefleet-Cache"] == "hit"
    # streamed, no usage asked for, no cache: the record still counts the tokens
    streamed = await client.post(CHAT, json=chat(stream=True, cache=False))
    assert streamed.status == 200 and b"usage" not in await streamed.read()
    refused = await client.post(CHAT, json={"model": TINY})
    assert refused.status == 400

    batch = log.batch(0)
    assert batch is not None
    records = msgpack.unpackb(batch[1])
    assert [r["status"] for r in records] == [200, 200, 200, 400]
    usage = plain["usage"]
    for r in records[:3]:
        assert (r["prompt_tokens"], r["completion_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert r["model"] == TINY and r["version"] and r["served_by"] == "edge-1"
        assert r["endpoint"] == CHAT and r["key_id"] is None
        assert 0 <= r["ttft_ms"] <= r["latency_ms"]
    assert records[3]["completion_tokens"] == 0 and records[3]["ttft_ms"] is None
    assert SECRET.encode() not in (tmp_path / "requests.spool").read_bytes()
    client.app[REQUEST_LOG].close()
