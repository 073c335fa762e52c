"""Overflow through the agent's API: real agents on loopback (tiny model), provider fakes
that record what they received."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient

from agent.api.app import REQUEST_LOG
from agent.auth.keys import KeyTable, secret_digest
from edgefleet.contract import ApiKey, OverflowApi, OverflowKind, OverflowTarget
from tests.overflow.overflow_fakes import FakeAnthropic, FakeOpenAI
from tests.overflow.overflow_testing import (
    BIG,
    TINY,
    AgentFactory,
    chat,
    service_of,
    set_targets,
    sse,
    url_of,
)

POOL_KEY_ENV = "EDGEFLEET_TEST_POOL_KEY"
ANT_KEY_ENV = "EDGEFLEET_TEST_ANTHROPIC_KEY"
CLOUD = {"overflow": {"allow_cloud": True}}


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_KEY_ENV, "pool-secret-0001")
    monkeypatch.setenv(ANT_KEY_ENV, "ant-secret-0002")


def pool(fake: FakeOpenAI, name: str = "pool-a", **extra: Any) -> OverflowTarget:
    return OverflowTarget(
        name,
        OverflowKind.GPU_POOL,
        url_of(fake),
        api=OverflowApi.OPENAI,
        credential_env=POOL_KEY_ENV,
        prompt_price_per_1k=0.5,
        completion_price_per_1k=2.0,
        **extra,
    )


def claude(fake: FakeAnthropic, **extra: Any) -> OverflowTarget:
    return OverflowTarget(
        "claude",
        OverflowKind.HOSTED_PROVIDER,
        url_of(fake),
        api=OverflowApi.ANTHROPIC,
        credential_env=ANT_KEY_ENV,
        model_names={BIG: "claude-haiku"},
        **extra,
    )


async def test_saturation_overflows_to_the_pool_and_the_answer_comes_back(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    agent = await make_agent(engine={"max_running": 1, "max_queue": 1}, **CLOUD)
    set_targets(agent, pool(openai_fake))
    body = chat("count to many", model=TINY, max_tokens=200, temperature=1.0, seed=None)

    async def one(i: int) -> tuple[int, str, dict[str, Any]]:
        r = await agent.post("/v1/chat/completions", json={**body, "user": str(i)})
        return r.status, r.headers.get("X-Edgefleet-Served-By", ""), await r.json()

    results = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(status == 200 for status, _, _ in results), results
    forwarded = [(by, answer) for _, by, answer in results if by == "pool-a"]
    assert forwarded, "the queue never filled: no request overflowed"
    assert len(forwarded) == len(openai_fake.received)
    for _, answer in forwarded:
        assert answer["choices"][0]["message"]["content"] == "You said: count to many"
        assert answer["model"] == TINY
    local = [by for _, by, _ in results if by != "pool-a"]
    assert local and all(by for by in local)  # served here, and saying so
    metrics = await (await agent.get("/metrics")).text()
    assert 'edgefleet_agent_served_requests_total{kind="gpu_pool",served_by="pool-a"}' in metrics


async def test_a_peer_at_the_site_is_preferred_over_the_cloud(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    peer = await make_agent()
    agent = await make_agent(**CLOUD)
    peer_target = OverflowTarget(
        "peer-b",
        OverflowKind.PEER,
        str(peer.make_url("/v1")),
        api=OverflowApi.EDGEFLEET,
        model_names={BIG: TINY},
        site="lab",
        free_slots=3,
    )
    set_targets(agent, pool(openai_fake), peer_target)  # the pool listed first
    r = await agent.post("/v1/chat/completions", json=chat("hi", stream=True))
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "peer-b"
    text, events, done = await sse(r)
    assert done and text and events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(e["model"] == BIG for e in events)
    assert openai_fake.received == []
    # a peer with no room, or at another site, is passed over
    set_targets(
        agent, pool(openai_fake), OverflowTarget(**{**_fields(peer_target), "free_slots": 0})
    )
    r = await agent.post("/v1/chat/completions", json=chat("hi"))
    assert r.headers["X-Edgefleet-Served-By"] == "pool-a" and len(openai_fake.received) == 1
    set_targets(agent, pool(openai_fake), OverflowTarget(**{**_fields(peer_target), "site": "far"}))
    r = await agent.post("/v1/chat/completions", json=chat("hi"))
    assert r.headers["X-Edgefleet-Served-By"] == "pool-a" and len(openai_fake.received) == 2


def _fields(target: OverflowTarget) -> dict[str, Any]:
    return {name: getattr(target, name) for name in target.__dataclass_fields__}


async def test_allow_cloud_false_never_leaves(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    keys = KeyTable(enabled=True)
    secrets = {"cloud": "ef-cloud-aaaaaaaaaaaaaaaa", "local": "ef-local-bbbbbbbbbbbbbbbb"}
    keys.set_source(
        "test",
        [
            ApiKey("cloud", secret_digest(secrets["cloud"]), allow_cloud=True),
            ApiKey("local", secret_digest(secrets["local"]), allow_cloud=False),
        ],
    )
    agent = await make_agent(keys=keys, **CLOUD)
    set_targets(agent, pool(openai_fake))

    def auth(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secrets[name]}"}

    # the key says no
    r = await agent.post("/v1/chat/completions", json=chat("x"), headers=auth("local"))
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    # the request says no (body extension, header)
    r = await agent.post(
        "/v1/chat/completions",
        json=chat("x", edgefleet={"allow_cloud": False}),
        headers=auth("cloud"),
    )
    assert r.status == 404
    r = await agent.post(
        "/v1/chat/completions",
        json=chat("x", stream=True),
        headers={**auth("cloud"), "X-Edgefleet-Allow-Cloud": "false"},
    )
    assert r.status == 404
    assert openai_fake.received == []
    # key, request and policy all allow it: it leaves, and the key's usage counts it
    keys.take_usage()
    r = await agent.post("/v1/chat/completions", json=chat("x"), headers=auth("cloud"))
    assert r.status == 200 and len(openai_fake.received) == 1
    usage = {u.key_id: u for u in keys.take_usage()}
    assert usage["cloud"].completion_tokens == (await r.json())["usage"]["completion_tokens"]
    # the policy says no
    policy_off = await make_agent(keys=keys)
    set_targets(policy_off, pool(openai_fake))
    r = await policy_off.post("/v1/chat/completions", json=chat("x"), headers=auth("cloud"))
    assert r.status == 404 and len(openai_fake.received) == 1
    # a malformed allow_cloud is the client's error
    r = await agent.post(
        "/v1/chat/completions",
        json=chat("x", edgefleet={"allow_cloud": "yes"}),
        headers=auth("cloud"),
    )
    assert r.status == 400 and (await r.json())["error"]["param"] == "edgefleet.allow_cloud"


async def test_saturated_request_that_may_not_leave_gets_429(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    agent = await make_agent(engine={"max_running": 1, "max_queue": 1})  # policy: no cloud
    set_targets(agent, pool(openai_fake))
    body = chat("count", model=TINY, max_tokens=200)
    statuses = await asyncio.gather(
        *(agent.post("/v1/chat/completions", json=body) for _ in range(8))
    )
    codes = [r.status for r in statuses]
    assert 429 in codes and set(codes) <= {200, 429}
    assert openai_fake.received == []


async def test_the_circuit_breaker_opens_and_closes(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, openai_fake2: FakeOpenAI
) -> None:
    agent = await make_agent(
        overflow={
            "allow_cloud": True,
            "max_retries": 0,
            "breaker_failures": 3,
            "breaker_cooldown_s": 0.5,
        }
    )
    set_targets(agent, pool(openai_fake, "flaky"), pool(openai_fake2, "steady"))
    openai_fake.plan = [("status", 503)] * 3
    for _ in range(3):  # each fails over to the steady pool
        r = await agent.post("/v1/chat/completions", json=chat("x"))
        assert r.headers["X-Edgefleet-Served-By"] == "steady"
    assert len(openai_fake.received) == 3
    flaky = service_of(agent).targets.get("flaky")
    assert flaky is not None and flaky.breaker.state == "open"
    r = await agent.post("/v1/chat/completions", json=chat("x"))
    assert r.headers["X-Edgefleet-Served-By"] == "steady"
    assert len(openai_fake.received) == 3  # open: not even tried
    await asyncio.sleep(0.6)  # cooldown: half-open, one trial, which succeeds
    r = await agent.post("/v1/chat/completions", json=chat("x"))
    assert r.headers["X-Edgefleet-Served-By"] == "flaky" and flaky.breaker.state == "closed"


async def test_a_stream_fails_over_before_its_first_token(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, openai_fake2: FakeOpenAI
) -> None:
    agent = await make_agent(overflow={"allow_cloud": True, "max_retries": 0})
    set_targets(agent, pool(openai_fake, "first"), pool(openai_fake2, "second"))
    openai_fake.plan = [("break", 0)]  # role chunk out, then the connection drops
    r = await agent.post("/v1/chat/completions", json=chat("hello there", stream=True))
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "second"
    text, events, done = await sse(r)
    assert text == "You said: hello there" and done
    assert not any("error" in e for e in events)
    roles = [e for e in events if e.get("choices") and e["choices"][0]["delta"].get("role")]
    assert len(roles) == 1  # the first target's role chunk never reached the client
    openai_fake.plan = [("status", 500)]
    r = await agent.post("/v1/chat/completions", json=chat("again", stream=True))
    assert r.headers["X-Edgefleet-Served-By"] == "second"
    assert (await sse(r))[0] == "You said: again"


async def test_a_mid_stream_failure_continues_on_a_target_that_can(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, anthropic_fake: FakeAnthropic
) -> None:
    agent = await make_agent(overflow={"allow_cloud": True, "max_retries": 0})
    set_targets(agent, pool(openai_fake), claude(anthropic_fake, supports_continuation=True))
    openai_fake.plan = [("break", 3)]  # "You", " sa", "id:" delivered, then gone
    r = await agent.post("/v1/chat/completions", json=chat("hello there", stream=True))
    text, events, done = await sse(r)
    assert text == "You said: hello there" and done
    assert not any("error" in e for e in events)
    sent = anthropic_fake.received[0]["messages"]
    assert sent[-1] == {"role": "assistant", "content": "You said:"}  # assistant prefill
    # broken right after white space ("You s", "aid: "): Anthropic gets the prefill without
    # it (it refuses trailing white space) and the client no doubled space
    openai_fake.piece = 5
    openai_fake.plan = [("break", 2)]
    r = await agent.post("/v1/chat/completions", json=chat("hello there", stream=True))
    text, events, done = await sse(r)
    assert text == "You said: hello there" and done
    assert anthropic_fake.received[1]["messages"][-1]["content"] == "You said:"


async def test_a_placeholder_cut_by_a_broken_stream_is_restored_after_failover(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, anthropic_fake: FakeAnthropic
) -> None:
    agent = await make_agent(overflow={"allow_cloud": True, "max_retries": 0})
    set_targets(agent, pool(openai_fake), claude(anthropic_fake, supports_continuation=True))
    # "You said: <EMAIL_1>": pieces of 3 break inside the placeholder ("You", " sa", "id:",
    # " <E", "MAI" then gone); the provider finishes it ("L_1>")
    openai_fake.plan = [("break", 5)]
    r = await agent.post("/v1/chat/completions", json=chat("ann@example.org", stream=True))
    text, _, done = await sse(r)
    assert text == "You said: ann@example.org" and done
    assert anthropic_fake.received[0]["messages"][-1]["content"] == "You said: <EMAI"
    assert "ann@example.org" not in json.dumps(anthropic_fake.received + openai_fake.received)


async def test_a_mid_stream_failure_without_continuation_ends_with_the_error_event(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, anthropic_fake: FakeAnthropic
) -> None:
    agent = await make_agent(overflow={"allow_cloud": True, "max_retries": 0})
    set_targets(agent, pool(openai_fake), claude(anthropic_fake))  # claude cannot continue
    openai_fake.plan = [("break", 3)]
    r = await agent.post("/v1/chat/completions", json=chat("hello there", stream=True))
    assert r.status == 200
    text, events, done = await sse(r)
    assert text == "You said:" and done  # never a silent clean end
    error = events[-1]["error"]
    assert error["code"] == "overflow_failed" and error["type"] == "server_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert anthropic_fake.received == []
    # an upstream error event mid-stream is a failure too
    openai_fake.plan = [("error_event", 2)]
    r = await agent.post("/v1/chat/completions", json=chat("hello there", stream=True))
    _, events, done = await sse(r)
    assert done and events[-1]["error"]["code"] == "overflow_failed"


async def test_upstream_gets_no_personal_value_and_the_client_gets_its_own_back(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    agent = await make_agent(**CLOUD)
    set_targets(agent, pool(openai_fake))
    values = ("jane.doe@example.com", "+44 20 7946 0958", "10.1.2.3")
    content = f"Mail {values[0]} or call {values[1]}; my box is {values[2]}."
    r = await agent.post("/v1/chat/completions", json=chat(content))
    assert (await r.json())["choices"][0]["message"]["content"] == f"You said: {content}"
    r = await agent.post("/v1/chat/completions", json=chat(content, stream=True))
    text, _, done = await sse(r)
    assert text == f"You said: {content}" and done
    sent = json.dumps(openai_fake.received)
    for value in values:
        assert value not in sent
    assert "<EMAIL_1>" in sent
    # split placeholders: the fake cut its answer into 3-character pieces, so "<EMAIL_1>"
    # reached the agent in parts; the client never sees a placeholder or a part of one
    assert "<" not in text and "EMAIL" not in text


async def test_credentials_never_in_logs_errors_or_metrics(
    make_agent: AgentFactory,
    openai_fake: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-WRONG-do-not-print-4242"
    monkeypatch.setenv(POOL_KEY_ENV, wrong)  # the fake answers 401 quoting the key back
    agent = await make_agent(**CLOUD)
    secret_file = tmp_path / "missing-secret"
    set_targets(
        agent,
        pool(openai_fake, "by-env"),
        OverflowTarget(
            "by-file",
            OverflowKind.GPU_POOL,
            url_of(openai_fake),
            credential_file=str(secret_file),
        ),
    )
    r = await agent.post("/v1/chat/completions", json=chat("x"))
    body = await r.text()
    assert r.status == 502 and "by-env" in body and "by-file" in body
    assert len(openai_fake.received) == 0 and openai_fake.headers  # refused at the door
    r = await agent.post("/v1/chat/completions", json=chat("x", stream=True))
    assert r.status == 502
    secret_file.write_text("file-secret-9999\n")
    openai_fake.api_key = "file-secret-9999"
    r = await agent.post("/v1/chat/completions", json=chat("x"))
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "by-file"
    metrics = await (await agent.get("/metrics")).text()
    logs = caplog.text
    for secret in (wrong, "file-secret-9999", "pool-secret-0001"):
        assert secret not in body and secret not in metrics and secret not in logs
    assert str(secret_file) in logs  # where it looked, named


async def test_the_anthropic_adapter_round_trips_a_streamed_chat(
    make_agent: AgentFactory, anthropic_fake: FakeAnthropic
) -> None:
    import openai

    agent = await make_agent(**CLOUD)
    set_targets(agent, claude(anthropic_fake))
    async with openai.AsyncOpenAI(
        base_url=str(agent.make_url("/v1")), api_key="unused", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model=BIG,
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there"},
            ],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=40,
            stop=["zzz"],
        )
        parts, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        whole = await client.chat.completions.create(
            model=BIG, messages=[{"role": "user", "content": "and again"}]
        )
    assert "".join(parts) == "You said: hello there" and finish == "stop"
    assert usage is not None and usage.completion_tokens == 4 and usage.prompt_tokens > 0
    assert whole.choices[0].message.content == "You said: and again"
    sent = anthropic_fake.received[0]
    assert sent["model"] == "claude-haiku" and sent["system"] == "be brief"
    assert sent["messages"] == [{"role": "user", "content": "hello there"}]
    assert sent["max_tokens"] == 40 and sent["stop_sequences"] == ["zzz"] and sent["stream"]
    assert anthropic_fake.headers[0]["x-api-key"] == "ant-secret-0002"


async def test_529_overloaded_is_retried_and_the_cost_reaches_record_metrics_and_report(
    make_agent: AgentFactory, anthropic_fake: FakeAnthropic, tmp_path: Path
) -> None:
    agent: TestClient = await make_agent(**CLOUD)
    spool = agent.app[REQUEST_LOG].open(tmp_path, "edge-x")  # type: ignore[index]
    set_targets(
        agent, claude(anthropic_fake, prompt_price_per_1k=3.0, completion_price_per_1k=15.0)
    )
    anthropic_fake.plan = [("status", 529), ("status", 429)]
    r = await agent.post("/v1/chat/completions", json=chat("hello there"))
    assert r.status == 200 and len(anthropic_fake.received) == 3
    usage = (await r.json())["usage"]
    report = service_of(agent).book.take()
    assert len(report) == 1 and report[0].target == "claude" and report[0].requests == 1
    expected = (usage["prompt_tokens"] * 3.0 + usage["completion_tokens"] * 15.0) / 1000
    assert report[0].cost == pytest.approx(expected)
    assert report[0].completion_tokens == usage["completion_tokens"] == 4
    metrics = await (await agent.get("/metrics")).text()
    assert f'edgefleet_agent_overflow_cost_total{{target="claude"}} {expected}' in metrics
    assert service_of(agent).book.take() == ()  # taken once
    batch = spool.batch(0)
    assert batch is not None
    (record,) = msgpack.unpackb(batch[1])
    assert record["served_by"] == "claude" and record["cost"] == pytest.approx(expected)
    assert record["model"] == BIG and record["completion_tokens"] == 4
    assert [leg["target"] for leg in record["overflow"]] == ["claude"]
    assert "hello" not in json.dumps(record)  # never any text


async def test_a_stream_broken_on_a_peer_resumes_on_another_by_token_ids(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, openai_fake2: FakeOpenAI
) -> None:
    agent = await make_agent(overflow={"max_retries": 0})  # peers only: no cloud

    def peer(name: str, fake: FakeOpenAI, slots: int) -> OverflowTarget:
        return OverflowTarget(
            name, OverflowKind.PEER, url_of(fake), api=OverflowApi.EDGEFLEET, site="lab",
            free_slots=slots,
        )  # fmt: skip

    set_targets(agent, peer("edge-b", openai_fake, 4), peer("edge-c", openai_fake2, 2))
    openai_fake.plan = [("break", 3)]  # "You", " sa", "id:" then gone
    r = await agent.post(
        "/v1/chat/completions",
        json=chat("hello there", stream=True),
        headers={"Authorization": "Bearer pool-secret-0001"},  # the client's, passed on
    )
    assert r.headers["X-Edgefleet-Served-By"] == "edge-b"  # who started it
    text, events, done = await sse(r)
    assert text == "You said: hello there" and done
    assert not any("error" in e for e in events)
    assert all("token_ids" not in e["choices"][0] for e in events if e["choices"])
    first, resumed = openai_fake.received[0], openai_fake2.received[0]
    assert first["return_token_ids"] is True and "continue_token_ids" not in first
    assert resumed["continue_token_ids"] == [ord(c) for c in "You said:"]
    assert resumed["max_tokens"] == 32 - len("You said:")  # one id per character here
    assert openai_fake2.headers[0]["X-Edgefleet-Hop"] == "1"
    assert resumed["messages"] == first["messages"]  # at the site: nothing redacted


async def test_block_mode_refuses_with_the_types_found_and_sends_nothing(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    agent = await make_agent(**CLOUD)
    set_targets(agent, pool(openai_fake))
    body = chat("write to bob@example.net", edgefleet={"redaction": "block"})
    for stream in (False, True):
        r = await agent.post("/v1/chat/completions", json={**body, "stream": stream})
        error = (await r.json())["error"]
        assert r.status == 400 and error["code"] == "redaction_blocked"
        assert "EMAIL" in error["message"] and "bob@example.net" not in error["message"]
    assert openai_fake.received == []
    # nothing personal in it: it goes
    r = await agent.post("/v1/chat/completions", json=chat("hi", edgefleet={"redaction": "block"}))
    assert r.status == 200 and len(openai_fake.received) == 1


async def test_a_target_past_its_first_token_timeout_fails_over(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, openai_fake2: FakeOpenAI
) -> None:
    agent = await make_agent(overflow={"allow_cloud": True, "max_retries": 0})
    set_targets(
        agent, pool(openai_fake, "slow", first_token_timeout_ms=300), pool(openai_fake2, "fast")
    )
    openai_fake.plan = [("hang", 5.0), ("hang", 5.0)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await agent.post("/v1/chat/completions", json=chat("quick", stream=True))
    assert r.headers["X-Edgefleet-Served-By"] == "fast"
    assert (await sse(r))[0] == "You said: quick"
    r = await agent.post("/v1/chat/completions", json=chat("quick"))
    assert r.headers["X-Edgefleet-Served-By"] == "fast"
    assert loop.time() - started < 4.0  # two 300 ms timeouts, not two 5 s hangs


async def test_a_request_one_adapter_cannot_translate_goes_to_the_next_target(
    make_agent: AgentFactory, openai_fake: FakeOpenAI, anthropic_fake: FakeAnthropic
) -> None:
    agent = await make_agent(**CLOUD)
    openai_provider = OverflowTarget(
        "openai-compatible", OverflowKind.HOSTED_PROVIDER, url_of(openai_fake),
        api=OverflowApi.OPENAI, credential_env=POOL_KEY_ENV,
    )  # fmt: skip
    set_targets(agent, claude(anthropic_fake), openai_provider)
    messages = [
        {"role": "user", "content": "what is 6 x 7?"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},  # not translated
        {"role": "user", "content": "so?"},
    ]
    body = {"model": BIG, "messages": messages, "max_tokens": 8}
    r = await agent.post("/v1/chat/completions", json=body)
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "openai-compatible"
    assert anthropic_fake.received == [] and len(openai_fake.received) == 1
    claude_target = service_of(agent).targets.get("claude")
    assert claude_target is not None and claude_target.breaker.state == "closed"
    # no target can: the client's error, naming the field
    set_targets(agent, claude(anthropic_fake))
    r = await agent.post("/v1/chat/completions", json={**body, "stream": True})
    error = (await r.json())["error"]
    assert r.status == 400 and "messages.1" in error["message"]


async def test_a_constrained_request_goes_only_where_constraints_hold_and_is_validated(
    make_agent: AgentFactory, openai_fake: FakeOpenAI
) -> None:
    """A json_schema request skips targets that do not enforce constraints; a target that
    claims to but answers outside the schema is not returned to the client (issue 14)."""
    agent = await make_agent(**CLOUD)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = chat(
        "give me a number",
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    set_targets(agent, pool(openai_fake))  # no supports_constraints: never tried
    r = await agent.post("/v1/chat/completions", json=body)
    assert r.status == 404 and openai_fake.received == []  # the model is not loaded here
    set_targets(agent, pool(openai_fake, supports_constraints=True))
    r = await agent.post("/v1/chat/completions", json=body)
    error = (await r.json())["error"]
    assert r.status == 502 and error["code"] == "invalid_constrained_output", error
    assert len(openai_fake.received) == 1  # it was asked, and its "You said: ..." refused
    assert "You said" not in error["message"]
    r = await agent.post("/v1/chat/completions", json={**body, "stream": True})
    text, events, done = await sse(r)
    assert text.startswith("You said")  # streamed before the end of the answer...
    assert events[-1]["error"]["code"] == "invalid_constrained_output" and done  # ...not clean
    # free text from the same target is returned as it is
    r = await agent.post("/v1/chat/completions", json=chat("hello"))
    assert r.status == 200 and r.headers["X-Edgefleet-Served-By"] == "pool-a"


async def test_two_peers_that_cannot_serve_never_forward_a_request_back_and_forth(
    make_agent: AgentFactory,
) -> None:
    """Two agents at a site over plain HTTP (no agent certificates), each the other's
    overflow peer, neither serving the model asked for: the first forwards the request
    once, the second refuses it without forwarding it again (the hop marker), and the
    client gets that refusal at once. Before, the marker counted only from
    a peer with a certificate, so the two forwarded it back and forth, a connection more
    at each hop, until the connection cap: the 503 "too many connections" seen in a CI run
    of the int8 rollback test, where two saturated agents at one site were each other's
    peers."""
    a, b = await make_agent(), await make_agent()

    def peer_of(client: TestClient, name: str) -> OverflowTarget:
        return OverflowTarget(name, OverflowKind.PEER, str(client.make_url("/v1")),
                              api=OverflowApi.EDGEFLEET, site="lab", free_slots=3)  # fmt: skip

    set_targets(a, peer_of(b, "peer-b"))
    set_targets(b, peer_of(a, "peer-a"))
    r = await asyncio.wait_for(a.post("/v1/chat/completions", json=chat("hi")), 20)
    body = await r.json()
    assert r.status == 404 and "peer-b answered HTTP 404" in body["error"]["message"], body
    hops = [service_of(x).book.refused.labels("hop")._value.get() for x in (a, b)]
    assert hops == [0, 1], hops
