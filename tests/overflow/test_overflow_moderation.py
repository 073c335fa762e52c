"""Issue 28: an overflow target's answer goes through the same output check as the
engine's (a pool's fake that speaks OpenAI's wire format; the classifier's scores
injected): a whole answer is cut at its first blocked window with finish_reason
content_filter, a stream ends with content_filter before the blocked window, and a blocked
input never leaves the agent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agent.api.app import MODERATION_GATE
from agent.auth.keys import KeyTable, secret_digest
from agent.moderation import Verdict, verdict
from edgefleet.contract import ApiKey, OverflowApi, OverflowKind, OverflowTarget
from edgefleet.key_policy import key_policy_from_json
from models.moderation_spec import CATEGORIES
from tests.overflow.overflow_fakes import FakeOpenAI
from tests.overflow.overflow_testing import AgentFactory, chat, set_targets, sse, url_of

POOL_KEY_ENV = "EDGEFLEET_TEST_POOL_KEY"
SECRET = "ef-strict-cccccccccccccccc"
POLICY = {"moderation": {"input": {"harassment": "off"}, "output": {"harassment": "block"}}}


class Injected:
    name, version = "stub-heads", "stub-1"

    async def classify(self, texts: Sequence[str]) -> list[Verdict]:
        scores = [{"harassment": 0.9 if "HARASS" in t else 0.0} for t in texts]
        return [
            verdict(s, dict.fromkeys(CATEGORIES, 0.7), frozenset({"harassment"}), t, 0.3)
            for s, t in zip(scores, texts, strict=True)
        ]


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_KEY_ENV, "pool-secret-0001")


async def agent_with_pool(make_agent: AgentFactory, fake: FakeOpenAI) -> Any:
    keys = KeyTable(enabled=True)
    policy = key_policy_from_json(POLICY)
    keys.set_source("test", [ApiKey("strict", secret_digest(SECRET), allow_cloud=True,
                                    policy=policy)])  # fmt: skip
    agent = await make_agent(keys=keys, overflow={"allow_cloud": True})
    pool = OverflowTarget(
        "pool-a", OverflowKind.GPU_POOL, url_of(fake), api=OverflowApi.OPENAI,
        credential_env=POOL_KEY_ENV,
    )  # fmt: skip
    set_targets(agent, pool)
    agent.app[MODERATION_GATE].classifier = Injected()  # type: ignore[assignment]
    return agent


async def test_an_overflow_answer_is_checked_whole_and_streamed(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    agent = await agent_with_pool(make_agent, openai_fake)
    auth = {"Authorization": f"Bearer {SECRET}"}
    body = chat("Hello there, how are you. You are HARASS and a fool.")
    whole = await agent.post("/v1/chat/completions", json=body, headers=auth)
    assert whole.status == 200 and whole.headers["X-Edgefleet-Served-By"] == "pool-a"
    (choice,) = (await whole.json())["choices"]
    assert choice["finish_reason"] == "content_filter"
    assert choice["message"]["content"] == "You said: Hello there, how are you. "

    streamed = await agent.post("/v1/chat/completions", json={**body, "stream": True},
                                headers=auth)  # fmt: skip
    text, events, done = await sse(streamed)
    assert done and "HARASS" not in text and text.startswith("You said: Hello there")
    finishes = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
    assert finishes[-1] == "content_filter"

    calm = await agent.post("/v1/chat/completions", json=chat("Is the shop open."), headers=auth)
    (choice,) = (await calm.json())["choices"]
    assert choice["message"]["content"] == "You said: Is the shop open."
    assert choice["finish_reason"] != "content_filter"
    assert len(openai_fake.received) == 3
