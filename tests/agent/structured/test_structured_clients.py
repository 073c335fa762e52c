"""Structured outputs and tool calls through real client libraries (the official ``openai``
SDK and LangChain's ``ChatOpenAI``) against an agent serving the real SmolLM2 model."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.agent.structured.conftest import REAL

pytestmark = pytest.mark.timeout(180)


class City(BaseModel):
    # population_millions is a plain float: under greedy decoding the 135M model writes
    # "11.1111..." for it (seen on one machine), which ran until max_tokens while a JSON
    # number's grammar admitted digits without end; the number cap
    # (agent.structured.number_cap) now ends it at 17 fraction digits (20 integer). The
    # strings stay bounded: a string's grammar admits characters without end, uncapped.
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: float


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


def sdk(client: TestClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0, timeout=120
    )


def chat_model(client: TestClient, **extra: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=REAL,
        base_url=str(client.make_url("/v1")),
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_retries=0,
        **extra,
    )


QUESTION = [{"role": "user", "content": "Give me the capital of France as JSON."}]


async def test_sdk_json_object_and_parse(real_client: TestClient) -> None:
    async with sdk(real_client) as client:
        reply = await client.chat.completions.create(
            model=REAL,
            messages=QUESTION,  # type: ignore[arg-type]
            response_format={"type": "json_object"},
            max_tokens=200,
            temperature=0,
        )
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
        parsed = await client.chat.completions.parse(
            model=REAL,
            messages=[{"role": "user", "content": "Describe Paris."}],
            response_format=City,
            max_tokens=200,
            temperature=0,
        )
        city = parsed.choices[0].message.parsed
        assert isinstance(city, City) and city.name
        # streamed (the SDK's helper sends the same strict schema), the pieces join into
        # the same valid object
        pieces = 0
        async with client.chat.completions.stream(
            model=REAL,
            messages=[{"role": "user", "content": "Describe Paris."}],
            response_format=City,
            max_tokens=200,
            temperature=0,
            extra_body={"cache": False},  # not the response cache's one-piece replay
        ) as stream:
            async for event in stream:
                pieces += event.type == "content.delta"
            final = await stream.get_final_completion()
        assert pieces > 3
        assert final.choices[0].message.parsed == city


async def test_sdk_parse_raises_length_finish_reason(real_client: TestClient) -> None:
    async with sdk(real_client) as client:
        body = {
            "model": REAL,
            "messages": [{"role": "user", "content": "Describe Paris."}],
            "response_format": City,
            "max_tokens": 5,
            "temperature": 0,
        }
        with pytest.raises(openai.LengthFinishReasonError) as raised:
            await client.chat.completions.parse(**body)  # type: ignore[arg-type]
        cut = raised.value.completion.choices[0]
        assert cut.finish_reason == "length"
        # the content is what was generated, unmodified: a prefix of the whole answer
        whole = await client.chat.completions.parse(**{**body, "max_tokens": 200})  # type: ignore[arg-type]
        assert (whole.choices[0].message.content or "").startswith(cut.message.content or "!")


async def test_sdk_tool_calls_required_streamed_and_not(real_client: TestClient) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 40}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    body: dict[str, Any] = {
        "model": REAL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 80,
        "temperature": 0,
    }
    async with sdk(real_client) as client:
        reply = await client.chat.completions.create(**body)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]
        # streamed: the SDK's stream helper assembles the pieces into the same call
        async with client.chat.completions.stream(**body) as stream:
            final = await stream.get_final_completion()
        streamed = final.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert streamed.function.arguments == call.function.arguments  # type: ignore[union-attr]
        assert final.choices[0].finish_reason == "tool_calls"
        # the result goes back on the next turn; tool_choice none answers in text
        follow = await client.chat.completions.create(
            model=REAL,
            messages=[
                *body["messages"],
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
            ],
            tools=tools,  # type: ignore[arg-type]
            tool_choice="none",
            max_tokens=30,
            temperature=0,
        )
        assert follow.choices[0].message.content
        assert not follow.choices[0].message.tool_calls


async def test_langchain_with_structured_output(real_client: TestClient) -> None:
    llm = chat_model(real_client, max_completion_tokens=200)
    for method in ("json_schema", "function_calling"):
        structured = llm.with_structured_output(City, method=method)  # type: ignore[arg-type]
        city = await structured.ainvoke("Describe Paris.")
        assert isinstance(city, City) and city.name, method
    json_mode = llm.with_structured_output(method="json_mode")
    value = await json_mode.ainvoke("Give me the capital of France as JSON.")
    assert isinstance(value, dict)


async def test_langchain_bind_tools(real_client: TestClient) -> None:
    llm = chat_model(real_client, max_completion_tokens=80)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather")
    message = await forced.ainvoke("What is the weather in Paris?")
    assert isinstance(message, AIMessage)
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    # streamed: LangChain merges the tool_call_chunks into the same call
    merged: Any = None
    async for chunk in forced.astream("What is the weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
    [streamed] = merged.tool_calls
    assert (streamed["name"], streamed["args"]) == (call["name"], call["args"])
    # the tool's answer on the next turn
    result = await get_weather.ainvoke(call["args"])
    answer = await llm.bind_tools([get_weather]).ainvoke(
        [
            HumanMessage("What is the weather in Paris?"),
            message,
            ToolMessage(result, tool_call_id=call["id"]),
        ]
    )
    assert isinstance(answer, AIMessage)
    assert answer.content or answer.tool_calls
