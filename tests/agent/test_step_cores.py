"""step_cores: which threads are pinned while a model loads beside serving ones, and when
they are let go (the residency's use of it: test_residency; a real agent's: the e2e test
test_a_load_beside_a_serving_model_keeps_the_steps_threads_apart)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from agent.engine import step_cores

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="thread affinity is Linux's"
)


RUNNING: dict[int, threading.Thread] = {}


def _as_step_thread(tid: int) -> None:
    step_cores._step_threads[tid] = RUNNING[tid]


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Three parked threads (native ids), none registered yet."""
    monkeypatch.setattr(step_cores, "_step_threads", {})
    monkeypatch.setattr(step_cores, "_pool_threads", ())
    monkeypatch.setattr(step_cores, "_saved", {})
    monkeypatch.setattr(step_cores, "_depth", 0)
    stop = threading.Event()
    tids: list[int] = []
    lock = threading.Lock()

    def park() -> None:
        with lock:
            tids.append(threading.get_native_id())
            RUNNING[tids[-1]] = threading.current_thread()
        stop.wait(30)

    started = [threading.Thread(target=park, daemon=True) for _ in range(3)]
    for t in started:
        t.start()
    while len(tids) < 3:
        time.sleep(0.01)
    yield tids
    stop.set()
    step_cores.restore()


def test_nothing_is_pinned_without_a_pool_worker(threads: list[int]) -> None:
    _as_step_thread(threads[0])
    step_cores.separate()
    assert step_cores.pinned() == {}
    assert os.sched_getaffinity(threads[0]) == os.sched_getaffinity(0)


def test_nothing_is_pinned_without_a_core_for_each_thread(
    threads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_step_thread(threads[0])
    step_cores.note_pool_threads({threads[1], threads[2]})
    monkeypatch.setattr(step_cores, "_cores", lambda: [0, 1])  # three threads, two cores
    step_cores.separate()
    assert step_cores.pinned() == {}


def test_the_split_lasts_until_the_last_load_that_asked_for_it_ends(threads: list[int]) -> None:
    cores = sorted(os.sched_getaffinity(0))
    _as_step_thread(threads[0])
    step_cores.note_pool_threads({threads[1]})
    step_cores.separate()
    step_cores.separate()  # a second load (the warm-up's loader) while the first runs
    if len(cores) < 2:
        assert step_cores.pinned() == {}
        return
    assert os.sched_getaffinity(threads[0]) == {cores[0]}
    assert os.sched_getaffinity(threads[1]) == {cores[1]}
    assert os.sched_getaffinity(threads[2]) == set(cores)  # not a step's: left alone
    step_cores.restore()
    assert os.sched_getaffinity(threads[1]) == {cores[1]}  # one load still runs
    step_cores.restore()
    assert os.sched_getaffinity(threads[0]) == os.sched_getaffinity(threads[1]) == set(cores)
    assert step_cores.pinned() == {}


def test_a_step_thread_that_is_gone_is_forgotten(threads: list[int]) -> None:
    """An executor that shut down leaves a dead thread whose id may be reused: it is
    dropped, and the thread that got its id now is not pinned."""
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    _as_step_thread(threads[0])
    step_cores._step_threads[threads[2]] = gone  # its id, now another (live) thread's
    step_cores.note_pool_threads({threads[1]})
    step_cores.separate()
    try:
        assert threads[2] not in step_cores._step_threads
        assert threads[2] not in step_cores.pinned()
        assert os.sched_getaffinity(threads[2]) == os.sched_getaffinity(0)
    finally:
        step_cores.restore()
