"""Memory per model: the key/value cache sized in bytes from the model's bytes per token (the
deprecated token budget converted), growth that stays within it with its transient copy,
and a released session's pages given back (``malloc_trim``) on unload, when the engine
goes idle, and after the rollout self-check."""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
import sys
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent import model_loader
from agent.engine import continuous_batcher, memory
from agent.engine.causal_lm import SlotCache
from agent.engine.continuous_batcher import (
    DEFAULT_KV_CACHE_BYTES,
    BatcherConfig,
    ContinuousBatcher,
)
from agent.engine.interface import GenerationRequest, SamplingParams
from agent.engine.ort_session import SessionConfig
from agent.engine.text_model import OnnxTextModel
from agent.model_loader import load_registry
from agent.model_registry import ModelRegistry

TINY = "tiny-llama"
# tiny-llama: 2 layers x 2 kv heads x head dim 16 x (key, value) x 4-byte floats
TINY_BYTES_PER_TOKEN = 2 * 2 * 16 * 2 * 4


def tiny_model(artifacts: Path, **config: Any) -> OnnxTextModel:
    registry = load_registry(
        artifacts,
        [TINY],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
        batcher_config=BatcherConfig(**config),
    )
    model = registry.text_models[TINY]
    assert isinstance(model, OnnxTextModel)
    return model


async def generate(model: OnnxTextModel, n: int = 6, max_tokens: int = 8) -> None:
    prompt = [int(t) for t in np.random.default_rng(n).integers(100, 40000, size=12)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    async with asyncio.timeout(30):
        async for _ in model.generate(GenerationRequest(f"r{n}", prompt, params)):
            pass


class TrimSpy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.reasons: list[str] = []
        real = memory.trim_heap

        def spy(reason: str = "") -> bool:
            self.reasons.append(reason)
            return real(reason)

        monkeypatch.setattr(module, "trim_heap", spy)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_trim_heap_calls_glibc_malloc_trim() -> None:
    assert memory.trim_heap("test") is True


def test_kv_bytes_per_token_is_layers_heads_dim_key_and_value() -> None:
    assert memory.kv_bytes_per_token(30, 3, 64, 4) == 46080  # SmolLM2-135M, fp32
    assert memory.kv_bytes_per_token(24, 2, 64, 4) == 24576  # Qwen2.5-0.5B, fp32


async def test_the_budget_is_bytes_of_this_model(tiny_artifacts: Path) -> None:
    model = tiny_model(tiny_artifacts)
    engine = model.engine
    tensors = 4  # a key and a value per layer
    assert engine._lm.kv_bytes_per_token == TINY_BYTES_PER_TOKEN
    assert engine.kv_cache_bytes == DEFAULT_KV_CACHE_BYTES
    # the copy while the cache grows is counted: one tensor in T + 1 is kept for it
    expected = DEFAULT_KV_CACHE_BYTES * tensors // (tensors + 1) // TINY_BYTES_PER_TOKEN
    assert engine.kv_budget_tokens == expected
    await model.close()

    small = tiny_model(tiny_artifacts, kv_cache_bytes=5 * 1000 * TINY_BYTES_PER_TOKEN // 4)
    assert small.engine.kv_budget_tokens == 1000
    await small.close()


async def test_deprecated_token_budget_is_converted_with_a_note(
    tiny_artifacts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.model_loader"):
        model = tiny_model(tiny_artifacts, kv_budget_tokens=1000)
    engine = model.engine
    # what admission promises is the old budget, exactly; the bytes include the transient
    assert engine.kv_budget_tokens == 1000
    assert engine.kv_cache_bytes == -(-1000 * TINY_BYTES_PER_TOKEN * 5 // 4)
    (note,) = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert "engine.kv_budget_tokens" in note and f"= {engine.kv_cache_bytes}" in note
    assert f"{TINY_BYTES_PER_TOKEN} bytes a token" in note
    await model.close()


def test_growth_stays_within_the_bytes_with_its_transient_copy() -> None:
    """Rows and capacity grow as admission lets sequences in and lengthen; measured with
    tracemalloc (numpy reports its buffers), the peak never passes ``max_bytes``."""
    heads, dim, tensors = 3, 64, 60  # SmolLM2's shape per tensor
    cache = SlotCache(tensors, heads, dim, np.float32, max_rows=16)
    cache.max_bytes = cache.bytes_for_tokens(4000)
    assert cache.admissible_tokens() == 4000
    assert cache.bytes_per_token == tensors * heads * dim * 4
    steps = [(1, 100), (2, 100), (2, 300), (5, 300), (8, 400), (9, 440), (16, 250)]
    tracemalloc.start()
    try:
        for rows, tokens in steps:
            assert rows * tokens <= 4000  # what admission allows
            if tokens < cache.lengths.max():  # the long ones left; four short ones remain
                cache.lengths[:] = 0
                cache.lengths[:4] = 200
            tracemalloc.reset_peak()
            cache.ensure(rows, tokens)
            _, peak = tracemalloc.get_traced_memory()
            cache.lengths[:rows] = tokens  # what the run then writes
            assert cache.allocated_tokens <= 4000
            assert peak <= cache.max_bytes, (rows, tokens, peak, cache.max_bytes)
            assert cache.rows >= rows and cache.capacity >= tokens
    finally:
        tracemalloc.stop()
    assert cache.rows == 16 and cache.capacity == 250  # exactly what the last step needed


def test_growth_keeps_every_slot() -> None:
    cache = SlotCache(4, 2, 8, np.float32, max_rows=8, max_bytes=1 << 20)
    values = np.random.default_rng(0).standard_normal((4, 2, 20, 8)).astype(np.float32)
    cache.write(0, values)
    cache.write(1, values[:, :, :7] + 1)
    cache.ensure(6, 300)
    assert cache.rows >= 6 and cache.capacity >= 300
    np.testing.assert_array_equal(cache.read(0, 0, 20), values)
    np.testing.assert_array_equal(cache.read(1, 0, 7), values[:, :, :7] + 1)


async def test_unloading_a_model_releases_its_session_and_trims_the_heap(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrimSpy(monkeypatch, continuous_batcher)
    model = tiny_model(tiny_artifacts)
    session = weakref.ref(model.engine._lm._session)
    await model.start()
    await generate(model)
    await model.close()
    gc.collect()
    assert session() is None  # gone although the model object is still referenced
    assert spy.reasons[-1] == "model closed"


async def test_an_idle_engine_gives_its_cache_pages_back(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrimSpy(monkeypatch, continuous_batcher)
    model = tiny_model(tiny_artifacts)
    await model.start()
    await asyncio.gather(*(generate(model, n) for n in range(4)))
    async with asyncio.timeout(5):
        while "engine idle" not in spy.reasons:
            await asyncio.sleep(0.01)
    assert model.load().kv_used_tokens == 0
    assert spy.reasons.count("engine idle") == 1  # once per idle spell, not per wake-up
    await generate(model, 9)
    async with asyncio.timeout(5):
        while spy.reasons.count("engine idle") < 2:
            await asyncio.sleep(0.01)
    await model.close()


def test_the_self_check_trims_after_releasing_its_session(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.sync import self_check
    from models.manifest import load_manifest

    spy = TrimSpy(monkeypatch, self_check)
    directory = tiny_artifacts / TINY
    result = self_check.run_self_check(directory, load_manifest(directory), threads=1, prompts=1)
    assert result.greedy_total == 1
    assert spy.reasons == ["self-check session released"]


def test_the_deprecated_key_loads_and_cannot_be_set_beside_the_new_one() -> None:
    from agent.config import load_config
    from agent.errors import ConfigError

    env = {"EDGEFLEET_AGENT_ENGINE__KV_BUDGET_TOKENS": "4096"}
    batcher = load_config(environ=env).engine.batcher()
    assert (batcher.kv_budget_tokens, batcher.kv_cache_bytes) == (4096, DEFAULT_KV_CACHE_BYTES)
    assert load_config(environ={}).engine.batcher().kv_budget_tokens is None
    with pytest.raises(ConfigError, match="both set"):
        load_config(environ=env, overrides={"engine": {"kv_cache_bytes": 64 << 20}})


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path``."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[2] + head[3]:
                inside = len(head) >= 6 and head[5] == str(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's procfs")
def test_mapped_weights_pages_are_released_and_come_back_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.engine import ort_session
    from models.quantize import finish_llm_graph
    from tests.models.test_models_embedding_8bit import _decoder_graph

    table = np.random.default_rng(3).standard_normal((8192, 128)).astype(np.float32)
    _decoder_graph(tmp_path / "src" / "model.onnx", table)
    finish_llm_graph(tmp_path / "src" / "model.onnx", tmp_path / "out" / "model.onnx")
    model = tmp_path / "out" / "model.onnx"
    data = (tmp_path / "out" / "model.onnx.data").resolve()
    # written a moment ago, as model sync writes an artifact: its pages are dirty in the
    # page cache until written back. MADV_PAGEOUT left such pages mapped (half the table
    # stayed resident in some runs); unmapped with MADV_DONTNEED, they go all the same
    released: list[Path] = []
    real = memory.release_mapped_weights
    monkeypatch.setattr(
        ort_session,
        "release_mapped_weights",
        lambda path, **kw: released.append(path) or real(path, **kw),
    )
    session = ort_session.create_session(model, SessionConfig(intra_op_threads=1))
    assert released == [model]  # loading hands back what it read once

    ids = np.arange(8192, dtype=np.int64)[None, :]
    expected = session.run(None, {"input_ids": ids})
    assert _mapped_kib(data) > 512  # the 1 MiB table was read: resident
    assert memory.release_mapped_weights(model) > 1 << 20  # the whole mapping advised
    assert _mapped_kib(data) < 64  # and its pages gone
    for got, want in zip(session.run(None, {"input_ids": ids}), expected, strict=True):
        np.testing.assert_array_equal(got, want)  # the pages came back from the file
    assert _mapped_kib(data) > 512


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's procfs")
def test_idle_release_keeps_pages_written_in_a_private_mapping(tmp_path: Path) -> None:
    """``keep_cached`` unmaps clean pages (MADV_DONTNEED) but never one written to: on a
    private mapping that would throw the write away and read the file again."""
    import mmap

    model = tmp_path / "model.onnx"
    data = tmp_path / "model.onnx.data"
    data.write_bytes(b"\x01" * (64 << 10))
    with open(data, "rb") as fh:
        clean = mmap.mmap(fh.fileno(), 32 << 10, access=mmap.ACCESS_READ)
        written = mmap.mmap(fh.fileno(), 32 << 10, access=mmap.ACCESS_COPY, offset=32 << 10)
    try:
        assert sum(clean[:]) == 32 << 10  # every page read: resident
        written[0] = 7  # a private copy of this page
        assert _mapped_kib(data.resolve()) >= 32 + 4
        assert memory.release_mapped_weights(model, keep_cached=True) == 64 << 10
        assert written[0] == 7  # the written page kept (MADV_PAGEOUT for its mapping)
        assert _mapped_kib(data.resolve()) < 32  # the clean mapping's pages unmapped
        assert clean[100] == 1  # and back from the file when read
    finally:
        clean.close()
        written.close()


async def test_an_idle_engine_releases_its_mapped_weights_once_per_quiet_spell(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[float] = []
    monkeypatch.setattr(
        model_loader, "release_mapped_weights", lambda *a, **k: released.append(time.monotonic())
    )
    model = tiny_model(tiny_artifacts, idle_release_s=0.5)
    await model.start()
    try:
        for n in range(3):  # back to back: gaps far shorter than idle_release_s
            await generate(model, n)
        finished = time.monotonic()
        assert released == []
        async with asyncio.timeout(5):
            while not released:
                await asyncio.sleep(0.02)
        assert released[0] - finished >= 0.45
        await asyncio.sleep(1.2)
        assert len(released) == 1  # idle on: nothing more to release
        await generate(model, 7)
        async with asyncio.timeout(5):
            while len(released) < 2:
                await asyncio.sleep(0.02)
    finally:
        await model.close()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's procfs")
async def test_smollm2_embedding_pages_are_unmapped_when_idle_and_replies_unchanged(
    real_artifacts: Path,
) -> None:
    """The 8-bit token embedding is read row by row from the mapped file: serving maps its
    pages back (16 at a fault), and an idle engine unmaps them again; the next reply is
    the same."""
    name = "smollm2-135m-instruct"
    registry = load_registry(
        real_artifacts,
        [name],
        session_config=SessionConfig(intra_op_threads=2),
        max_context_tokens=2048,
        batcher_config=BatcherConfig(idle_release_s=0.5, prefix_cache_bytes=0),
    )
    model = registry.text_models[name]
    data = (real_artifacts / name / "model.onnx.data").resolve()
    prompt = model.encode("List ten fruits, ten countries and ten colours, one per line.")

    async def reply() -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=48)
        tokens: list[int] = []
        async with asyncio.timeout(60):
            async for out in model.generate(GenerationRequest("r", prompt, params)):
                tokens.extend(out.token_ids)
        return tokens

    await model.start()
    try:
        first = await reply()
        mapped = _mapped_kib(data)
        assert mapped > 1024, mapped  # serving mapped embedding pages back in
        async with asyncio.timeout(10):
            while _mapped_kib(data) > 64:
                await asyncio.sleep(0.05)
        assert await reply() == first
    finally:
        await model.close()


async def test_an_unload_frees_the_session_on_a_worker_thread_while_the_loop_serves(
    make_tiny_registry: Callable[[], ModelRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: an unload frees the session and caches (half a gigabyte for Qwen, tens of
    milliseconds) on a worker thread, never on the event loop, which keeps serving; the
    unload returns once the memory is freed (the next load's footprint is measured as the
    resident set's change across it)."""
    freeing = threading.Event()
    threads: list[str] = []
    real = ContinuousBatcher._free_memory

    def slow_free(self: ContinuousBatcher, trim: bool) -> None:
        threads.append(threading.current_thread().name)
        assert freeing.wait(10)
        real(self, trim)

    monkeypatch.setattr(ContinuousBatcher, "_free_memory", slow_free)
    registry = make_tiny_registry()
    model = registry.text_models[TINY]
    await registry.start()
    engine = model.engine
    unloading = asyncio.ensure_future(model.detach_heavy())
    ticks = 0
    for _ in range(10):  # the loop runs while the free is held
        await asyncio.sleep(0.02)
        ticks += 1
    assert ticks == 10 and not unloading.done()  # returns only once freed
    assert engine._lm._session is not None
    freeing.set()
    await asyncio.wait_for(unloading, 10)
    assert engine._lm._session is None
    assert threads and threads[0] != threading.main_thread().name
    await registry.close()


_ARENAS_SCRIPT = """
import ctypes, sys, threading
from agent.engine.memory import limit_malloc_arenas
print(limit_malloc_arenas(int(sys.argv[1])))
blocks = []
def allocate():
    blocks.append(ctypes.create_string_buffer(1 << 20))  # malloc'd on this thread
threads = [threading.Thread(target=allocate) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.parametrize("arenas", [1, 2, 0])
def test_the_agents_threads_share_the_malloc_arenas_it_allows(arenas: int) -> None:
    """Issue 26: the agent can cap glibc's malloc arenas (engine.malloc_arenas; 0 by
    default, glibc's own): threads allocating at once then share those heaps, where glibc
    gives each its own (up to 8 per core)."""
    import subprocess

    if memory._glibc_function("mallopt") is None:
        pytest.fail("this test needs glibc, as every agent image has")
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS_SCRIPT, str(arenas)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    count = done.stderr.count("Arena ")
    if arenas:
        assert done.stdout.strip() == "True" and count == arenas, done.stderr
    else:  # glibc's default: threads allocating at once get arenas of their own
        assert done.stdout.strip() == "False" and count > 1, done.stderr


def _managed_tiny_registry(tiny_artifacts: Path) -> ModelRegistry:
    """The tiny model loaded by a residency (on demand, by its loader)."""
    from agent.engine.residency import ResidencyConfig

    return load_registry(
        tiny_artifacts,
        [TINY],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=256,
        residency=ResidencyConfig(budget_bytes=1 << 30),
    )


async def test_a_lazy_model_runs_its_first_token_on_the_loader_only_when_asked(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a load beside a serving model runs the session's first token on the
    loader's thread (``build_heavy(warm_up=True)``); a swap leaves it to the engine's
    warm-up step (one run, not two: 20-30 ms of SmolLM2's load)."""
    from agent.engine.causal_lm import CausalLM

    runs: list[str] = []
    real = CausalLM.warm_up
    monkeypatch.setattr(CausalLM, "warm_up", lambda lm: runs.append("loader") or real(lm))
    registry = _managed_tiny_registry(tiny_artifacts)
    model = registry.text_models[TINY]
    assert isinstance(model, OnnxTextModel)
    for warm, expected in ((False, []), (True, ["loader"])):
        engine = model.build_heavy(warm_up=warm)
        assert runs == expected
        assert isinstance(engine, continuous_batcher.ContinuousBatcher)
        await engine.close()
    # a model started serving during a build without it: its first token after the build,
    # on a loader's thread
    ran: list[str] = []
    real_run = CausalLM.run
    monkeypatch.setattr(
        CausalLM, "run", lambda self, *a, **k: ran.append("run") or real_run(self, *a, **k)
    )
    engine = model.build_heavy(warm_up=False)
    assert ran == []
    await asyncio.to_thread(model.warm_heavy, engine)
    assert ran == ["run"]
    assert isinstance(engine, continuous_batcher.ContinuousBatcher)
    await engine.close()


async def test_an_unload_can_hand_its_free_to_the_caller(
    make_tiny_registry: Callable[[], ModelRegistry],
) -> None:
    """Issue 26: ``detach_heavy(free=False)`` returns once the engine stops serving, with
    the session still allocated, and the call it returns frees it (the residency runs it
    beside the next model's build)."""
    registry = make_tiny_registry()
    model = registry.text_models[TINY]
    await registry.start()
    engine = model.engine
    free = await model.detach_heavy(free=False)
    assert not model.loaded and free is not None
    assert engine._lm._session is not None  # not freed yet
    await asyncio.to_thread(free)
    assert engine._lm._session is None
    await registry.close()


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs Linux's procfs")
def test_written_pages_are_found_from_the_pagemap_as_smaps_shows_them(tmp_path: Path) -> None:
    """Which mappings of a model's data hold a written page is read from /proc/self/maps
    and the pagemap of those mappings only (a few ms; smaps walks every page of the
    process, 12-25 ms a release with Qwen loaded), and agrees with smaps' Anonymous."""
    import mmap

    data = tmp_path / "model.onnx.data"
    data.write_bytes(b"\x01" * (96 << 10))
    with open(data, "rb") as fh:
        clean = mmap.mmap(fh.fileno(), 32 << 10, access=mmap.ACCESS_READ)
        copy_read = mmap.mmap(fh.fileno(), 32 << 10, access=mmap.ACCESS_COPY, offset=32 << 10)
        written = mmap.mmap(fh.fileno(), 32 << 10, access=mmap.ACCESS_COPY, offset=64 << 10)
    try:
        assert sum(clean[:]) + sum(copy_read[:]) == 64 << 10  # read: resident, not written
        written[5000] = 7  # the mapping's second page copied
        names = {str(data), str(data.resolve())}
        found = memory._mappings_of(names)
        assert sorted(w for _, _, w in found) == [False, False, True]
        assert found == memory._mappings_from_smaps(names)
    finally:
        clean.close()
        copy_read.close()
        written.close()


async def test_a_model_loaded_with_nothing_serving_takes_one_first_run_as_a_step(
    tiny_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a new session's first run (it pages in and sets up what loading did not:
    50-100 ms for Qwen2.5-Coder) is the engine's warm-up step when no other model serves,
    the one run of the load (a load beside a serving model makes it on the loader's
    thread instead: see the test above and the residency's)."""
    from agent.engine.causal_lm import CausalLM

    runs: list[str] = []
    real = CausalLM.run

    def run(self: CausalLM, *args: Any, **kwargs: Any) -> Any:
        runs.append(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CausalLM, "run", run)
    registry = _managed_tiny_registry(tiny_artifacts)
    await registry.start()  # loads it: it fits the budget
    try:
        assert registry.residency is not None and registry.residency.state(TINY) == "loaded"
        assert len(runs) == 1 and runs[0].startswith("ort-steps"), runs
        # a reload goes on from the prefill rate the last engine measured (an engine yet to
        # measure one prefills a prompt a step)
        model = registry.text_models[TINY]
        assert isinstance(model, OnnxTextModel)
        model.engine.prefill_rate = 1234.0
        await registry.residency.unload(TINY)
        await registry.residency.load(TINY)
        assert model.engine.prefill_rate == 1234.0
    finally:
        await registry.close()


async def test_a_model_built_at_once_comes_with_its_measured_footprint(
    tiny_artifacts: Path,
) -> None:
    """Issue 26: a model a rollout (or an agent without a budget) builds at once is measured
    as a load is (the C heap's bytes in use across the build), and the residency counts that
    instead of its files' size: the dashboard said Qwen2.5-Coder had 549 MiB in memory (its
    files) where its loads measure 451."""
    from agent.engine.continuous_batcher import BatcherConfig
    from agent.engine.residency import Residency, ResidencyConfig
    from agent.model_loader import read_manifest

    if memory.heap_in_use() is None:
        pytest.fail("this test needs glibc 2.33 or later (mallinfo2), as every image has")
    directory = tiny_artifacts / TINY
    manifest = read_manifest(directory, verify=False)
    model = model_loader.load_text_model(
        directory, manifest, SessionConfig(intra_op_threads=1), 256, BatcherConfig()
    )
    assert model.loaded and model.measured_bytes is not None
    assert model.predicted_bytes // 4 < model.measured_bytes != model.predicted_bytes
    residency = Residency(ResidencyConfig(budget_bytes=1 << 30))
    ModelRegistry({TINY: model}, {}, residency=residency)
    (slot,) = residency.snapshot()
    assert slot["state"] == "loaded" and slot["resident_bytes"] == model.measured_bytes
    await model.close()
