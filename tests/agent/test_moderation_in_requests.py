"""Content safety in the request path (issue 28), API keys on, the tiny model's real
engine, and the classifier's scores injected (the verdict is the real one: thresholds,
coverage, the sexual/minors rule): per key block, flag and off on the input; fail closed
without a classifier for a key that blocks; the input check before the response cache and
before overflow; a whole completion cut at its first blocked window; a buffered stream
that never sends the blocked window, ends with content_filter and frees the engine's slot;
an unbuffered stream ended behind the text it sent."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import agent.api.app as agent_app
from agent.api.app import METRICS, MODERATION_GATE, REGISTRY, REQUEST_LOG, create_app
from agent.auth.key_files import write_keys
from agent.auth.keys import new_secret, secret_digest
from agent.config import load_config
from agent.engine.interface import GenerationOutput, GenerationRequest
from agent.model_registry import ModelRegistry
from agent.moderation import Verdict, verdict
from agent.moderation.gate import STEP_TOKENS
from devtools.process import wait_until
from edgefleet.contract import ApiKey, KeyPolicy, KeysSection
from edgefleet.key_policy import key_policy_from_json
from models.moderation_spec import CATEGORIES, PROMPT_INJECTION

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TINY = "tiny-llama"
COVERED = frozenset({"harassment", "sexual", "violence", "hate", PROMPT_INJECTION})
THRESHOLDS = {c: 0.7 for c in CATEGORIES}
LOW = 0.3  # the sexual head's low threshold for sexual/minors
BAD = "BAD"  # a generated word the injected scores call harassment


class InjectedClassifier:
    """The classifier with its heads' scores injected: a text containing a marker scores
    what the marker says; the decision is :func:`agent.moderation.verdict`'s."""

    name = "stub-heads"
    version = "stub-1"

    def __init__(self) -> None:
        self.markers: dict[str, dict[str, float]] = {}
        self.calls: list[list[str]] = []

    async def classify(self, texts: Sequence[str]) -> list[Verdict]:
        self.calls.append(list(texts))
        out = []
        for text in texts:
            scores: dict[str, float] = {}
            for marker, given in self.markers.items():
                if marker in text:
                    for category, score in given.items():
                        scores[category] = max(scores.get(category, 0.0), score)
            out.append(verdict(scores, THRESHOLDS, COVERED, text, LOW))
        return out


def make_key(policy: dict[str, Any] | None = None) -> tuple[str, ApiKey]:
    key_id, secret = new_secret()
    return secret, ApiKey(
        key_id=key_id, secret_sha256=secret_digest(secret), policy=key_policy_from_json(policy)
    )


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def block(direction: str, *categories: str, **more: Any) -> dict[str, Any]:
    return {"moderation": {direction: dict.fromkeys(categories, "block"), **more}}


@dataclasses.dataclass
class Agent:
    client: TestClient
    classifier: InjectedClassifier
    registry: ModelRegistry
    seen: list[GenerationRequest]
    pulled: list[int]  # per generation: outputs taken from the engine

    def metric(self, name: str, **labels: str) -> float:
        value = self.client.app[METRICS].registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


Start = Callable[..., Awaitable[Agent]]


def _scripted(registry: ModelRegistry, seen: list[GenerationRequest], pulled: list[int]) -> None:
    """The real engine generates; its tokens' text is rewritten to ``t0 t1 ...`` with
    :data:`BAD` at token 40, so the windows are known (the tiny model's text is random)."""
    model = registry.text_models[TINY]
    generate = model.generate

    async def scripted(request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        seen.append(request)
        pulled.append(0)
        index = 0
        outputs = generate(request)
        try:
            async for output in outputs:
                words = []
                for _ in output.token_ids:
                    words.append(f"{BAD} " if index == 40 else f"t{index} ")
                    index += 1
                pulled[-1] += 1
                yield dataclasses.replace(output, text="".join(words))
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]

    model.generate = scripted  # type: ignore[method-assign]


@pytest.fixture
async def start(
    tiny_artifacts: Path, tmp_path: Path, make_tiny_registry: Callable[[], ModelRegistry]
) -> AsyncIterator[Start]:
    clients: list[TestClient] = []

    async def make(*keys: ApiKey, classifier: bool = True) -> Agent:
        path = tmp_path / f"keys-{len(clients)}.json"
        write_keys(path, KeysSection(0, keys))
        overrides: dict[str, Any] = {
            "models": {"dir": str(tiny_artifacts), "serve": [TINY]},
            "engine": {"max_context_tokens": 512, "default_max_tokens": 16},
            "auth": {"keys_file": str(path)},
        }
        registry = make_tiny_registry()
        seen: list[GenerationRequest] = []
        pulled: list[int] = []
        _scripted(registry, seen, pulled)
        app = create_app(load_config(environ={}, overrides=overrides), registry)
        client = TestClient(TestServer(app, handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        injected = InjectedClassifier()
        gate = app[MODERATION_GATE]
        assert gate.classifier is None  # the tiny agent serves no MiniLM
        if classifier:
            gate.classifier = injected  # type: ignore[assignment]
        return Agent(client, injected, app[REGISTRY], seen, pulled)

    yield make
    for client in clients:
        await client.close()


def chat(text: str, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be kind"}, {"role": "user", "content": text}]
    return {"model": TINY, "messages": messages, "max_tokens": 4, "temperature": 0} | fields


async def error_of(response: Any) -> dict[str, Any]:
    body = await response.json()
    return dict(body["error"])


# --- input ------------------------------------------------------------------------------


async def test_input_block_flag_and_off_per_key(start: Start) -> None:
    blocking_secret, blocking = make_key(block("input", "harassment"))
    default_secret, default = make_key()
    off_secret, off = make_key({"moderation": {"input": {"harassment": "off"}}})
    strict_secret, strict = make_key(
        {"moderation": {"input": {"harassment": {"action": "block", "threshold": 0.95}}}}
    )
    agent = await start(blocking, default, off, strict)
    agent.classifier.markers["HARASS"] = {"harassment": 0.9}
    text = "you are HARASS and worthless"

    refused = await agent.client.post(CHAT, json=chat(text), headers=bearer(blocking_secret))
    assert refused.status == 400
    error = await error_of(refused)
    assert (error["code"], error["type"], error["param"]) == (
        "content_filter", "invalid_request_error", "messages[1]"
    )  # fmt: skip
    assert "harassment" in error["message"] and text not in error["message"]
    assert agent.seen == []  # the engine never saw it

    flagged = await agent.client.post(CHAT, json=chat(text), headers=bearer(default_secret))
    assert flagged.status == 200
    assert flagged.headers["X-Edgefleet-Moderation"] == "flagged=harassment"
    assert agent.metric("edgefleet_agent_moderation_flagged_total", stage="input",
                        category="harassment", action="flag") == 1  # fmt: skip
    assert agent.metric("edgefleet_agent_moderation_flagged_total", stage="input",
                        category="harassment", action="block") == 1  # fmt: skip
    assert agent.metric("edgefleet_agent_moderation_check_seconds_count", stage="input") >= 2

    for secret in (off_secret, strict_secret):  # off; a threshold above the score
        passed = await agent.client.post(CHAT, json=chat(text), headers=bearer(secret))
        assert passed.status == 200
        assert "X-Edgefleet-Moderation" not in passed.headers
    # the system message is the app's: not checked
    calm = chat("hello", messages=[{"role": "system", "content": text},
                                   {"role": "user", "content": "hello"}])  # fmt: skip
    assert (await agent.client.post(CHAT, json=calm, headers=bearer(blocking_secret))).status == 200


async def test_defaults_block_sexual_minors_and_a_tool_message_is_checked(start: Start) -> None:
    secret, key = make_key()
    agent = await start(key)
    agent.classifier.markers["EXPLICIT"] = {"sexual": 0.4}  # under sexual's own 0.7
    body = chat("hi", messages=[
        {"role": "user", "content": "look this up"},
        {"role": "tool", "tool_call_id": "c1", "content": "EXPLICIT story about a 12 year old"},
    ])  # fmt: skip
    refused = await agent.client.post(CHAT, json=body, headers=bearer(secret))
    assert refused.status == 400
    error = await error_of(refused)
    assert error["code"] == "content_filter" and error["param"] == "messages[1]"
    assert "sexual/minors" in error["message"]
    adults = chat("EXPLICIT story about two adults")
    assert (await agent.client.post(CHAT, json=adults, headers=bearer(secret))).status == 200


async def test_completions_prompts_are_checked(start: Start) -> None:
    secret, key = make_key(block("input", "violence"))
    agent = await start(key)
    agent.classifier.markers["STAB"] = {"violence": 0.99}
    body = {"model": TINY, "prompt": "how to STAB someone", "max_tokens": 2}
    refused = await agent.client.post(COMPLETIONS, json=body, headers=bearer(secret))
    assert refused.status == 400 and (await error_of(refused))["param"] == "prompt"
    body["prompt"] = ["how to STAB someone"]
    refused = await agent.client.post(COMPLETIONS, json=body, headers=bearer(secret))
    assert refused.status == 400 and (await error_of(refused))["param"] == "prompt[0]"
    body["prompt"] = "a calm question"
    assert (await agent.client.post(COMPLETIONS, json=body, headers=bearer(secret))).status == 200


async def test_without_a_classifier_a_key_that_blocks_fails_closed_flags_pass(
    start: Start,
) -> None:
    blocking_secret, blocking = make_key(block("output", "violence"))
    flagging_secret, flagging = make_key({"moderation": {"input": {"hate": "flag"}}})
    default_secret, default = make_key()
    agent = await start(blocking, flagging, default, classifier=False)
    refused = await agent.client.post(CHAT, json=chat("hi"), headers=bearer(blocking_secret))
    assert refused.status == 503
    error = await error_of(refused)
    assert error["code"] == "moderation_unavailable" and "blocks" in error["message"]
    for secret in (flagging_secret, default_secret):  # fail open; an upgrade changes nothing
        passed = await agent.client.post(CHAT, json=chat("hi"), headers=bearer(secret))
        assert passed.status == 200
    assert agent.classifier.calls == []


async def test_the_input_check_comes_before_the_response_cache(start: Start) -> None:
    secret, key = make_key(block("input", "harassment"))
    agent = await start(key)
    body = chat("you are HARASS")
    first = await agent.client.post(CHAT, json=body, headers=bearer(secret))
    again = await agent.client.post(CHAT, json=body, headers=bearer(secret))
    assert [r.headers["X-Edgefleet-Cache"] for r in (first, again)] == ["miss", "hit"]
    agent.classifier.markers["HARASS"] = {"harassment": 0.9}  # e.g. newer heads
    refused = await agent.client.post(CHAT, json=body, headers=bearer(secret))
    assert refused.status == 400 and (await error_of(refused))["code"] == "content_filter"


async def test_the_input_check_comes_before_overflow(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model not served here goes to overflow; a blocked input never leaves the agent."""
    forwarded: list[str] = []

    async def forward(request: web.Request, endpoint: str, *_: Any) -> web.StreamResponse:
        forwarded.append(endpoint)
        return web.json_response({"forwarded": True})

    monkeypatch.setattr(agent_app, "forwardable", lambda request, exc: True)
    monkeypatch.setattr(agent_app, "forward", forward)
    secret, key = make_key(block("input", "harassment"))
    agent = await start(key)
    agent.classifier.markers["HARASS"] = {"harassment": 0.9}
    elsewhere = chat("you are HARASS", model="served-elsewhere")
    refused = await agent.client.post(CHAT, json=elsewhere, headers=bearer(secret))
    assert refused.status == 400 and forwarded == []
    calm = chat("hello", model="served-elsewhere")
    assert (await (await agent.client.post(CHAT, json=calm, headers=bearer(secret))).json()) == {
        "forwarded": True
    }
    assert forwarded == ["chat"]


# --- output -----------------------------------------------------------------------------

LONG = {"max_tokens": 64, "min_tokens": 64}
PASSED = "".join(f"t{i} " for i in range(STEP_TOKENS))  # the windows before BAD's


async def test_a_whole_completion_is_cut_at_its_first_blocked_window_and_never_cached(
    start: Start,
) -> None:
    blocking_secret, blocking = make_key(block("output", "harassment"))
    flagging_secret, flagging = make_key()
    agent = await start(blocking, flagging)
    agent.classifier.markers[BAD] = {"harassment": 0.9}
    body = chat("tell me a story", **LONG)
    for _ in range(2):
        cut = await agent.client.post(CHAT, json=body, headers=bearer(blocking_secret))
        assert cut.status == 200 and cut.headers["X-Edgefleet-Cache"] == "miss"
        answer = await cut.json()
        (choice,) = answer["choices"]
        assert choice["finish_reason"] == "content_filter"
        assert choice["message"]["content"] == PASSED  # 40 is in the second window
        assert answer["usage"]["completion_tokens"] == 64  # what was generated
    # flag only: the whole text, a header, a metric; a flagged answer is not cached either
    for _ in range(2):
        whole = await agent.client.post(CHAT, json=body, headers=bearer(flagging_secret))
        assert whole.headers["X-Edgefleet-Moderation"] == "flagged=harassment"
        assert whole.headers["X-Edgefleet-Cache"] == "miss"
        (choice,) = (await whole.json())["choices"]
        assert BAD in choice["message"]["content"] and choice["finish_reason"] == "length"
    assert agent.metric("edgefleet_agent_moderation_flagged_total", stage="output",
                        category="harassment", action="block") == 2  # fmt: skip


async def sse(response: Any) -> list[Any]:
    events = []
    async for line in response.content:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


async def test_a_buffered_stream_never_sends_the_blocked_window_and_frees_the_slot(
    start: Start,
) -> None:
    secret, key = make_key(block("output", "harassment"))
    agent = await start(key)
    agent.classifier.markers[BAD] = {"harassment": 0.9}
    body = chat("tell me a story", stream=True, stream_options={"include_usage": True},
                max_tokens=200, min_tokens=200)  # fmt: skip
    response = await agent.client.post(CHAT, json=body, headers=bearer(secret))
    assert response.status == 200
    events = await sse(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == PASSED and BAD not in text
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "content_filter" and finishes.count("content_filter") == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 41
    model = agent.registry.text_models[TINY]
    await wait_until(lambda: model.load().running == 0, timeout_s=5, message="slot freed")
    assert agent.pulled[-1] < 200  # cancelled, not run to its end


async def test_an_unbuffered_stream_is_ended_behind_what_it_sent(start: Start) -> None:
    secret, key = make_key(block("output", "harassment", stream_mode="unbuffered"))
    agent = await start(key)
    agent.classifier.markers[BAD] = {"harassment": 0.9}
    body = chat("tell me a story", stream=True, max_tokens=200, min_tokens=200)
    events = await sse(await agent.client.post(CHAT, json=body, headers=bearer(secret)))
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert BAD in text  # sent before its window was checked: it cannot be recalled
    assert chunks[-1]["choices"][0]["finish_reason"] == "content_filter"
    model = agent.registry.text_models[TINY]
    await wait_until(lambda: model.load().running == 0, timeout_s=5, message="slot freed")
    assert agent.pulled[-1] < 200


async def test_a_clean_stream_is_whole(start: Start) -> None:
    secret, key = make_key(block("output", "harassment"))
    agent = await start(key)
    body = chat("tell me a story", stream=True, max_tokens=70, min_tokens=70)
    events = await sse(await agent.client.post(CHAT, json=body, headers=bearer(secret)))
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.split()[:2] == ["t0", "t1"] and len(text.split()) == 70
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    await asyncio.sleep(0)


def test_an_agent_without_keys_applies_the_defaults() -> None:
    from agent.moderation.policy import resolve

    resolved = resolve(None)
    assert resolved == resolve(KeyPolicy())
    assert resolved.input.actions["sexual/minors"][0].value == "block"
    assert {a.value for c, (a, _) in resolved.output.actions.items() if c != "sexual/minors"} == {
        "flag"
    }
    assert not resolved.explicit_block  # so no classifier means no 503 for anyone


async def test_request_records_carry_the_categories_never_the_text(
    start: Start, tmp_path: Path
) -> None:
    blocking_secret, blocking = make_key(block("input", "harassment"))
    flagging_secret, flagging = make_key()
    agent = await start(blocking, flagging)
    agent.classifier.markers["HARASS"] = {"harassment": 0.9}
    agent.classifier.markers[BAD] = {"violence": 0.9}
    log = agent.client.app[REQUEST_LOG].open(tmp_path, "edge-1")
    text = "you are HARASS and a secret phrase"
    for secret in (blocking_secret, flagging_secret):
        await agent.client.post(CHAT, json=chat(text, **LONG), headers=bearer(secret))
    batch = log.batch(0)
    assert batch is not None
    records = msgpack.unpackb(batch[1])
    assert [(r["status"], r["moderation"]) for r in records] == [
        (400, ["input:harassment:block"]),
        (200, ["input:harassment:flag", "output:violence:flag"]),
    ]
    assert b"secret phrase" not in (tmp_path / "requests.spool").read_bytes()
    agent.client.app[REQUEST_LOG].close()


async def test_output_windows_close_at_a_sentence_so_a_bad_one_is_not_diluted() -> None:
    """The heads score a bad sentence inside a long harmless passage far lower: windows
    close at a sentence's end, so the sentence is scored (almost) alone. Injected scores
    that only see the marker in a short text stand for that dilution."""
    from agent.metrics import AgentMetrics
    from agent.moderation import fixed_classifier
    from agent.moderation.gate import ModerationGate

    class Diluted(InjectedClassifier):
        async def classify(self, texts: Sequence[str]) -> list[Verdict]:
            self.calls.append(list(texts))
            return [
                verdict({"harassment": 0.9 if "HARASS" in t and len(t) < 60 else 0.1},
                        THRESHOLDS, COVERED, t, LOW)
                for t in texts
            ]  # fmt: skip

    gate = ModerationGate(fixed_classifier(Diluted()), AgentMetrics())  # type: ignore[arg-type]
    moderation = gate.for_request(key_policy_from_json(block("output", "harassment")))
    assert moderation is not None
    passage = (
        "We open at nine on weekdays and at ten on Saturdays. Park behind the building. "
        "Bring a photo ID to the counter. You are HARASS and I will find you. Bye."
    )
    words = passage.split(" ")

    async def outputs() -> AsyncIterator[GenerationOutput]:
        for i, word in enumerate(words):
            last = i == len(words) - 1
            yield GenerationOutput(f"{word} ", (i,), "stop" if last else None, 5, i + 1)

    for streamed in (True, False):
        seen = [o async for o in moderation.screen(outputs(), streamed=streamed)]
        text = "".join(o.text for o in seen)
        assert text == "We open at nine on weekdays and at ten on Saturdays. Park behind the " \
            "building. Bring a photo ID to the counter. "  # fmt: skip
        assert seen[-1].finish_reason == "content_filter"


async def test_empty_and_fragment_windows_are_not_scored_alone() -> None:
    """A generation often ends with an output whose text is empty or a newline, and a cut
    one with a word or two: the real heads score an empty text 0.8 and 'The' 0.87
    harassment, so every answer that stopped by itself was flagged (test_moderation_
    ordinary_answers has the real heads). A window with no letter or digit is not scored;
    a fragment of fewer than three words only joined to the window before."""
    from agent.metrics import AgentMetrics
    from agent.moderation import fixed_classifier
    from agent.moderation.gate import ModerationGate

    classifier = InjectedClassifier()
    gate = ModerationGate(fixed_classifier(classifier), AgentMetrics())  # type: ignore[arg-type]
    moderation = gate.for_request(None)
    assert moderation is not None
    sentence = ["The ", "capital ", "of ", "Germany ", "is ", "Berlin."]

    async def outputs(pieces: list[str]) -> AsyncIterator[GenerationOutput]:
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            yield GenerationOutput(piece, (i,), "stop" if last else None, 5, i + 1)

    for streamed in (True, False):
        for tail in (["\n", ""], [" It ", "is"]):
            classifier.calls.clear()
            pieces = sentence + tail
            seen = [o async for o in moderation.screen(outputs(pieces), streamed=streamed)]
            assert "".join(o.text for o in seen) == "".join(pieces)
            scored = [t for call in classifier.calls for t in call]
            assert "The capital of Germany is Berlin." in scored
            assert not [t for t in scored if not any(c.isalnum() for c in t)], scored
            if tail[-1] == "is":  # the fragment only after its sentence
                assert scored == ["The capital of Germany is Berlin.",
                                  "The capital of Germany is Berlin. It is"], scored  # fmt: skip
        # an answer with nothing to judge (the model stopped at once) is not scored at all
        for nothing in ([""], ["\n", ""]):
            classifier.calls.clear()
            seen = [o async for o in moderation.screen(outputs(nothing), streamed=streamed)]
            assert seen[-1].finish_reason == "stop" and not classifier.calls
