"""Helpers for the overflow tests (a module of its own: ``conftest`` names collide
across test directories)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient

from agent.overflow.hook import OVERFLOW
from agent.overflow.service import OverflowService
from edgefleet.contract import OverflowTarget
from tests.overflow.overflow_fakes import FakeAnthropic, FakeOpenAI

BIG = "big-model"  # not loaded on the agents: every request for it is forwarded
TINY = "tiny-llama"
AgentFactory = Callable[..., Awaitable[TestClient]]


def service_of(client: TestClient) -> OverflowService:
    return client.app[OVERFLOW]  # type: ignore[index]


def set_targets(client: TestClient, *targets: OverflowTarget) -> None:
    service_of(client).targets.set(targets)


def url_of(fake: FakeOpenAI | FakeAnthropic) -> str:
    assert fake.server is not None
    return str(fake.server.make_url("/v1"))


def chat(content: str, *, model: str = BIG, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": 32,
        **extra,
    }


async def sse(response: Any) -> tuple[str, list[dict[str, Any]], bool]:
    """(joined content, every data object, ended with [DONE])."""
    raw = (await response.read()).decode()
    events, done = [], False
    for block in raw.split("\n\n"):
        if not block.startswith("data: "):
            continue
        data = block[6:]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    text = "".join(
        (c["choices"][0].get("delta") or {}).get("content") or ""
        for c in events
        if c.get("choices")
    )
    return text, events, done
