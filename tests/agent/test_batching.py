"""Continuous batching on the tiny model: equivalence, joining, cancellation, admission."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.engine import continuous_batcher
from agent.engine.continuous_batcher import BatcherConfig
from agent.engine.interface import GenerationOutput, GenerationRequest, SamplingParams, StepStats
from agent.engine.ort_session import SessionConfig
from agent.engine.text_model import OnnxTextModel
from agent.errors import OverloadedError, RequestTimeoutError
from agent.model_loader import load_registry

TINY = "tiny-llama"


async def make_model(artifacts: Path, **config: float) -> OnnxTextModel:
    """The tiny model with its engine started (the test closes it)."""
    registry = load_registry(
        artifacts,
        [TINY],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
        batcher_config=BatcherConfig(**config),  # type: ignore[arg-type]
    )
    model = registry.text_models[TINY]
    assert isinstance(model, OnnxTextModel)
    await model.start()
    return model


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(100, 40000, size=n)] for n in lengths]


async def collect(
    model: OnnxTextModel, prompt: list[int], max_tokens: int = 16, **extra: object
) -> list[GenerationOutput]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    request = GenerationRequest("t", prompt, params, **extra)  # type: ignore[arg-type]
    return [o async for o in model.generate(request)]


def tokens(outs: list[GenerationOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


class Recorder:
    """A batcher listener that keeps what it is told."""

    def __init__(self) -> None:
        self.steps: list[StepStats] = []
        self.reused: list[int] = []

    @property
    def batch_sizes(self) -> list[int]:
        return [s.batch_size for s in self.steps]

    @property
    def prefill_sizes(self) -> list[int]:
        return [s.prefill_tokens for s in self.steps]

    def on_step(self, stats: StepStats) -> None:
        self.steps.append(stats)

    def on_admitted(self, queue_wait_s: float) -> None: ...

    def on_rejected(self, reason: str) -> None: ...

    def on_prefix_reused(self, tokens: int) -> None:
        self.reused.append(tokens)


async def test_batched_greedy_equals_alone_for_mixed_lengths(tiny_artifacts: Path) -> None:
    # a small token budget forces the 150-token prompt through several prefill chunks
    model = await make_model(tiny_artifacts, max_batched_tokens=48)
    ps = prompts([3, 150, 17, 60, 8, 33])
    alone = [tokens(await collect(model, p, 24)) for p in ps]
    together = await asyncio.gather(*(collect(model, p, 24) for p in ps))
    assert [tokens(t) for t in together] == alone
    await model.close()


async def test_request_joins_a_running_batch(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts)
    long_prompt, late_prompt = prompts([20, 40], seed=1)
    expected_late = tokens(await collect(model, late_prompt, 10))
    spy = Recorder()
    model.add_listener(spy)
    first = asyncio.create_task(collect(model, long_prompt, 200))
    await wait_for(lambda: model.engine.running == 1 and len(spy.steps) > 5)
    late = await collect(model, late_prompt, 10)
    assert not first.done()  # the late request finished while the long one ran
    assert tokens(late) == expected_late
    assert 2 in spy.batch_sizes  # they were decoded together
    await first
    await model.close()


async def test_cancelled_sequence_frees_its_slot_within_a_step(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts)
    request = GenerationRequest("c", prompts([10])[0], SamplingParams(max_tokens=400))
    stream = model.generate(request)
    await anext(stream)
    await anext(stream)
    assert model.engine.running == 1
    await stream.aclose()  # what a disconnecting client does
    await wait_for(lambda: model.engine.running == 0, timeout_s=1.0)
    assert model.load().kv_used_tokens == 0
    await model.close()


async def test_full_queue_rejects_at_once_with_retry_after(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, max_running=1, max_queue=1)
    p = prompts([8])[0]
    running = asyncio.create_task(collect(model, p, 300))
    await wait_for(lambda: model.engine.running == 1)
    queued = asyncio.create_task(collect(model, p, 5))
    await wait_for(lambda: model.engine.waiting == 1)
    with pytest.raises(OverloadedError) as info:
        await collect(model, p, 5)
    assert info.value.status == 429 and info.value.retry_after >= 1
    assert info.value.reason == "queue_full"
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert len(tokens(await queued)) == 5
    await model.close()


async def test_higher_priority_is_admitted_first(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, max_running=1)
    p = prompts([8])[0]
    order: list[str] = []

    async def tagged(tag: str, priority: str) -> None:
        await collect(model, p, 3, priority=priority)
        order.append(tag)

    blocker = asyncio.create_task(collect(model, p, 60))
    await wait_for(lambda: model.engine.running == 1)
    low = asyncio.create_task(tagged("low", "low"))
    await wait_for(lambda: model.engine.waiting == 1)
    normal = asyncio.create_task(tagged("normal", "normal"))
    await wait_for(lambda: model.engine.waiting == 2)
    high = asyncio.create_task(tagged("high", "high"))
    await asyncio.gather(blocker, low, normal, high)
    assert order == ["high", "normal", "low"]
    await model.close()


async def test_timeouts_in_queue_and_while_running(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, max_running=1)
    p = prompts([8])[0]
    with pytest.raises(RequestTimeoutError):
        await collect(model, p, 500, timeout_s=0.02)
    blocker = asyncio.create_task(collect(model, p, 200))
    await wait_for(lambda: model.engine.running == 1)
    # the caller's timeout passing in the queue is a timeout (504), not overload (429)
    with pytest.raises(RequestTimeoutError, match="waited in the queue"):
        await collect(model, p, 5, timeout_s=0.05)
    blocker.cancel()
    await asyncio.gather(blocker, return_exceptions=True)
    await model.close()


async def test_max_queue_wait_applies_on_its_own(tiny_artifacts: Path) -> None:
    # the request's own timeout (300 s) is far away: only max_queue_wait_s can reject it
    model = await make_model(tiny_artifacts, max_running=1, max_queue_wait_s=0.05)
    p = prompts([8])[0]
    blocker = asyncio.create_task(collect(model, p, 400))
    await wait_for(lambda: model.engine.running == 1)
    with pytest.raises(OverloadedError) as info:
        await collect(model, p, 5)
    assert info.value.reason == "queue_timeout"
    blocker.cancel()
    await asyncio.gather(blocker, return_exceptions=True)
    await model.close()


async def test_predicted_wait_beyond_deadline_is_rejected_up_front(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, max_running=1)
    p = prompts([8])[0]
    await collect(model, p, 100)  # teaches the batcher how long a sequence takes
    blocker = asyncio.create_task(collect(model, p, 300))
    await wait_for(lambda: model.engine.running == 1)
    queued = [asyncio.create_task(collect(model, p, 100)) for _ in range(3)]
    await wait_for(lambda: model.engine.waiting == 3)
    service = model.engine.predicted_wait_s((1, 10**9))
    assert service > 0
    with pytest.raises(OverloadedError) as info:
        await collect(model, p, 5, timeout_s=service / 2)
    assert info.value.reason == "predicted_wait"
    for task in [blocker, *queued]:
        task.cancel()
    await asyncio.gather(blocker, *queued, return_exceptions=True)
    await model.close()


async def test_short_prompts_prefill_together_with_the_same_output(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, max_batched_tokens=512, prefix_cache_bytes=0)
    ps = prompts([7, 30, 12, 25, 9])
    alone = [tokens(await collect(model, p, 12)) for p in ps]
    spy = Recorder()
    model.add_listener(spy)
    together = await asyncio.gather(*(collect(model, p, 12) for p in ps))
    assert [tokens(t) for t in together] == alone
    assert max(spy.prefill_sizes) > 30  # more than one prompt ran in one step
    await model.close()


async def test_a_slow_prefill_takes_one_short_prompt_per_step(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the measured prefill rate says a group of prompts would make a step longer
    than max_prefill_step_s, each step prefills one (on a 2-core AVX2 CPU Qwen prefills
    62 tokens/s alone or six at once: a group of six delayed every first token by 4 s).
    The rate is measured from the engine's own prefill calls."""
    model = await make_model(tiny_artifacts, max_batched_tokens=512, prefix_cache_bytes=0)
    ps = prompts([7, 30, 12, 25, 9])
    alone = [tokens(await collect(model, p, 12)) for p in ps]
    engine = model._engine
    assert engine is not None
    assert engine._prefill_rate is not None and engine._prefill_rate > 100  # measured
    monkeypatch.setattr(continuous_batcher, "PREFILL_RATE_WEIGHT", 0.0)  # held where set
    engine._prefill_rate = 40.0  # tokens/s: 0.5 s holds 20 tokens, so no two of these
    spy = Recorder()
    model.add_listener(spy)
    together = await asyncio.gather(*(collect(model, p, 12) for p in ps))
    assert [tokens(t) for t in together] == alone
    assert sorted(n for n in spy.prefill_sizes if n) == sorted(len(p) for p in ps)
    await model.close()
    # the limit off: the same prompts go together again
    model = await make_model(
        tiny_artifacts, max_batched_tokens=512, prefix_cache_bytes=0, max_prefill_step_s=0
    )
    engine = model._engine
    assert engine is not None
    engine._prefill_rate = 40.0
    spy = Recorder()
    model.add_listener(spy)
    await asyncio.gather(*(collect(model, p, 12) for p in ps))
    assert max(spy.prefill_sizes) > 30
    await model.close()


async def test_an_engine_yet_to_measure_its_prefill_rate_takes_one_prompt_a_step(
    tiny_artifacts: Path,
) -> None:
    """Issue 26: a model just loaded has measured nothing; grouping every prompt of a cold
    burst in its first step made each first token wait for all of them (eight Qwen2.5-Coder
    chats: 4 s after the load). Its first prefill takes one prompt, the rate is measured
    from it, and the rest group as that rate allows."""
    model = await make_model(tiny_artifacts, max_batched_tokens=512, prefix_cache_bytes=0)
    engine = model._engine
    assert engine is not None and engine.prefill_rate is None
    spy = Recorder()
    model.add_listener(spy)
    ps = prompts([30, 25, 28, 27, 26])
    await asyncio.gather(*(collect(model, p, 8) for p in ps))
    sizes = [n for n in spy.prefill_sizes if n]
    assert sizes[0] == 30  # the first prompt alone
    assert engine.prefill_rate is not None and max(sizes) > 30  # then measured: together
    await model.close()


async def test_shared_prompt_prefix_is_reused_with_the_same_output(tiny_artifacts: Path) -> None:
    shared = prompts([60], seed=5)[0]
    first, second = shared + prompts([9], seed=6)[0], shared + prompts([14], seed=7)[0]
    cold = await make_model(tiny_artifacts, prefix_cache_bytes=0)
    expected = tokens(await collect(cold, second, 16))
    await cold.close()
    model = await make_model(tiny_artifacts, prefix_cache_bytes=8 * 1024 * 1024)
    spy = Recorder()
    model.add_listener(spy)
    await collect(model, first, 4)
    assert tokens(await collect(model, second, 16)) == expected
    assert spy.reused == [48]  # the shared part's whole 16-token blocks were not recomputed
    await model.close()


def test_prefix_cache_keeps_within_its_budget_and_shares_blocks() -> None:
    from agent.engine.prefix_cache import PrefixCache

    def reader(prompt: np.ndarray) -> Callable[[int, int], np.ndarray]:
        # keys/values that remember which token they belong to
        def read(start: int, end: int) -> np.ndarray:
            values = prompt[start:end].astype(np.float32)
            return np.broadcast_to(values[None, None, :, None], (3, 2, end - start, 4)).copy()

        return read

    block_bytes = 3 * 2 * 16 * 4 * 4
    cache = PrefixCache(max_bytes=5 * block_bytes, block_tokens=16)
    a = np.arange(40, dtype=np.int64)  # 2 whole blocks
    assert cache.store(a, reader(a)) == 2
    b = np.concatenate([a[:32], np.arange(900, 920)])  # shares a's 2 blocks, adds 1
    assert cache.store(b, reader(b)) == 1 and len(cache) == 3
    n, kv = cache.lookup(np.concatenate([a[:32], [7, 7, 7]]))
    assert n == 32 and kv is not None and kv.shape == (3, 2, 32, 4)
    np.testing.assert_array_equal(kv[0, 0, :, 0], a[:32])
    # at least two prompt tokens are always left to run
    assert cache.lookup(a[:33])[0] == 16
    # other prompts push the least recently used blocks out, deepest first
    for start in (100, 200):
        p = np.arange(start, start + 32, dtype=np.int64)
        cache.store(p, reader(p))
    assert cache.bytes_used <= cache.max_bytes and len(cache) == 5
    # b's and a's deeper blocks went first; their first block, used most, is still there
    assert cache.lookup(np.concatenate([b[:48], [1, 1]]))[0] == 16
    assert cache.lookup(np.arange(200, 240, dtype=np.int64))[0] == 32
    # a prefix that does not start the same way is never matched
    assert cache.lookup(np.concatenate([[5], a[1:40]]))[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 21, 31])
async def test_random_arrivals_cancellations_and_shared_prefixes_keep_every_output(
    tiny_artifacts: Path, seed: int
) -> None:
    """Slots are rearranged whenever a sequence leaves (and the prompt being prefilled moves
    with them); a randomized mix of arrivals, chunked and grouped prefills, prefix reuse and
    disconnects must leave every surviving sequence's greedy output as it is alone."""
    rng = np.random.default_rng(seed)
    shared = prompts([40], seed=seed + 1)[0]
    jobs: list[tuple[list[int], int, int | None]] = []  # prompt, max_tokens, cancel after
    lengths = [int(n) for n in rng.integers(3, 120, size=28)]
    for i, p in enumerate(prompts(lengths, seed=seed + 2)):
        prompt = shared + p if i % 3 == 0 else p  # a third share a 40-token prefix
        cancel = int(rng.integers(1, 6)) if i % 5 == 0 else None
        jobs.append((prompt, int(rng.integers(4, 40)), cancel))
    cold = await make_model(tiny_artifacts, prefix_cache_bytes=0)
    alone = [tokens(await collect(cold, p, n)) for p, n, _ in jobs]
    await cold.close()

    model = await make_model(
        tiny_artifacts, max_running=5, max_batched_tokens=64, prefix_cache_bytes=1 << 20
    )
    spy = Recorder()
    model.add_listener(spy)

    async def run(i: int) -> list[int] | None:
        prompt, max_tokens, cancel = jobs[i]
        await asyncio.sleep(float(rng.uniform(0, 0.05)))  # arrivals spread over steps
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        stream = model.generate(GenerationRequest(f"r{i}", prompt, params))
        got: list[int] = []
        async for out in stream:
            got.extend(out.token_ids)
            if cancel is not None and len(got) >= cancel:
                await stream.aclose()  # type: ignore[attr-defined]
                return None
        return got

    results = await asyncio.gather(*(run(i) for i in range(len(jobs))))
    for i, got in enumerate(results):
        if got is not None:
            assert got == alone[i], f"request {i} changed in the batch"
    # what the mix exercised: disconnects, prefix reuse, full batches, long prompts chunked
    assert sum(r is None for r in results) >= 1 and spy.reused
    assert max(spy.batch_sizes) == 5 and 64 in spy.prefill_sizes
    await wait_for(lambda: model.load().running == 0)
    assert model.load().kv_used_tokens == 0  # every slot given back
    await model.close()


async def test_kv_use_reports_what_admission_promised(tiny_artifacts: Path) -> None:
    model = await make_model(tiny_artifacts, kv_budget_tokens=1000)
    short, long = prompts([20, 50], seed=40)
    params = SamplingParams(temperature=0.0, max_tokens=80)
    a = model.generate(GenerationRequest("a", short, params))  # reserves 20 + 80
    await anext(a)
    assert model.load().kv_used_fraction == pytest.approx(0.1)
    b = model.generate(GenerationRequest("b", long, params))  # 50 + 80: rows pad to 130
    await anext(b)
    assert model.load().kv_used_fraction == pytest.approx(2 * 130 / 1000)
    # allocated: two rows, padded no further than the longest reach (50 + 80)
    assert 2 * 50 <= model.load().kv_used_tokens <= 2 * 130
    for stream in (a, b):
        await stream.aclose()  # type: ignore[attr-defined]
    await wait_for(lambda: model.load().running == 0)
    assert model.load().kv_used_fraction == 0.0 and model.load().kv_used_tokens == 0
    await model.close()
