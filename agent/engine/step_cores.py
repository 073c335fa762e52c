"""Keeping the engines' step threads on separate cores while a model loads beside them.

A step runs on the step executor's thread and on ONNX Runtime's shared pool (the calling
thread and the pool's workers split each operator's work and wait for each other at its
end, spinning a while first). A model's load beside serving models runs on a thread of
its own at a lower priority (see ``residency._LoaderThread``). A nice value only orders
the threads that share a core's run queue, though: traced on two cores (``perf sched``),
Linux kept the loader alone on one core and put the step thread and the pool's worker on
the other, where the two spun in turn for whole 4 ms ticks, each waiting for the other's
half of the operator. SmolLM2's 40-token prefill then took 165-246 ms against 75-93 ms
alone, at the start of most loads, at nice 0, 10 or 19 alike.

So while such a load runs, the step threads and each pool worker are pinned to cores of
their own (the step threads to the first core the process may use, the workers to the
next ones) and the loader is left free: wherever it runs it shares a core with one of
them, and its nice value then gives that core to the step (the same prefill took 83-135
ms in the same runs). When the load ends every thread gets its own affinity back. Nothing
is pinned where a step has one thread (no pool worker), where the process has fewer cores
than a step has threads, or off Linux.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

_lock = threading.Lock()
_step_threads: dict[int, threading.Thread] = {}  # the step executors' threads, by native id
_pool_threads: tuple[int, ...] = ()  # ONNX Runtime's shared pool's workers
_depth = 0  # loads (normally one at a time) that asked for the split
_saved: dict[int, set[int]] = {}  # each pinned thread's affinity before


def thread_ids() -> set[int]:
    """This process's threads (native ids); empty where /proc is not there."""
    try:
        return {int(entry.name) for entry in Path("/proc/self/task").iterdir()}
    except (OSError, ValueError):
        return set()


def note_pool_threads(tids: set[int]) -> None:
    """The threads ONNX Runtime started for its shared pool (see ``use_shared_thread_pool``)."""
    global _pool_threads
    with _lock:
        _pool_threads = tuple(sorted(tids))


def note_step_thread() -> None:
    """A step executor's initializer: the calling thread runs the engines' steps."""
    with _lock:
        _step_threads[threading.get_native_id()] = threading.current_thread()


def new_step_executor() -> ThreadPoolExecutor:
    """The one thread that runs every text model's steps in turn."""
    return ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="ort-steps", initializer=note_step_thread
    )


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(os.getpid()))


def separate() -> None:
    """A load beside serving models starts (or starts yielding): pin the step threads
    and the pool's workers each to a core of their own. Nested calls count."""
    global _depth
    if not hasattr(os, "sched_setaffinity"):
        return
    with _lock:
        _depth += 1
        for tid in [t for t, thread in _step_threads.items() if not thread.is_alive()]:
            del _step_threads[tid]  # its executor shut down (its id may be reused)
        if _depth > 1 or not _step_threads:
            return
        try:
            cores = _cores()
        except OSError:
            return
        workers = list(_pool_threads)
        # no worker (one thread a step, or no shared pool): nothing to keep apart; not a
        # core each: leave them to the kernel
        if not workers or len(cores) < 1 + len(workers):
            return
        plan = {tid: cores[0] for tid in _step_threads}
        plan.update({tid: cores[1 + i] for i, tid in enumerate(workers)})
        for tid, core in plan.items():
            try:
                before = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {core})
            except OSError:  # gone meanwhile, or not ours to move
                _step_threads.pop(tid, None)
                continue
            _saved[tid] = before
        log.debug("while a model loads, steps run on core %d and the pool's workers on %s",
                  cores[0], [plan[t] for t in workers])  # fmt: skip


def restore() -> None:
    """The load that asked for :func:`separate` ended: the threads get their own
    affinity back once no load needs the split."""
    global _depth
    if not hasattr(os, "sched_setaffinity"):
        return
    with _lock:
        _depth = max(0, _depth - 1)
        if _depth:
            return
        for tid, before in _saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)
        _saved.clear()


def pinned() -> dict[int, set[int]]:
    """The threads pinned now and the affinity each gets back (for tests and logs)."""
    with _lock:
        return {tid: set(before) for tid, before in _saved.items()}
