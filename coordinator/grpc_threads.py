"""gRPC's own threads a little behind the event loop when they share a CPU.

gRPC's C core reads and writes the agents' streams on threads of its own (named
``event_engine``, plus its timer thread). They need little CPU, but they wake a thousand
times a second on a busy fleet, and on a coordinator held to one CPU (a cpuset, a
one-core VM) each wake-up can take the CPU from the event loop, which is what answers
route lookups: measured with ``python -m benchmarks.coordinator_scale`` (5,000 agents,
500 lookups/s, the coordinator pinned to one CPU), client route p99 went from 19-26 ms
to 9.5-10.3 ms (three runs) with those threads at niceness 5-10, every report still
stored.

``lower_grpc_threads`` sets the niceness of those threads (Linux keeps a niceness per
thread). Raising one's own threads' niceness needs no privilege; the event loop's own
thread, the store's worker threads and anything else that takes Python's GIL keep
theirs (a thread holding the GIL must not wait behind others for the CPU: the loop would
wait for the GIL behind it). gRPC starts threads as it needs them, so ``serve`` calls it
again every ``RECHECK_S``. Nothing is done where threads have no niceness of their own
(not Linux) or ``nice`` is 0.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

#: ``comm`` of the C core's threads: its EventEngine pool and its timer manager (names
#: truncated to 15 bytes by the kernel). None of them takes the GIL to do its work.
GRPC_THREAD_NAMES = frozenset({"event_engine", "grpc_global_tim"})

#: How often ``serve`` looks for threads gRPC started since.
RECHECK_S = 5.0

_TASKS = Path("/proc/self/task")


def supported() -> bool:
    """True where a thread's niceness is its own (Linux)."""
    return sys.platform.startswith("linux") and _TASKS.is_dir()


def lower_grpc_threads(nice: int) -> int:
    """Give gRPC's threads that are not yet there niceness ``nice`` (0..19; 0: nothing);
    returns how many threads of this process are at it or above now."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be in 0..19, got {nice}")
    if nice == 0 or not supported():
        return 0
    lowered = 0
    for task in _TASKS.iterdir():
        try:
            if (task / "comm").read_text().strip() not in GRPC_THREAD_NAMES:
                continue
            tid = int(task.name)
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            lowered += 1
        except (OSError, ValueError):  # ended meanwhile, or not ours to change
            continue
    return lowered
