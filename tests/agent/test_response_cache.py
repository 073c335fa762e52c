"""The exact-match response cache: LRU under a byte budget, and what goes into its key."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from agent.api.serving_common import cache_fields
from agent.engine.interface import GenerationRequest, SamplingParams
from agent.model_registry import ModelRegistry
from agent.response_cache import CachedGeneration, ResponseCache, cache_key


def entry(text: str) -> CachedGeneration:
    return CachedGeneration(text, (1, 2, 3), "stop", 10, 3)


def test_round_trip_and_key_ignores_field_order() -> None:
    cache = ResponseCache(10_000)
    a = cache_key("m", "v1", "chat", {"x": 1, "y": [1, 2]})
    b = cache_key("m", "v1", "chat", {"y": [1, 2], "x": 1})
    assert a == b
    cache.put(a, entry("hello"))
    assert cache.get(b) == entry("hello")


def test_other_version_or_request_misses() -> None:
    cache = ResponseCache(10_000)
    cache.put(cache_key("m", "v1", "chat", {"x": 1}), entry("hello"))
    assert cache.get(cache_key("m", "v2", "chat", {"x": 1})) is None
    assert cache.get(cache_key("m", "v1", "chat", {"x": 2})) is None


def test_lru_eviction_under_byte_budget() -> None:
    probe = ResponseCache(10_000)
    probe.put(cache_key("m", "v", "e", {}), entry("x"))
    cache = ResponseCache(3 * probe.bytes_used)  # room for exactly three entries
    keys = [cache_key("m", "v", "e", {"i": i}) for i in range(4)]
    for k in keys[:3]:
        cache.put(k, entry("x"))
    assert cache.get(keys[0]) is not None  # 0 is now the most recently used
    cache.put(keys[3], entry("x"))
    assert cache.get(keys[1]) is None  # the least recently used went
    assert cache.get(keys[0]) is not None
    assert cache.bytes_used <= cache.max_bytes


def test_entry_larger_than_budget_is_not_stored() -> None:
    cache = ResponseCache(100)
    cache.put(cache_key("m", "v", "e", {}), entry("x" * 1000))
    assert len(cache) == 0


# --- what goes into the key --------------------------------------------------------------

BASE = GenerationRequest("r1", [1, 2, 3], SamplingParams(temperature=0.7, seed=1))
OTHER_VALUES = {
    "temperature": 0.0,
    "top_p": 0.5,
    "top_k": 5,
    "seed": 2,
    "max_tokens": 9,
    "stop": ("x",),
    "min_tokens": 1,
}


def _key(request: GenerationRequest, version: str = "v1") -> bytes:
    return cache_key("m", version, "chat", cache_fields(request))


def test_every_sampling_field_changes_the_key() -> None:
    # a field added to SamplingParams without a value here fails this test: decide its key
    assert {f.name for f in dataclasses.fields(SamplingParams)} == set(OTHER_VALUES)
    for name, value in OTHER_VALUES.items():
        changed = dataclasses.replace(
            BASE, params=dataclasses.replace(BASE.params, **{name: value})
        )
        assert _key(changed) != _key(BASE), name


@pytest.mark.parametrize(
    "change",
    [
        {"prompt_token_ids": [1, 2, 4]},
        {"continuation_token_ids": (7,)},
        # the same ids split differently between prompt and continuation
        {"prompt_token_ids": [1, 2], "continuation_token_ids": (3,)},
    ],
    ids=["prompt", "continuation", "prompt/continuation split"],
)
def test_prompt_and_continuation_change_the_key(change: dict[str, object]) -> None:
    assert _key(dataclasses.replace(BASE, **change)) != _key(BASE)  # type: ignore[arg-type]


def test_scheduling_fields_do_not_change_the_key() -> None:
    same = dataclasses.replace(BASE, request_id="r2", priority="high", timeout_s=3.0)
    assert _key(same) == _key(BASE)


def test_model_version_changes_the_key() -> None:
    assert _key(BASE, "fp32-aaaaaaaaaaaa") != _key(BASE, "fp32-bbbbbbbbbbbb")


async def test_after_a_hot_swap_the_old_versions_answers_never_come_back(
    make_tiny_registry: Callable[[], ModelRegistry],
) -> None:
    """Two registries serving the same model id at two versions share one cache (as an
    agent's registry does across a swap): the new version misses, then hits its own."""
    from agent.api.protocol import ChatCompletionRequest
    from agent.api.serving_chat import ChatService
    from agent.api.serving_common import GenerationLimits, GenerationRunner, RequestOptions
    from agent.engine.text_model import OnnxTextModel
    from agent.metrics import AgentMetrics

    old_registry = make_tiny_registry()
    await old_registry.start()
    old = old_registry.text_model("tiny-llama")
    assert isinstance(old, OnnxTextModel)
    swapped = OnnxTextModel(
        model_id=old.model_id,
        version=old.version[:-12] + "f" * 12,
        context_length=old.context_length,
        codec=old._codec,
        engine=old.engine,
    )
    new_registry = ModelRegistry(text_models={old.model_id: swapped}, embedding_models={})
    runner = GenerationRunner(AgentMetrics(), ResponseCache(1 << 20))
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 4, "temperature": 0}
    )  # fmt: skip
    before = ChatService(old_registry, GenerationLimits(), runner)
    after = ChatService(new_registry, GenerationLimits(), runner)
    first = await before.prepare(body, RequestOptions())
    assert first.cache_status == "miss"
    answer = await before.complete(first)
    assert (await before.prepare(body, RequestOptions())).cache_status == "hit"
    swapped_first = await after.prepare(body, RequestOptions())
    assert swapped_first.cache_status == "miss"
    again = await after.complete(swapped_first)
    assert again.system_fingerprint == swapped.version != answer.system_fingerprint
    assert (await after.prepare(body, RequestOptions())).cache_status == "hit"
    await old_registry.close()
