"""Structured outputs and tool calls over HTTP on the tiny (random-weight) model.

The tiny model writes nonsense, which is the point: whatever it prefers, the grammar keeps
its output valid. Schemas bound their strings so that it finishes within max_tokens.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema_rs
from aiohttp.test_utils import TestClient

from agent.api.app import REGISTRY
from tests.agent.structured.helpers import sse_events

TINY = "tiny-llama"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def chat(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": TINY,
        "messages": [{"role": "user", "content": "Describe a person"}],
        "max_tokens": 120,
        "temperature": 0,
        "cache": False,
    }
    body.update(extra)
    return body


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def assert_compact(text: str) -> None:
    """No whitespace outside string literals."""
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    assert not re.search(r"\s", outside), text


def assert_valid(schema: dict[str, Any], text: str) -> Any:
    value = json.loads(text)
    assert jsonschema_rs.validator_for(schema).is_valid(value), text
    return value


async def test_json_schema_output_validates_streamed_and_not(client: TestClient) -> None:
    for seed in range(4):  # sampled, not only greedy: every draw stays inside the grammar
        body = chat(response_format=schema_format(PERSON), temperature=1.0, seed=seed)
        resp = await client.post(CHAT, json=body)
        assert resp.status == 200, await resp.text()
        choice = (await resp.json())["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert_valid(PERSON, choice["message"]["content"])
        assert_compact(choice["message"]["content"])
        streamed = await client.post(CHAT, json={**body, "stream": True})
        events = await sse_events(streamed)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert text == choice["message"]["content"]  # same seed, same output, in pieces
        assert len([e for e in events if e["choices"][0]["delta"].get("content")]) > 3
        assert events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_json_schema_on_text_completions(client: TestClient) -> None:
    body = {
        "model": TINY,
        "prompt": "A person:",
        "max_tokens": 120,
        "temperature": 0,
        "response_format": schema_format(PERSON),
    }
    resp = await client.post(COMPLETIONS, json=body)
    assert resp.status == 200, await resp.text()
    choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert_valid(PERSON, choice["text"])


async def test_tool_choice_required_and_named_call_validates(client: TestClient) -> None:
    for choice_field, names in (
        ("required", {"get_weather", "get_time"}),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ):
        body = chat(tools=[WEATHER, TIME], tool_choice=choice_field)
        resp = await client.post(CHAT, json=body)
        assert resp.status == 200, await resp.text()
        choice = (await resp.json())["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None
        [call] = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in names
        tool = WEATHER if call["function"]["name"] == "get_weather" else TIME
        assert_valid(tool["function"]["parameters"], call["function"]["arguments"])  # type: ignore[index]


async def test_streamed_tool_call_arrives_as_openai_streams_it(client: TestClient) -> None:
    body = chat(tools=[WEATHER], tool_choice="required", stream=True)
    events = await sse_events(await client.post(CHAT, json=body))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    first, rest = pieces[0], pieces[1:]
    assert first["index"] == 0 and first["id"].startswith("call_")
    assert first["type"] == "function" and first["function"]["name"] == "get_weather"
    assert len(rest) >= 2 and all(set(p) == {"index", "function"} for p in rest)
    assert all(set(p["function"]) == {"arguments"} for p in rest)
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert_valid(WEATHER["function"]["parameters"], arguments)  # type: ignore[index]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # the whole response names the same call
    whole = await (await client.post(CHAT, json={**body, "stream": False})).json()
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments


async def test_tool_choice_auto_admits_text_or_a_call(client: TestClient) -> None:
    """The mechanism, not the model's judgment: an output resumed after ``<`` can only be a
    call; one resumed after a letter can only be text; the first token decides."""
    codec_ids = await tokenize(client, ["<", "Sure"])
    base = chat(tools=[WEATHER], tool_choice="auto", return_token_ids=True, max_tokens=60)
    resp = await client.post(CHAT, json={**base, "continue_token_ids": codec_ids["<"]})
    choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    args = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert_valid(WEATHER["function"]["parameters"], args)  # type: ignore[index]
    resp = await client.post(CHAT, json={**base, "continue_token_ids": codec_ids["Sure"]})
    choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert "tool_calls" not in choice["message"] and choice["message"]["content"]
    # free: whichever the model picks, it is one of the two
    resp = await client.post(CHAT, json=base)
    choice = (await resp.json())["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        assert choice["message"]["content"] is None
    else:
        assert not choice["message"]["content"].startswith("<")


async def tokenize(client: TestClient, texts: list[str]) -> dict[str, list[int]]:
    """Token ids of each text by the served model's own tokenizer."""
    model = client.server.app[REGISTRY].text_model(TINY)  # type: ignore[union-attr]
    return {t: model.encode(t) for t in texts}


async def test_tool_result_message_on_the_next_turn(client: TestClient) -> None:
    first = await (
        await client.post(CHAT, json=chat(tools=[WEATHER], tool_choice="required"))
    ).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp":21}'},
    ]
    resp = await client.post(
        CHAT, json=chat(messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8)
    )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["choices"][0]["message"]["content"]
    # the call and the result went into the prompt: it is longer than without them
    bare = await (
        await client.post(CHAT, json=chat(messages=messages[:1], tools=[WEATHER], max_tokens=8))
    ).json()
    assert body["usage"]["prompt_tokens"] > bare["usage"]["prompt_tokens"] - 60
    missing_id = [*messages[:2], {"role": "tool", "content": "x"}]
    resp = await client.post(CHAT, json=chat(messages=missing_id, tools=[WEATHER]))
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "messages.2.tool_call_id"


async def test_constrained_and_free_batched_together_match_alone(
    make_client: Any,
) -> None:
    client = await make_client(engine={"max_running": 8, "max_context_tokens": 1024})
    requests = [
        chat(response_format=schema_format(PERSON)),
        chat(messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=30),
        chat(tools=[WEATHER, TIME], tool_choice="required"),
        chat(messages=[{"role": "user", "content": "Hello there"}], max_tokens=30),
        chat(response_format=schema_format(PERSON), temperature=0.8, seed=7),
    ]

    async def one(body: dict[str, Any]) -> Any:
        resp = await client.post(CHAT, json=body)
        assert resp.status == 200, await resp.text()
        msg = (await resp.json())["choices"][0]["message"]
        calls = msg.get("tool_calls")
        return msg["content"], calls and calls[0]["function"]

    alone = [await one(body) for body in requests]
    together = await asyncio.gather(*(one(body) for body in requests))
    assert together == alone


async def test_bad_or_oversized_schema_is_a_400_naming_it(client: TestClient) -> None:
    cases = [
        (
            chat(response_format=schema_format({"type": "strnig"})),
            "response_format.json_schema.schema",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x y"}}),
            "response_format.json_schema.name",
        ),
        (chat(response_format={"type": "yaml"}), "response_format.type"),
        (
            chat(
                response_format=schema_format(
                    {
                        "type": "object",
                        "properties": {
                            f"p{i}": {"type": "string", "description": "x" * 100}
                            for i in range(700)
                        },
                    }
                )
            ),
            "response_format.json_schema.schema",
        ),
        (
            chat(tools=[{"type": "function", "function": {"name": "bad name"}}]),
            "tools.0.function.name",
        ),
        (
            chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
        ),
        (chat(tool_choice="required"), "tool_choice"),
        (chat(response_format=schema_format(PERSON), stop=["}"]), "stop"),
        # a valid JSON Schema the grammar engine cannot compile (a pattern with a lookahead)
        (
            chat(response_format=schema_format({"type": "string", "pattern": "^(?=a)a$"})),
            "response_format",
        ),
    ]
    for body, param in cases:
        resp = await client.post(CHAT, json=body)
        assert resp.status == 400, (param, await resp.text())
        error = (await resp.json())["error"]
        assert error["param"] == param, error
        assert error["message"]


async def test_cache_key_includes_the_constraint(client: TestClient) -> None:
    body = chat(cache=True, max_tokens=40)
    free = await client.post(CHAT, json=body)
    assert free.headers["X-Edgefleet-Cache"] == "miss"
    constrained = await client.post(CHAT, json={**body, "response_format": schema_format(PERSON)})
    assert constrained.headers["X-Edgefleet-Cache"] == "miss"
    assert_valid(PERSON, (await constrained.json())["choices"][0]["message"]["content"])
    again = await client.post(CHAT, json={**body, "response_format": schema_format(PERSON)})
    assert again.headers["X-Edgefleet-Cache"] == "hit"
    other = {**PERSON, "required": ["name"]}
    third = await client.post(CHAT, json={**body, "response_format": schema_format(other)})
    assert third.headers["X-Edgefleet-Cache"] == "miss"
    named = {**body, "tools": [WEATHER, TIME]}
    for choice_field in ("required", {"type": "function", "function": {"name": "get_time"}}):
        resp = await client.post(CHAT, json={**named, "tool_choice": choice_field})
        assert resp.headers["X-Edgefleet-Cache"] == "miss"


async def test_resumed_stream_advances_the_grammar(client: TestClient) -> None:
    body = chat(response_format=schema_format(PERSON), return_token_ids=True)
    whole = (await (await client.post(CHAT, json=body)).json())["choices"][0]
    ids = whole["token_ids"]
    resumed = await client.post(CHAT, json={**body, "continue_token_ids": ids[:5]})
    rest = (await resumed.json())["choices"][0]
    assert rest["token_ids"] == ids[5:]
    # ids the grammar cannot have produced are refused
    bad = await client.post(CHAT, json={**body, "continue_token_ids": [28]})
    assert bad.status == 400
    assert (await bad.json())["error"]["param"] == "continue_token_ids"


async def test_models_list_capabilities(client: TestClient) -> None:
    cards = (await (await client.get("/v1/models")).json())["data"]
    caps = next(c for c in cards if c["id"] == TINY)["capabilities"]
    assert caps == {
        "response_format": ["text", "json_object", "json_schema"],
        "tools": True,
        "parallel_tool_calls": False,
        "streaming_tool_calls": True,
    }
    body = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=True)
    resp = await client.post(CHAT, json=body)
    assert len((await resp.json())["choices"][0]["message"]["tool_calls"]) == 1
