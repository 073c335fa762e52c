"""The provider fakes, driven first by the official SDKs (``openai``, ``anthropic``): what
they speak is what the SDKs understand, streaming, errors and ping events included, so
the fakes are checked by something other than the adapters they test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import openai
import pytest

from tests.overflow.overflow_fakes import FakeAnthropic, FakeOpenAI


@pytest.fixture
async def fake_openai() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI(api_key="sk-fake-123")
    url = await fake.start()
    yield fake, url
    await fake.close()


@pytest.fixture
async def fake_anthropic() -> AsyncIterator[tuple[FakeAnthropic, str]]:
    fake = FakeAnthropic(api_key="sk-ant-fake-123")
    url = await fake.start()
    yield fake, url
    await fake.close()


async def test_openai_sdk_whole_and_streamed_chat(fake_openai: tuple[FakeOpenAI, str]) -> None:
    fake, url = fake_openai
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-fake-123", max_retries=0) as c:
        done = await c.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hello there"}]
        )
        assert done.choices[0].message.content == "You said: hello there"
        assert done.usage is not None and done.usage.completion_tokens == 4
        stream = await c.chat.completions.create(
            model="gpt-x",
            messages=[{"role": "user", "content": "hello there"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(parts) == "You said: hello there"
        assert len(parts) > 3 and finish == "stop"
        assert usage is not None and usage.completion_tokens == 4
        text = await c.completions.create(model="gpt-x", prompt="once upon a time")
        assert text.choices[0].text == " and so on"
    assert fake.received[1]["stream"] is True


async def test_openai_sdk_sees_429_and_401(fake_openai: tuple[FakeOpenAI, str]) -> None:
    fake, url = fake_openai
    fake.plan = [("status", 429)]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-fake-123", max_retries=0) as c:
        with pytest.raises(openai.RateLimitError) as caught:
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert caught.value.code == "rate_limit_exceeded"
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


async def test_anthropic_sdk_whole_and_streamed_message(
    fake_anthropic: tuple[FakeAnthropic, str],
) -> None:
    fake, url = fake_anthropic
    async with anthropic.AsyncAnthropic(
        base_url=url, api_key="sk-ant-fake-123", max_retries=0
    ) as c:
        message = await c.messages.create(
            model="claude-x",
            max_tokens=64,
            system="be brief",
            messages=[{"role": "user", "content": "hello there"}],
        )
        assert message.content[0].type == "text"
        assert message.content[0].text == "You said: hello there"
        assert message.stop_reason == "end_turn" and message.usage.output_tokens == 4
        async with c.messages.stream(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hello there"}]
        ) as stream:
            pieces = [text async for text in stream.text_stream]  # ping events skipped
            final = await stream.get_final_message()
        assert "".join(pieces) == "You said: hello there" and len(pieces) > 3
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == 4
        # assistant prefill: the answer continues the last assistant turn
        prefilled = await c.messages.create(
            model="claude-x",
            max_tokens=64,
            messages=[
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "You said:"},
            ],
        )
        assert prefilled.content[0].type == "text"
        assert prefilled.content[0].text == " hello there"
    assert fake.headers[0]["anthropic-version"]


async def test_anthropic_sdk_sees_529_overloaded_429_and_stream_errors(
    fake_anthropic: tuple[FakeAnthropic, str],
) -> None:
    fake, url = fake_anthropic
    fake.plan = [("status", 529), ("status", 429), ("error_event", 2)]
    async with anthropic.AsyncAnthropic(
        base_url=url, api_key="sk-ant-fake-123", max_retries=0
    ) as c:
        kwargs = {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        with pytest.raises(anthropic.APIStatusError) as overloaded:
            await c.messages.create(**kwargs)  # type: ignore[call-overload]
        assert overloaded.value.status_code == 529
        assert isinstance(overloaded.value, anthropic.OverloadedError)
        with pytest.raises(anthropic.RateLimitError):
            await c.messages.create(**kwargs)  # type: ignore[call-overload]
        with pytest.raises(anthropic.APIStatusError) as mid_stream:
            async with c.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
                async for _ in stream.text_stream:
                    pass
        assert "overloaded" in str(mid_stream.value).lower()
