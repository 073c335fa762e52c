"""The HTTP API on the tiny model: OpenAI shapes, SSE, usage, and every error case."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, make_mocked_request

from agent.api.http_io import CLIENT_GONE

TINY = "tiny-llama"
CHAT = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": TINY,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 6,
        "temperature": 0,
    }
    body.update(extra)
    return body


async def sse_events(resp: Any) -> list[Any]:
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = (await resp.read()).decode()
    events = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_chat_completion_shape_and_exact_usage(client: TestClient) -> None:
    resp = await client.post(CHAT, json=chat(max_tokens=7))
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "chat.completion"
    assert (
        body["model"].partition("@")[0] == TINY
        and body["model"] == f"{TINY}@{body['system_fingerprint']}"
    )
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    # the prompt is the chat template around the message: more tokens than the message
    assert usage["prompt_tokens"] > 10


async def test_streamed_chat_equals_unstreamed_and_reports_usage(client: TestClient) -> None:
    # no cache: the streamed answer must come from the engine, not from the plain one
    plain = await (await client.post(CHAT, json=chat(cache=False))).json()
    resp = await client.post(
        CHAT, json=chat(stream=True, stream_options={"include_usage": True}, cache=False)
    )
    assert resp.headers["X-Edgefleet-Cache"] == "bypass"
    assert resp.status == 200
    events = await sse_events(resp)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == plain["usage"]


async def test_completions_text_and_token_prompt(client: TestClient) -> None:
    body = {"model": TINY, "prompt": "Once upon", "max_tokens": 5, "temperature": 0, "cache": False}
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    text_result = await resp.json()
    assert text_result["object"] == "text_completion"
    assert text_result["usage"]["completion_tokens"] == 5
    streamed = await client.post("/v1/completions", json={**body, "stream": True})
    events = await sse_events(streamed)
    assert "".join(e["choices"][0]["text"] for e in events) == text_result["choices"][0]["text"]
    ids = {"model": TINY, "prompt": [1, 2, 3, 4], "max_tokens": 3, "temperature": 0}
    by_ids = await (await client.post("/v1/completions", json=ids)).json()
    assert by_ids["usage"]["prompt_tokens"] == 4


async def test_seed_gives_repeatable_sampling(client: TestClient) -> None:
    body = chat(temperature=1.0, seed=1234, max_tokens=12, cache=False)
    a = await (await client.post(CHAT, json=body)).json()
    b = await (await client.post(CHAT, json=body)).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


async def test_models_health_metrics_openapi(client: TestClient) -> None:
    models = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [TINY]
    assert models["data"][0]["version"].startswith("fp32-")
    health = await (await client.get("/healthz")).json()
    assert health["status"] == "ok"
    await client.post(CHAT, json=chat())
    metrics = await (await client.get("/metrics")).text()
    assert 'edgefleet_agent_requests_total{endpoint="/v1/chat/completions",status="200"}' in metrics
    assert "edgefleet_agent_time_to_first_token_seconds_count" in metrics
    doc = await (await client.get("/openapi.json")).json()
    served = {r.resource.canonical for r in client.app.router.routes()}  # type: ignore[union-attr]
    assert served == set(doc["paths"])


LONG = "word " * 400  # well over the 256-token context of the test app

BAD_REQUESTS: list[tuple[str, str, Any, int, str | None]] = [
    # (name, path, body (bytes or JSON-able), status, param)
    ("malformed json", CHAT, b'{"model": "tiny-llama", "messages": [', 400, None),
    ("bad utf-8", CHAT, b'{"model": "\xff\xfe", "messages": []}', 400, None),
    ("json array body", CHAT, b"[1, 2, 3]", 400, None),
    ("empty body", CHAT, b"", 400, None),
    ("unknown model", CHAT, chat(model="no-such-model"), 404, "model"),
    ("missing messages", CHAT, {"model": TINY}, 400, "messages"),
    ("empty messages", CHAT, chat(messages=[]), 400, "messages"),
    ("bad role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, None),
    ("temperature as string", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("temperature too high", CHAT, chat(temperature=5), 400, "temperature"),
    ("top_p zero", CHAT, chat(top_p=0), 400, "top_p"),
    ("n=2", CHAT, chat(n=2), 400, "n"),
    ("max_tokens zero", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens over context", CHAT, chat(max_tokens=100000), 400, "max_tokens"),
    (
        "prompt over context",
        CHAT,
        chat(messages=[{"role": "user", "content": LONG}]),
        400,
        "messages",
    ),
    ("stop not a string", CHAT, chat(stop=7), 400, "stop"),
    ("too many stops", CHAT, chat(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("tool not a function", CHAT, chat(tools=[{"type": "retrieval"}]), 400, "tools.0.type"),
    ("functions (deprecated)", CHAT, chat(functions=[{"name": "f"}]), 400, "functions"),
    (
        "body too large",
        CHAT,
        {"model": TINY, "messages": [{"role": "user", "content": "x" * 70000}]},
        413,
        None,
    ),
    (
        "completions bad token id",
        "/v1/completions",
        {"model": TINY, "prompt": [99999999]},
        400,
        "prompt",
    ),
    ("embeddings on a text model", "/v1/embeddings", {"model": TINY, "input": "hi"}, 400, "model"),
    ("seed as float", CHAT, chat(seed=1.5), 400, "seed"),
    ("stream not a bool", CHAT, chat(stream="yes"), 400, "stream"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_bad_request_gets_openai_error_and_server_keeps_serving(
    client: TestClient, path: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    else:
        resp = await client.post(path, json=body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert error["message"]
    assert error["type"] in ("invalid_request_error", "not_found_error")
    if param is not None:
        assert error["param"] == param
    # the server still answers a good request afterwards
    ok = await client.post(CHAT, json=chat(max_tokens=2))
    assert ok.status == 200


async def test_context_error_states_the_limits(client: TestClient) -> None:
    resp = await client.post(CHAT, json=chat(max_tokens=100000))
    error = (await resp.json())["error"]
    assert error["code"] == "context_length_exceeded"
    assert "256" in error["message"] and "100000" in error["message"]


async def test_unknown_route_and_wrong_method_are_json(client: TestClient) -> None:
    resp = await client.get("/v1/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["type"] == "not_found_error"
    resp = await client.get(CHAT)
    assert resp.status == 405
    assert "error" in await resp.json()


async def test_stream_chunks_have_openai_shape(client: TestClient) -> None:
    resp = await client.post(CHAT, json=chat(stream=True, cache=False))
    events = await sse_events(resp)
    assert all("usage" not in e for e in events)  # only with stream_options.include_usage
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(set(e["choices"][0]["delta"]) == {"content"} for e in events[1:-1])
    assert events[-1]["choices"][0]["delta"] == {}
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_client_gone_mark_is_a_request_key_without_warnings() -> None:
    # aiohttp >= 3.14 warns on str request keys; with warnings as errors the disconnect
    # path of stream_sse turned a client gone mid-stream into a 500
    request = make_mocked_request("POST", CHAT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        request[CLIENT_GONE] = True
    assert request.get(CLIENT_GONE) is True


# --- mid-stream errors, token ids, continuation ------------------------------------------


def _fail_after(model: Any, n: int, exc: Exception) -> None:
    """Make the served model raise ``exc`` after ``n`` real outputs of each generation."""
    real = model.generate

    async def generate(request: Any) -> Any:
        produced = 0
        async for output in real(request):
            if produced == n:
                raise exc
            produced += 1
            yield output

    model.generate = generate


def _served(client: TestClient) -> Any:
    from agent.api.app import REGISTRY

    return client.app[REGISTRY].text_model(TINY)  # type: ignore[index]


MID_STREAM_ERRORS = [
    ("engine failed", "EngineError", "engine_error", "server_error"),
    ("timeout", "RequestTimeoutError", "request_timeout", "timeout_error"),
    ("overloaded", "OverloadedError", "overloaded", "rate_limit_error"),
    ("unexpected", "RuntimeError", "internal_error", "server_error"),
    ("invalid mid-stream", "InvalidRequestError", "invalid_request", "invalid_request_error"),
]


@pytest.mark.parametrize(
    ("exc_name", "code", "error_type"),
    [case[1:] for case in MID_STREAM_ERRORS],
    ids=[case[0] for case in MID_STREAM_ERRORS],
)
@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
async def test_error_after_stream_started_ends_with_one_error_event_and_done(
    client: TestClient, path: str, exc_name: str, code: str, error_type: str
) -> None:
    import agent.errors

    exc_type = getattr(agent.errors, exc_name, None) or RuntimeError
    _fail_after(_served(client), 3, exc_type("boom after three tokens"))
    body: dict[str, Any] = (
        chat(max_tokens=10, stream=True, cache=False)
        if path == CHAT
        else {"model": TINY, "prompt": "Once", "max_tokens": 10, "temperature": 0,
              "stream": True, "cache": False}
    )  # fmt: skip
    resp = await client.post(path, json=body)
    assert resp.status == 200  # the status line was out before the error
    raw = (await resp.read()).decode()
    assert raw.count("HTTP/1.1") == 0  # never a second status line inside the body
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert set(error) == {"error"}
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["code"] == code
    assert error["error"]["type"] == error_type
    if exc_name == "RuntimeError":  # details of an unexpected error stay in the log
        assert "boom" not in error["error"]["message"]
    chunks = [json.loads(e) for e in events[:-2]]
    assert all("error" not in c for c in chunks)
    assert all(not c["choices"] or c["choices"][0]["finish_reason"] is None for c in chunks)
    # the server keeps serving
    _served(client).generate = type(_served(client)).generate.__get__(_served(client))
    assert (await client.post(CHAT, json=chat(max_tokens=2))).status == 200


async def test_streamed_chunks_carry_token_ids_only_when_asked(client: TestClient) -> None:
    plain = await client.post(CHAT, json=chat(max_tokens=8, stream=True, cache=False))
    assert all("token_ids" not in c for e in await sse_events(plain) for c in e["choices"])
    whole = await (await client.post(CHAT, json=chat(max_tokens=8, return_token_ids=True))).json()
    ids = whole["choices"][0]["token_ids"]
    assert len(ids) == whole["usage"]["completion_tokens"] == 8
    resp = await client.post(
        CHAT, json=chat(max_tokens=8, stream=True, return_token_ids=True, cache=False)
    )
    events = await sse_events(resp)
    streamed = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    assert streamed == ids
    body = {"model": TINY, "prompt": "Once upon", "max_tokens": 6, "temperature": 0}
    text = await client.post("/v1/completions", json={**body, "return_token_ids": True})
    ids = (await text.json())["choices"][0]["token_ids"]
    resp = await client.post(
        "/v1/completions", json={**body, "stream": True, "return_token_ids": True, "cache": False}
    )
    assert [t for e in await sse_events(resp) for t in e["choices"][0]["token_ids"]] == ids


RESUMABLE = [
    ("greedy", {"temperature": 0}),
    ("seeded", {"temperature": 1.0, "seed": 77}),
    ("seeded top_p", {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 5}),
]


@pytest.mark.parametrize("sampling", [c[1] for c in RESUMABLE], ids=[c[0] for c in RESUMABLE])
@pytest.mark.parametrize("cut", [1, 5, 11])
async def test_continuation_resumes_exactly_where_the_stream_broke(
    client: TestClient, sampling: dict[str, Any], cut: int
) -> None:
    body = chat(max_tokens=16, return_token_ids=True, cache=False, **sampling)
    full = await (await client.post(CHAT, json=body)).json()
    ids = full["choices"][0]["token_ids"]
    assert len(ids) == 16
    resumed = await (
        await client.post(
            CHAT, json={**body, "continue_token_ids": ids[:cut], "max_tokens": 16 - cut}
        )
    ).json()
    choice = resumed["choices"][0]
    assert ids[:cut] + choice["token_ids"] == ids
    assert choice["finish_reason"] == full["choices"][0]["finish_reason"]
    # usage: the continued ids count as prompt, the rest as completion
    assert resumed["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"] + cut
    assert resumed["usage"]["completion_tokens"] == 16 - cut
    # the text: what the first stream delivered up to the cut, then the resumed text
    stream = await client.post(CHAT, json={**body, "stream": True})
    chunks = [c for e in await sse_events(stream) for c in e["choices"]]
    delivered, counted = "", 0
    for c in chunks:
        if counted >= cut:
            break
        delivered += c["delta"].get("content") or ""
        counted += len(c["token_ids"])
    assert delivered + choice["message"]["content"] == full["choices"][0]["message"]["content"]


async def test_completion_continuation_and_min_tokens_across_the_cut(client: TestClient) -> None:
    body = {"model": TINY, "prompt": "Once upon", "max_tokens": 12, "temperature": 0.9,
            "seed": 3, "return_token_ids": True, "cache": False}  # fmt: skip
    full = (await (await client.post("/v1/completions", json=body)).json())["choices"][0]
    resumed = (
        await (
            await client.post(
                "/v1/completions",
                json={**body, "continue_token_ids": full["token_ids"][:4], "max_tokens": 8},
            )
        ).json()
    )["choices"][0]
    assert full["token_ids"][:4] + resumed["token_ids"] == full["token_ids"]
    assert resumed["text"] == full["text"][len(full["text"]) - len(resumed["text"]) :]


async def test_continuation_keeps_a_stop_string_that_spans_the_cut(client: TestClient) -> None:
    body = chat(max_tokens=16, return_token_ids=True, cache=False)
    full = await (await client.post(CHAT, json=body)).json()
    text, ids = full["choices"][0]["message"]["content"], full["choices"][0]["token_ids"]
    # a stop string made of the text of tokens 3..6: cut at token 4, inside it
    tail = _decode_prefix(text, ids, client, 6)[len(_decode_prefix(text, ids, client, 3)) :]
    if not tail.strip():
        pytest.fail("the tiny model's output has no text to build a stop string from")
    stopped = await (await client.post(CHAT, json={**body, "stop": [tail]})).json()
    resumed = await (
        await client.post(
            CHAT,
            json={**body, "stop": [tail], "continue_token_ids": ids[:4], "max_tokens": 12},
        )
    ).json()
    assert resumed["choices"][0]["finish_reason"] == stopped["choices"][0]["finish_reason"]
    expected = stopped["choices"][0]["message"]["content"]
    assert expected == text[: text.find(tail)]
    # what a stream with that stop delivered with its first 4 token ids (the stop's start is
    # held back), then the resumed text: together exactly the uninterrupted answer
    stream = await client.post(CHAT, json={**body, "stop": [tail], "stream": True})
    delivered, counted = "", 0
    for c in [c for e in await sse_events(stream) for c in e["choices"]]:
        if counted >= 4:
            break
        delivered += c["delta"].get("content") or ""
        counted += len(c["token_ids"])
    assert delivered + resumed["choices"][0]["message"]["content"] == expected


def _decode_prefix(text: str, ids: list[int], client: TestClient, n: int) -> str:
    from agent.api.app import REGISTRY

    model = client.app[REGISTRY].text_model(TINY)  # type: ignore[index]
    return str(model._codec.decode(ids[:n]))


CONTINUATION_ERRORS: list[tuple[str, dict[str, Any], str | None]] = [
    ("id out of vocabulary", {"continue_token_ids": [1, 99999999]}, None),
    ("negative id", {"continue_token_ids": [-1]}, None),
    ("empty list", {"continue_token_ids": []}, None),
    ("not ints", {"continue_token_ids": ["a"]}, None),
    ("too long", {"continue_token_ids": [5] * 300}, "context_length_exceeded"),
]


@pytest.mark.parametrize(
    ("extra", "code"), [c[1:] for c in CONTINUATION_ERRORS], ids=[c[0] for c in CONTINUATION_ERRORS]
)
@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
async def test_hostile_continuation_is_refused_naming_the_field(
    client: TestClient, path: str, extra: dict[str, Any], code: str | None
) -> None:
    body = chat(**extra) if path == CHAT else {"model": TINY, "prompt": "hi", **extra}
    resp = await client.post(path, json=body)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"].split(".")[0] == "continue_token_ids"
    if code:
        assert error["code"] == code
