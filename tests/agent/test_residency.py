"""The residency: text models loaded on demand within a memory budget, unloaded when idle
past their keep-alive or for room (least recently used, unpinned, idle, loaded long
enough), one load at a time off the event loop, failures not retried in a loop.

These drive :class:`Residency` with models whose heavy part is a stand-in (its build can
be held or made to fail); ``test_model_residency_e2e`` does the same with real models."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent.engine import step_cores
from agent.engine.residency import (
    DEFAULT_EXPECTED_LOAD_S,
    LOADER_NICE,
    MIN_EXPECTED_LOAD_S,
    ModelLoadFailedError,
    ModelState,
    ModelUnavailableError,
    Residency,
    ResidencyConfig,
    parse_keep_alive,
)
from agent.errors import InvalidRequestError

MiB = 1 << 20


class FakeModel:
    def __init__(self, name: str, version: str = "v1") -> None:
        self.model_id = name
        self.version = version
        self.builds = 0
        self.detached = 0
        self.hold = threading.Event()
        self.hold.set()
        self.fail: str | None = None
        self.running = 0
        self.heavy: object | None = None
        self.trims: list[bool] = []  # each detach: whether it trimmed the heap
        self.warmed_on_loader: list[bool] = []  # each build: warm_up asked of it
        self.warmed_after_build = 0
        self.freed = 0  # detaches whose memory was freed
        self.freed_on: list[str] = []  # the threads that freed it, when not in the detach
        self.free_hold = threading.Event()  # a free returned to the residency waits for it
        self.free_hold.set()

    def build_heavy(self, *, warm_up: bool = True) -> object:
        self.builds += 1
        self.warmed_on_loader.append(warm_up)
        assert self.hold.wait(10)
        if self.fail:
            raise RuntimeError(self.fail)
        return object()

    def warm_heavy(self, heavy: object) -> None:
        self.warmed_after_build += 1  # the first token on a loader's thread, after the build

    async def attach_heavy(self, heavy: object) -> None:
        self.heavy = heavy

    async def warm_up(self) -> None:
        pass

    async def detach_heavy(
        self, *, trim: bool = True, free: bool = True
    ) -> Callable[[], None] | None:
        self.heavy = None
        self.detached += 1
        self.trims.append(trim)
        if free:
            self.freed += 1
            return None

        def free_now() -> None:  # run by the residency, beside the next build
            assert self.free_hold.wait(10)
            self.freed += 1
            self.freed_on.append(threading.current_thread().name)

        return free_now

    def busy(self) -> int:
        return self.running


def residency(**overrides: object) -> Residency:
    config: dict[str, object] = {
        "budget_bytes": 100 * MiB,
        "keep_alive_s": 60.0,
        "min_residency_s": 0.0,
        "room_wait_s": 0.5,
        "failed_retry_s": 0.5,
    }
    config.update(overrides)
    return Residency(ResidencyConfig(**config), rss=lambda: 0)  # type: ignore[arg-type]


def add(r: Residency, name: str, mib: int, *, loaded: bool = False) -> FakeModel:
    model = FakeModel(name)
    r.register(model, predicted_bytes=mib * MiB, reserve_bytes=0, loaded=loaded)
    if loaded:
        model.heavy = object()
    return model


async def test_concurrent_requests_for_an_unloaded_model_share_one_load() -> None:
    r = residency()
    a = add(r, "a", 40)
    assert r.state("a") is ModelState.AVAILABLE
    await asyncio.gather(*(r.acquire("a") for _ in range(5)))
    assert a.builds == 1 and a.heavy is not None
    assert r.state("a") is ModelState.LOADED
    assert r.committed_bytes() == 40 * MiB
    await r.close()


async def test_room_is_made_from_the_least_recently_used_idle_model_only() -> None:
    r = residency(budget_bytes=100 * MiB)
    a, b = add(r, "a", 40, loaded=True), add(r, "b", 40, loaded=True)
    await r.acquire("b")
    r.release("b")  # b used after a: a is the least recently used
    c = add(r, "c", 40)
    await r.acquire("c")
    assert (a.detached, b.detached, c.builds) == (1, 0, 1)
    assert [r.state(m) for m in "abc"] == ["available", "loaded", "loaded"]
    await r.close()


async def test_a_busy_or_pinned_model_is_never_evicted_and_the_newcomer_gets_503() -> None:
    r = residency(budget_bytes=100 * MiB, pinned=frozenset({"p"}))
    add(r, "p", 40, loaded=True)  # pinned
    busy = add(r, "busy", 30)
    await r.acquire("busy")  # loaded and held by a request
    newcomer = add(r, "n", 40)
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as raised:
        await r.acquire("n")
    assert raised.value.status == 503 and raised.value.reason == "no_room"
    assert time.monotonic() - started >= 0.45  # it waited room_wait_s for one to go idle
    assert newcomer.builds == 0 and busy.detached == 0
    assert r.state("n") is ModelState.AVAILABLE  # nothing wrong with it: not "failed"
    r.release("busy")
    await r.acquire("n")  # room now: the idle one goes
    assert busy.detached == 1 and r.state("p") is ModelState.LOADED
    await r.close()


async def test_a_model_loaded_too_recently_is_kept_for_its_minimum_residency() -> None:
    r = residency(budget_bytes=60 * MiB, min_residency_s=0.4, room_wait_s=2.0)
    a = add(r, "a", 40)
    await r.acquire("a")
    r.release("a")
    add(r, "b", 40)
    started = time.monotonic()
    await r.acquire("b")  # waits until a has been loaded 0.4 s, then evicts it
    assert a.detached == 1 and time.monotonic() - started >= 0.3
    await r.close()


async def test_a_load_waits_when_it_alone_exceeds_the_budget_nothing_and_says_so() -> None:
    r = residency(budget_bytes=50 * MiB)
    add(r, "small", 10, loaded=True)
    big = add(r, "big", 60)
    with pytest.raises(ModelUnavailableError, match="more than the whole memory budget"):
        await r.acquire("big")
    assert big.builds == 0 and r.state("small") is ModelState.LOADED
    await r.close()


async def test_max_loaded_counts_models_not_bytes() -> None:
    r = residency(budget_bytes=1000 * MiB, max_loaded=1)
    a = add(r, "a", 10, loaded=True)
    add(r, "b", 10)
    await r.acquire("b")
    assert a.detached == 1 and r.state("b") is ModelState.LOADED
    await r.close()


async def test_idle_models_go_after_their_keep_alive_and_pinned_ones_never() -> None:
    r = residency(keep_alive_s=0.3, pinned=frozenset({"p"}))
    a = add(r, "a", 10)
    p = add(r, "p", 10)
    await r.acquire("a")
    await r.load("p", "pinned")
    r.release("a")
    assert await r.expire_idle() == []  # not yet
    await asyncio.sleep(0.35)
    assert await r.expire_idle() == ["a"]
    assert a.detached == 1 and p.detached == 0 and r.state("p") is ModelState.LOADED
    await r.close()


async def test_a_requests_keep_alive_extends_the_stay_never_shortens_it_and_is_capped() -> None:
    r = residency(keep_alive_s=0.2, max_request_keep_alive_s=0.5)
    add(r, "a", 10)
    await r.acquire("a", keep_alive_s=3600)  # capped at 0.5 s
    r.release("a")
    await r.acquire("a", keep_alive_s=0.0)  # cannot shorten another request's stay
    r.release("a")
    await asyncio.sleep(0.3)
    assert await r.expire_idle() == []  # the default 0.2 s has passed, the request's not
    await asyncio.sleep(0.3)
    assert await r.expire_idle() == ["a"]
    await r.close()


async def test_a_failed_load_fails_its_waiters_and_is_not_retried_in_a_loop() -> None:
    r = residency(failed_retry_s=0.4)
    a = add(r, "a", 10)
    a.fail = "weights file truncated"
    results = await asyncio.gather(*(r.acquire("a") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(x, ModelLoadFailedError) for x in results), results
    assert "weights file truncated" in str(results[0]) and a.builds == 1
    assert r.state("a") is ModelState.FAILED
    with pytest.raises(ModelLoadFailedError) as raised:  # at once, without a new try
        await r.acquire("a")
    assert a.builds == 1 and raised.value.retry_after > 0
    await asyncio.sleep(0.45)
    a.fail = None
    await r.acquire("a")  # after failed_retry_s, on demand, it is tried again
    assert a.builds == 2 and r.state("a") is ModelState.LOADED
    await r.close()


async def test_requests_for_a_loaded_model_never_wait_behind_a_load() -> None:
    r = residency()
    add(r, "warm", 10, loaded=True)
    cold = add(r, "cold", 10)
    cold.hold.clear()  # its build blocks on the loader's thread
    waiting = asyncio.create_task(r.acquire("cold"))
    await asyncio.sleep(0.1)
    assert r.state("cold") is ModelState.LOADING
    started = time.monotonic()
    await asyncio.wait_for(r.acquire("warm"), 0.05)
    assert time.monotonic() - started < 0.05
    cold.hold.set()
    await waiting
    await r.close()


async def test_a_request_waits_at_most_its_deadline_and_the_queue_is_bounded() -> None:
    r = residency(max_waiting=2)
    cold = add(r, "cold", 10)
    cold.hold.clear()
    with pytest.raises(ModelUnavailableError) as raised:
        await r.acquire("cold", timeout_s=0.1)
    assert raised.value.reason == "load_timeout" and raised.value.retry_after > 0
    waiters = [asyncio.create_task(r.acquire("cold")) for _ in range(2)]
    await asyncio.sleep(0.05)
    with pytest.raises(ModelUnavailableError) as full:
        await r.acquire("cold")
    assert full.value.reason == "queue_full"
    cold.hold.set()
    await asyncio.gather(*waiters)  # the load went on for those still waiting
    assert cold.builds == 1
    await r.close()


async def test_the_footprint_is_measured_across_load_and_replaces_the_prediction() -> None:
    rss = iter([100 * MiB, 125 * MiB])
    r = Residency(  # without the heap's gauge (a C library other than glibc)
        ResidencyConfig(budget_bytes=1 << 30), rss=lambda: next(rss), heap=lambda: None
    )
    model = FakeModel("a")
    r.register(model, predicted_bytes=40 * MiB, reserve_bytes=8 * MiB, loaded=False)
    await r.acquire("a")
    (slot,) = r.snapshot()
    assert slot["resident_bytes"] == 25 * MiB  # measured, not the files' 40
    assert r.committed_bytes() == 33 * MiB  # weights plus its caches
    r.reserve_for(100 * MiB)
    with pytest.raises(ModelUnavailableError):
        r.reserve_for(1 << 30)  # a rollout's copy beyond the budget
    await r.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), (1.5, 1.5), ("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
     ("250ms", 0.25), ("-1", -1.0), ("-1m", -60.0), (0, 0.0)],
)  # fmt: skip
def test_keep_alive_accepts_ollamas_forms(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize(
    "value", ["", "5x", "m", "5m3", True, None, [5], {"s": 1}, "9" * 40, float("nan"), 1e300]
)
def test_keep_alive_refuses_anything_else(value: object) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_keep_alive(value)
    assert raised.value.param == "keep_alive"


def test_a_model_that_cannot_load_here_now_may_be_forwarded_like_one_not_here() -> None:
    from types import SimpleNamespace

    from agent.overflow.hook import forward_reason

    service: Any = SimpleNamespace(forward_reasons=frozenset({"model_not_loaded"}))
    for exc in (
        ModelUnavailableError("no room", retry_after=1, reason="no_room"),
        ModelLoadFailedError("truncated", retry_after=1),
    ):
        assert forward_reason(service, exc) == "model_not_loaded"
    assert forward_reason(SimpleNamespace(forward_reasons=frozenset()), exc) is None  # type: ignore[arg-type]


def test_the_default_budget_is_a_share_of_the_cgroup_limit_or_the_machines_memory() -> None:
    from pathlib import Path

    import psutil  # type: ignore[import-untyped, unused-ignore]

    from agent.config import load_config
    from agent.engine.residency import default_budget_bytes

    limit = psutil.virtual_memory().total
    cgroup = Path("/sys/fs/cgroup/memory.max")
    if cgroup.exists() and cgroup.read_text().strip() != "max":
        limit = min(limit, int(cgroup.read_text()))
    assert abs(default_budget_bytes(0.5) - limit // 2) <= 4096
    config = load_config(environ={"EDGEFLEET_AGENT_RESIDENCY__BUDGET_SHARE": "0.25"})
    assert abs(config.residency.resolved().budget_bytes - limit // 4) <= 4096
    pinned = load_config(environ={"EDGEFLEET_AGENT_RESIDENCY__PINNED": "a,b"}).residency
    assert pinned.resolved().pinned == frozenset({"a", "b"})


async def test_what_is_committed_never_exceeds_the_budget_while_a_model_swaps() -> None:
    r = residency(budget_bytes=100 * MiB)
    old = add(r, "old", 70, loaded=True)
    new = add(r, "new", 70)
    new.hold.clear()  # the newcomer's build waits, its room made
    seen: list[int] = []

    async def slow_detach(*, trim: bool = True, free: bool = True) -> None:  # slow to let go
        for _ in range(5):
            seen.append(r.committed_bytes())
            await asyncio.sleep(0.01)
        old.heavy = None

    old.detach_heavy = slow_detach  # type: ignore[method-assign]
    loading = asyncio.create_task(r.acquire("new"))
    for _ in range(20):
        seen.append(r.committed_bytes())
        await asyncio.sleep(0.01)
    assert r.state("new") is ModelState.LOADING
    new.hold.set()
    await loading
    seen.append(r.committed_bytes())
    assert max(seen) <= 100 * MiB, [s >> 20 for s in seen]
    assert seen[-1] == 70 * MiB and 70 * MiB in seen[:-1]  # the newcomer counted while loading
    await r.close()


async def test_pins_by_target_or_request_hold_a_model_until_taken_back() -> None:
    """A target's pin keeps a model through idleness and room-making until the target
    says on demand again; a request's pin ends with an operator's unload; a new version
    of the model keeps both."""
    r = residency(budget_bytes=30 * MiB, keep_alive_s=0.2)
    t = add(r, "t", 10, loaded=True)
    q = add(r, "q", 10, loaded=True)
    r.set_pinned("t", "target", True)
    r.set_pinned("q", "request", True)
    await asyncio.sleep(0.25)
    assert await r.expire_idle() == []  # both past keep-alive, both pinned
    add(r, "n", 20)
    with pytest.raises(ModelUnavailableError):  # no room: both pinned
        await r.acquire("n", timeout_s=2)
    assert (t.detached, q.detached) == (0, 0)
    r.register(FakeModel("t", "v2"), predicted_bytes=10 * MiB, reserve_bytes=0, loaded=True)
    assert r.snapshot()[-1]["pinned"] is True  # the new version of t is still pinned
    r.set_pinned("t", "target", False)
    assert await r.unload("q")
    assert r.snapshot()[1]["pinned"] is False  # the request's pin went with the unload
    await asyncio.sleep(0.25)
    assert await r.expire_idle() == ["t"]
    await r.close()


async def test_a_load_command_for_a_loaded_model_restarts_its_keep_alive() -> None:
    """How the coordinator keeps a model warm through a quiet stretch: LOAD_MODEL for a
    model in memory loads nothing and starts its keep-alive again from now."""
    r = residency(keep_alive_s=0.3)
    a = add(r, "a", 10)
    await r.load("a")
    await asyncio.sleep(0.2)
    await r.load("a")  # restarted: 0.3 s from now
    await asyncio.sleep(0.2)
    assert await r.expire_idle() == []
    assert a.builds == 1
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["a"]
    await r.close()


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's nice is Linux's")
async def test_a_load_yields_the_cores_only_while_another_model_serves() -> None:
    """A load runs at the agent's priority while nothing else needs the cores (a swap: its
    requests wait for it, and a niced loader is starved by anything else on the box),
    and steps back to nice 10 from the moment a loaded model serves: at its start, or
    when a request for a loaded model arrives during it."""
    r = residency()
    warm = add(r, "warm", 10, loaded=True)
    cold = add(r, "cold", 10)
    seen: list[int] = []
    real_build = cold.build_heavy

    def build(*, warm_up: bool = True) -> object:
        seen.append(_nice())
        heavy = real_build(warm_up=warm_up)  # held until the test lets it go
        seen.append(_nice())
        return heavy

    cold.build_heavy = build  # type: ignore[method-assign]
    cold.hold.clear()
    loading = asyncio.create_task(r.acquire("cold"))
    await asyncio.sleep(0.1)
    assert seen == [_nice()]  # nothing serving: the agent's own priority
    await r.acquire("warm")  # a request for the loaded model, beside the load
    cold.hold.set()
    await loading
    assert seen[1] == LOADER_NICE
    r.release("warm")
    r.release("cold")
    await r.unload("cold")

    warm.running = 1  # serving when the next load starts
    cold.hold.set()
    seen.clear()
    await r.acquire("cold")
    assert seen == [LOADER_NICE, LOADER_NICE]
    assert _nice() < LOADER_NICE  # the event loop's thread is left alone
    # the session's first token: in the build when a model served at its start, after it
    # on a loader's thread when one started serving during it (the first load), else the
    # engine's warm-up step is its first run (see the e2e test)
    assert cold.warmed_on_loader == [False, True] and cold.warmed_after_build == 1
    await r.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity is Linux's")
async def test_a_load_beside_serving_models_keeps_the_steps_threads_on_cores_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a load yields the cores, the step thread and each of ONNX Runtime's pool
    workers run on a core of their own (a nice value orders only the threads that share a
    core: Linux put the two on one core and left the loader alone on the other), the
    loader's thread stays free, and every thread gets its affinity back when the load
    ends. A load nothing serves beside (a swap) pins nothing."""
    monkeypatch.setattr(step_cores, "_step_threads", {})
    monkeypatch.setattr(step_cores, "_pool_threads", ())
    cores = sorted(os.sched_getaffinity(0))
    steps = step_cores.new_step_executor()
    step_tid = steps.submit(threading.get_native_id).result()
    worker_tid: list[int] = []
    stop = threading.Event()

    def worker() -> None:  # stands in for the pool's worker (the real one: e2e test)
        worker_tid.append(threading.get_native_id())
        stop.wait(30)

    pool = threading.Thread(target=worker, daemon=True)
    pool.start()
    while not worker_tid:
        await asyncio.sleep(0.01)
    step_cores.note_pool_threads({worker_tid[0]})
    r = residency()
    warm = add(r, "warm", 10, loaded=True)
    cold = add(r, "cold", 10)
    seen: list[tuple[set[int], set[int], set[int]]] = []
    real_build = cold.build_heavy

    def build(*, warm_up: bool = True) -> object:
        seen.append(
            (os.sched_getaffinity(step_tid), os.sched_getaffinity(worker_tid[0]),
             os.sched_getaffinity(0))
        )  # fmt: skip
        return real_build(warm_up=warm_up)

    cold.build_heavy = build  # type: ignore[method-assign]
    try:
        await r.acquire("cold")  # nothing serving: a swap's load
        r.release("cold")
        await r.unload("cold")
        warm.running = 1  # serving when the next load starts
        await r.acquire("cold")
        r.release("cold")
        after = (os.sched_getaffinity(step_tid), os.sched_getaffinity(worker_tid[0]))
    finally:
        stop.set()
        steps.shutdown()
        await r.close()
    everywhere = set(cores)
    assert seen[0] == (everywhere, everywhere, everywhere)
    if len(cores) >= 2:
        assert seen[1] == ({cores[0]}, {cores[1]}, everywhere)
    else:  # one core: nothing to keep apart
        assert seen[1] == (everywhere, everywhere, everywhere)
    assert after == (everywhere, everywhere) and step_cores.pinned() == {}


async def test_the_heap_is_trimmed_before_a_models_first_load_is_measured() -> None:
    """Free pages the C heap still holds (at start, what reading the tokenizers left) would
    be reused by a new session without growing the resident set, and its footprint
    measured short (SmolLM2 loaded at start: 72-75 MiB; 122-128 MiB loaded later, 140 with
    the trim): a model's first load trims first; its later loads, already measured, do not
    pay for it."""
    calls: list[str] = []
    rss = iter(range(0, 1 << 40, 50 * MiB))

    def measure() -> int:
        calls.append("rss")
        return next(rss)

    r = Residency(
        ResidencyConfig(budget_bytes=1 << 30, min_residency_s=0.0),
        rss=measure,
        trim=lambda reason: calls.append("trim"),
        heap=lambda: None,  # the resident set measures (a C library other than glibc)
    )
    add(r, "a", 40)
    await r.acquire("a")
    r.release("a")
    assert calls == ["trim", "rss", "trim", "rss"]  # the second: the session's leftovers
    assert r.committed_bytes() == 50 * MiB  # measured
    await r.unload("a")
    calls.clear()
    await r.acquire("a")
    assert calls == ["rss", "trim", "rss"]
    await r.close()


async def test_without_the_heaps_gauge_a_swap_trims_before_measuring() -> None:
    """The resident set measures only from a heap with nothing free left in it: the unload
    that makes room trims, and the load trims before its footprint is read."""
    calls: list[str] = []
    r = Residency(
        ResidencyConfig(budget_bytes=60 * MiB, min_residency_s=0.0),
        rss=lambda: calls.append("rss") or 0,  # type: ignore[func-returns-value]
        trim=calls.append,
        heap=lambda: None,
    )
    a = add(r, "a", 40)
    add(r, "b", 40)
    await r.acquire("a")
    r.release("a")
    calls.clear()
    await r.acquire("b")
    r.release("b")
    assert a.trims == [True]  # room made, trimmed
    assert calls == ["before a first load", "rss", "session loaded", "rss"]
    await r.close()


async def test_with_the_heaps_gauge_a_swap_waits_for_no_trim() -> None:
    """Issue 26 (evict + load within 1.3x a bare session): with glibc's gauge of the bytes
    in use, the footprint is its change across the load, trimmed or not; so the unload that
    makes room for a newcomer no larger than what leaves does not trim at all (its build
    reuses the pages), a larger newcomer waits for the trim, and the heap is trimmed again
    once the model serves, not in its load time."""
    heap = iter(range(0, 1 << 40, 30 * MiB))
    trims: list[str] = []
    held = threading.Event()
    held.set()

    def trim(reason: str) -> None:
        assert held.wait(10)
        trims.append(reason)

    r = Residency(
        ResidencyConfig(budget_bytes=50 * MiB, min_residency_s=0.0),
        rss=lambda: 0,
        trim=trim,
        heap=lambda: next(heap),
    )
    a, b = add(r, "a", 40), add(r, "b", 40)
    await r.acquire("a")  # its first load: trimmed before (what the heap held at start)
    r.release("a")
    await asyncio.sleep(0.05)
    assert trims == ["before a first load", "session loaded"]
    assert r.committed_bytes() == 30 * MiB  # the heap's change, not the files' 40
    await r.unload("a")  # not for room: trimmed at once
    assert a.trims == [True]
    await r.acquire("b")  # its first load
    r.release("b")
    await asyncio.sleep(0.05)
    trims.clear()
    held.clear()  # every trim from here on waits
    await asyncio.wait_for(r.acquire("a"), 5)  # room made from b; served, trims held
    r.release("a")
    assert b.trims == [False] and trims == []  # no trim in the unload, none awaited
    held.set()
    await asyncio.sleep(0.1)
    # a commits no more than b did: b's freed pages are left for a's build to reuse, and
    # the heap is trimmed once a serves
    assert trims == ["session loaded"]
    c = FakeModel("c")
    r.register(c, predicted_bytes=45 * MiB, reserve_bytes=0, loaded=False,
               measured_bytes=45 * MiB)  # fmt: skip
    trims.clear()
    held.clear()
    # larger than a: it builds once a's pages are freed and trimmed (its peak on top of
    # none of them)
    acquiring = asyncio.ensure_future(r.acquire("c"))
    await asyncio.sleep(0.2)
    assert not acquiring.done() and trims == [] and c.builds == 0
    held.set()
    await asyncio.wait_for(acquiring, 5)
    r.release("c")
    await asyncio.sleep(0.1)
    assert trims == ["room made", "session loaded"]
    await r.close()


async def test_a_model_measured_before_builds_beside_the_free_of_the_one_unloaded() -> None:
    """Issue 26 (evict + load within 1.3x a bare session): freeing the unloaded model
    (Qwen2.5-Coder: 18-60 ms) no longer comes before the newcomer's build when the newcomer's
    footprint is known; the free runs on a thread of its own beside the build, the load
    ends only once it is done, and the newcomer keeps its earlier measure (the heap's
    change then mixes the free's). A model yet to measure waits for the free."""
    heap = iter(range(0, 1 << 40, 30 * MiB))
    r = Residency(
        ResidencyConfig(budget_bytes=50 * MiB, min_residency_s=0.0),
        rss=lambda: 0,
        trim=lambda reason: None,
        heap=lambda: next(heap),
    )
    a, b = add(r, "a", 40), add(r, "b", 40)
    await r.acquire("a")
    r.release("a")
    await r.acquire("b")  # b's first load: a freed before it builds, in the unload
    r.release("b")
    assert a.freed == 1 and a.freed_on == []
    assert r.committed_bytes() == 30 * MiB
    b.free_hold.clear()  # b's free, when handed to the residency, waits
    loading = asyncio.ensure_future(r.acquire("a"))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if a.builds == 2:
            break
    assert a.builds == 2 and b.freed == 0  # a's build started, b's memory not yet freed
    assert r.committed_bytes() <= 50 * MiB  # b left the budget once it stopped serving
    await asyncio.sleep(0.05)
    assert not loading.done() and r.state("a") is ModelState.LOADING  # waits for the free
    b.free_hold.set()
    await asyncio.wait_for(loading, 5)
    r.release("a")
    assert b.freed == 1 and b.freed_on == ["model-free"]
    assert r.committed_bytes() == 30 * MiB  # a's first measure (the heap moved by 30 here)
    await r.close()


async def test_a_free_handed_over_runs_even_when_no_room_is_made() -> None:
    """Room made from one model and then not found for the rest: the model unloaded is
    freed all the same (nothing stays allocated for a model that no longer serves)."""
    r = Residency(
        ResidencyConfig(budget_bytes=60 * MiB, min_residency_s=0.0, room_wait_s=0.1),
        rss=lambda: 0,
        trim=lambda reason: None,
        heap=lambda: 0,
    )
    models = {}
    for name, mib in (("a", 20), ("b", 20), ("c", 45)):  # measured before
        models[name] = FakeModel(name)
        r.register(models[name], predicted_bytes=mib * MiB, reserve_bytes=0, loaded=False,
                   measured_bytes=mib * MiB)  # fmt: skip
    await r.acquire("a")
    r.release("a")
    await r.acquire("b")
    r.release("b")
    r.set_pinned("b", "config", True)  # only a can go, and c needs both gone
    with pytest.raises(ModelUnavailableError, match="no room"):
        await r.acquire("c")
    await asyncio.sleep(0.1)
    assert models["a"].freed == 1 and models["a"].freed_on == ["model-free"]
    assert r.state("a") is ModelState.AVAILABLE and r.state("b") is ModelState.LOADED
    assert models["c"].builds == 0
    await r.close()


async def test_a_larger_newcomer_builds_after_the_free_of_the_one_unloaded() -> None:
    """Issue 26 (RSS peak at most baseline + budget x 1.10): a newcomer committing more
    than what leaves waits for the free before it builds, so its load peaks on top of
    nothing the free still holds (building beside the free, Qwen2.5-Coder's peak after
    SmolLM2 was 10-15 MiB higher in the swap benchmark); a smaller one builds beside it."""
    r = Residency(
        ResidencyConfig(budget_bytes=60 * MiB, min_residency_s=0.0),
        rss=lambda: 0,
        trim=lambda reason: None,
        heap=lambda: 0,
    )
    small, large = FakeModel("small"), FakeModel("large")
    for model, mib in ((small, 20), (large, 50)):  # measured before: both free beside
        r.register(model, predicted_bytes=mib * MiB, reserve_bytes=0, loaded=False,
                   measured_bytes=mib * MiB)  # fmt: skip
    await r.acquire("small")
    r.release("small")
    small.free_hold.clear()  # small's free, handed over, waits
    loading = asyncio.ensure_future(r.acquire("large"))
    await asyncio.sleep(0.1)
    assert large.builds == 0 and small.freed == 0  # waits for the free
    small.free_hold.set()
    await asyncio.wait_for(loading, 5)
    r.release("large")
    assert small.freed == 1 and large.builds == 1
    large.free_hold.clear()  # the other way: the smaller one builds beside large's free
    loading = asyncio.ensure_future(r.acquire("small"))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if small.builds == 2:
            break
    assert small.builds == 2 and large.freed == 0
    large.free_hold.set()
    await asyncio.wait_for(loading, 5)
    r.release("small")
    await r.close()


async def test_the_expected_load_time_is_that_of_a_load_like_the_one_now_less_what_passed() -> None:
    """Retry-After and the load reports' cold models give a model's last load time of the
    same kind: with the cores to itself, or beside a serving model (its loader yields
    them: seconds where alone took under one), and of a load in progress what is left."""
    now = [1000.0]
    r = Residency(
        ResidencyConfig(budget_bytes=100 * MiB, keep_alive_s=60.0, min_residency_s=0.0),
        rss=lambda: 0,
        clock=lambda: now[0],
    )
    warm = add(r, "warm", 10, loaded=True)
    cold = add(r, "cold", 10)
    assert dict(r.cold())["cold"] == DEFAULT_EXPECTED_LOAD_S  # never loaded

    async def load(seconds: float) -> None:
        cold.hold.clear()
        waiting = asyncio.create_task(r.acquire("cold"))
        while r.state("cold") is not ModelState.LOADING:
            await asyncio.sleep(0.01)
        now[0] += seconds
        cold.hold.set()
        await waiting
        r.release("cold")
        assert await r.unload("cold")

    await load(2.0)  # nothing serves: alone
    assert dict(r.cold())["cold"] == 2.0
    warm.running = 1  # now it serves: no load beside it measured yet, the last one's
    assert dict(r.cold())["cold"] == 2.0
    await load(8.0)
    assert dict(r.cold())["cold"] == 8.0
    warm.running = 0
    assert dict(r.cold())["cold"] == 2.0

    warm.running = 1  # a load beside it, 3 s in: 5 s left
    cold.hold.clear()
    waiting = asyncio.create_task(r.acquire("cold"))
    while r.state("cold") is not ModelState.LOADING:
        await asyncio.sleep(0.01)
    now[0] += 3.0
    assert dict(r.cold())["cold"] == 5.0
    with pytest.raises(ModelUnavailableError) as raised:
        await r.acquire("cold", timeout_s=0.05)
    assert raised.value.retry_after == 5.0
    now[0] += 10.0  # past its last load's time: the least, not nothing
    assert dict(r.cold())["cold"] == MIN_EXPECTED_LOAD_S
    cold.hold.set()
    await waiting
    await r.close()
