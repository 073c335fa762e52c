"""The generations of desired-state sections: one counter in the store that only goes up.

An agent keeps, for each section (models, overflow targets, keys, config), the newest
generation it received, across reconnects, and ignores an older one
(``DesiredState.merged``). So every section the coordinator sets must carry a generation
newer than any this store's coordinators ever sent, also after a restart. A count kept
in memory starts again at 1 after a restart, and the wall clock goes back under skew:
neither is enough alone. The counter is kept in the store instead
(``GenerationTable.reserve_generations``, table ``section_generations``), and each block
of it starts no lower than the wall clock in milliseconds, so it goes on from the larger
of the two: what was stored survives a clock that went back, and the clock keeps a
database restored from an older backup ahead of what agents were sent since (the counter
runs ahead of the clock only while over a thousand sections a second are sent). The
generations agents held before the counter existed were clock-based: migration 8 in
``coordinator.store.migrations`` starts it above them.

It is taken in blocks, each written to the store before any generation in it is handed
out: a restarted coordinator goes on above every block it reserved (the unused rest is
skipped; generations only need to grow, not to be consecutive). Sections are set from
synchronous code on the event loop (a load report's hook, a distributor's tick), so
``next()`` never waits for the store: the counter reserves the next block ahead, on a
task of its own, once less than half of what it wants to hold is left. What it wants to
hold grows with the fleet (``demand``: four generations per agent, at least ``BLOCK``),
so a fleet-wide push made in one go (a section for every agent) never runs out before
the next block is written; only a store that does not answer at all for that long makes
``next()`` raise StoreError.

Several coordinators sharing one store each hold blocks of their own, so an agent whose
session moves from B to A could meet an older generation on A (A's block was reserved
before B's) and ignore A's sections. So a coordinator calls ``fresh()`` when a session
opens while other coordinators are alive, unless the agent's previous session was on this
coordinator (coordinator/rpc/service.py ``_claim``): it waits for a block reserved
*after* the call began (one reservation serves every session opening meanwhile) and
drops the older ones.
Every generation the agent gets from this session is then above any reserved, by any
coordinator, before it opened, and so above any it was sent by its previous session
(whose coordinator reserved those before the agent left it). The generations come from
the database's one counter; a coordinator's block only lets it hand them out without a
round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from coordinator.errors import StoreError

logger = logging.getLogger(__name__)

#: Generations reserved per store write at least.
BLOCK = 1000
#: Generations held per agent the coordinator knows (``demand``), at least BLOCK.
PER_AGENT = 4

#: ``reserve(count, at_least)``: mark ``count`` more generations as issued, none below
#: ``at_least``, and return the first (``GenerationTable.reserve_generations``).
Reserve = Callable[[int, int], Awaitable[int]]


class GenerationTable(Protocol):
    async def reserve_generations(self, count: int, at_least: int) -> int:
        """In one transaction: mark ``count`` more desired-state section generations as
        issued and return the first of them: the larger of one past the last issued and
        ``at_least``."""
        ...


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class GenerationCounter:
    """Hands out section generations, each larger than any handed out before on this store.

    ``start()`` (awaited once, before the first ``next()``) reserves the first block.
    """

    def __init__(
        self,
        reserve: Reserve,
        *,
        block: int = BLOCK,
        clock_ms: Callable[[], int] = wall_clock_ms,
        demand: Callable[[], int] = lambda: 0,
    ) -> None:
        if block < 1:
            raise ValueError(f"block must be at least 1, got {block}")
        self._reserve = reserve
        self._block = block
        self._clock_ms = clock_ms
        self._demand = demand
        # Reserved ranges [next, end, reservation number), oldest first: each starts above
        # the one before.
        self._blocks: deque[list[int]] = deque()
        self._refill: asyncio.Task[None] | None = None
        # Reservations started so far (``fresh`` waits for one started after it was called).
        self._started = 0

    def _wanted(self) -> int:
        return max(self._block, PER_AGENT * self._demand())

    def remaining(self) -> int:
        """Generations reserved and not handed out yet."""
        return sum(end - first for first, end, _ in self._blocks)

    async def fresh(self) -> bool:
        """Hand out from now on only generations reserved after this call began (see the
        module doc: a session opening with other coordinators alive). False when the store
        did not write one (logged; the older blocks are kept meanwhile)."""
        before = self._started
        for _ in range(2):  # a reservation already under way began before: one more
            if self._refill is None:
                self._schedule_refill()
            refill = self._refill
            assert refill is not None
            await asyncio.shield(refill)
            if self._blocks and self._blocks[-1][2] > before:
                while self._blocks[0][2] <= before:
                    self._blocks.popleft()
                return True
            if self._started > before and self._refill is None:
                return False  # the reservation this call waited for failed
        return False

    async def start(self) -> None:
        """Reserve the first block (raises StoreError when the store cannot write it)."""
        if not self._blocks:
            await self._reserve_block()

    async def reserved(self) -> None:
        """Wait for a reservation under way (if any) to be written."""
        while self._refill is not None:
            await asyncio.shield(self._refill)

    def next(self) -> int:
        """The next generation; the next block is reserved ahead when this one runs low.

        Raises StoreError when none is reserved (the store has not written a block since
        the last ran out, or ``start`` was not awaited).
        """
        blocks = self._blocks
        while blocks and blocks[0][0] >= blocks[0][1]:
            blocks.popleft()
        if not blocks:
            self._schedule_refill()
            raise StoreError(
                "no desired-state section generation is reserved: the store has not "
                "written the next block yet (it is slow or failing)"
            )
        current = blocks[0]
        generation = current[0]
        current[0] += 1
        if self._refill is None and self.remaining() * 2 < self._wanted():
            self._schedule_refill()
        return generation

    def _schedule_refill(self) -> None:
        if self._refill is None:
            self._refill = asyncio.get_running_loop().create_task(
                self._refill_now(), name="section-generations"
            )

    async def _refill_now(self) -> None:
        try:
            await self._reserve_block()
        except StoreError as exc:  # the next next() tries again
            logger.error("could not reserve desired-state section generations: %s", exc)
        finally:
            self._refill = None

    async def _reserve_block(self) -> None:
        count = self._wanted()
        self._started += 1
        number = self._started
        first = await self._reserve(count, self._clock_ms())
        if self._blocks and first < self._blocks[-1][1]:
            raise StoreError(f"the store reserved generation {first}, below ones already held")
        self._blocks.append([first, first + count, number])

    async def close(self) -> None:
        """Wait for a reservation under way (nothing else is left to write)."""
        await self.reserved()
