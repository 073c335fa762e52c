"""Garbage-collector pauses: measured into a histogram, and made rarer after startup.

A coordinator with thousands of agent sessions holds hundreds of thousands of
long-lived objects; a full (generation 2) collection walks all of them while every
session and route lookup waits. ``GcPauseRecorder`` times each collection (a
``gc.callbacks`` hook, process-wide: install it once per process, in ``server.serve``);
``settle_heap`` moves what exists after startup out of the collector's sight
(``gc.freeze``) so later full collections only walk what came after, and
``HeapSettler`` keeps doing so while the coordinator serves.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram


class GcPauseRecorder:
    """Observes every collection's duration into ``histogram`` (label: generation)."""

    def __init__(self, histogram: Histogram) -> None:
        self._started = 0.0
        self._children = [histogram.labels(generation=str(g)) for g in range(3)]

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = min(int(info.get("generation", 2)), 2)
            self._children[generation].observe(time.perf_counter() - self._started)

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


def settle_heap() -> None:
    """Collect once, then freeze every surviving object (modules, config, restored fleet)."""
    gc.collect()
    gc.freeze()


#: How often ``HeapSettler`` freezes what is alive (the server ticks it this often).
FREEZE_EVERY_S = 0.1


class HeapSettler:
    """Keeps what lives a while out of the collector's sight, so collections stay short.

    Each agent session brings a few hundred long-lived objects (its stream, task,
    queue, Hello), and each of its load reports a few dozen that live until the next one
    (the agent's record, the session's pending read): at 5,000 agents, tens of thousands
    a second that outlive the young generation. Walked by every collection they reached,
    they made young collections of up to 100 ms and full ones of 100-450 ms, several
    times a second, on the benchmark's VM (benchmarks/coordinator_scale.py).

    So everything alive is frozen every ``freeze_every_s`` (``gc.freeze``: a list splice,
    nothing walked): collections only walk what was made since, and a frozen object is
    still freed as soon as its last reference goes. Once ``population`` (connected
    agents) has grown by ``growth`` since the last settle, young garbage is collected
    before freezing. Cyclic garbage that forms among frozen objects (sessions that end)
    is reclaimed by a full unfrozen collection every ``full_every_s``: one long pause,
    on purpose rare.
    """

    def __init__(
        self,
        *,
        growth: float = 0.1,
        min_growth: int = 100,
        full_every_s: float = 3600.0,
        freeze_every_s: float = FREEZE_EVERY_S,
    ) -> None:
        self._growth = growth
        self._min_growth = min_growth
        self._full_every_s = full_every_s
        self._freeze_every_s = freeze_every_s
        self._settled_population = 0
        self._last_full = self._last_freeze = time.monotonic()

    def tick(self, population: int) -> None:
        now = time.monotonic()
        if now - self._last_full >= self._full_every_s:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._last_full = self._last_freeze = now
            self._settled_population = population
            return
        grown = population - self._settled_population
        if grown >= max(self._min_growth, self._growth * self._settled_population):
            gc.collect(1)
            gc.freeze()
            self._last_freeze = now
            self._settled_population = population
        elif now - self._last_freeze >= self._freeze_every_s:
            gc.freeze()
            self._last_freeze = now
