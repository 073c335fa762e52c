"""The generations of desired-state sections: one counter in the store that only goes up.

An agent keeps, for each section (models, overflow targets, keys, config), the newest
generation it received, across reconnects, and ignores an older one
(``DesiredState.merged``). So every section the coordinator sets must carry a generation
newer than any this store's coordinators ever sent, also after a restart. A count kept
in memory starts again at 1 after a restart, and the wall clock goes back under skew:
neither is enough alone. The counter is kept in the store instead
(``FleetStore.reserve_generations``), and each block of it starts no lower than the wall
clock in milliseconds, so it goes on from the larger of the two: what was stored survives
a clock that went back, and the clock keeps a database restored from an older backup
ahead of what agents were sent since (the counter runs ahead of the clock only while over
a thousand sections a second are sent). The generations agents held before the counter
existed were clock-based: migration 8 in ``coordinator.store.sqlite`` starts it above
them.

It is taken in blocks of ``BLOCK``, each written to the store before any generation in it
is handed out: a restarted coordinator goes on above every block it reserved (the unused
rest of the last one is skipped; generations only need to grow, not to be consecutive),
and a reconnect storm costs one store write per ``BLOCK`` sections, not one per section
(54 us per write on the 2-core CI machine). Several coordinators sharing one store would
each hold a block of their own, so an agent moving between them could meet an older one:
they would need ``block=1``. One coordinator owns a store today.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Generations reserved per store write.
BLOCK = 1000

#: ``reserve(count, at_least)``: mark ``count`` more generations as issued, none below
#: ``at_least``, and return the first (``FleetStore.reserve_generations``).
Reserve = Callable[[int, int], int]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class GenerationCounter:
    """Hands out section generations, each larger than any handed out before on this store."""

    def __init__(
        self,
        reserve: Reserve,
        *,
        block: int = BLOCK,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if block < 1:
            raise ValueError(f"block must be at least 1, got {block}")
        self._reserve = reserve
        self._block = block
        self._clock_ms = clock_ms
        self._next = 0
        self._end = 0  # the first generation not reserved

    def next(self) -> int:
        """The next generation (reserving a block in the store first when this one is
        used up; raises StoreError when the store cannot write it)."""
        if self._next >= self._end:
            first = self._reserve(self._block, self._clock_ms())
            self._next, self._end = first, first + self._block
        generation = self._next
        self._next += 1
        return generation
