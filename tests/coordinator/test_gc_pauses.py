"""HeapSettler (coordinator.gc_pauses): what lives a while is frozen out of the
collector's sight; frozen objects are still freed by reference counting, and cyclic
garbage among them by the periodic full collection."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from coordinator.gc_pauses import HeapSettler

pytestmark = pytest.mark.timeout(30)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test process collects as usual


def test_what_lives_past_the_interval_is_frozen() -> None:
    kept = [Node() for _ in range(1000)]
    # an interval no collection of a big test process's heap outlasts (a 50 ms one was:
    # making the nodes set off a full collection, and the first tick was already late)
    settler = HeapSettler(freeze_every_s=1.0)
    settler.tick(population=0)  # within the interval: nothing frozen
    assert gc.get_freeze_count() == 0
    time.sleep(1.05)
    settler.tick(population=0)
    assert gc.get_freeze_count() >= len(kept)


def test_a_frozen_object_is_freed_with_its_last_reference() -> None:
    settler = HeapSettler(freeze_every_s=0.0)
    node = Node()
    gone = weakref.ref(node)
    settler.tick(population=0)
    assert gc.get_freeze_count() > 0
    del node
    assert gone() is None


def test_the_full_collection_frees_cycles_that_were_frozen() -> None:
    settler = HeapSettler(freeze_every_s=0.0)
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    settler.tick(population=0)
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: no collection sees it
    HeapSettler(full_every_s=0.0).tick(population=0)
    assert gone() is None


def test_a_grown_fleet_is_settled_at_once() -> None:
    settler = HeapSettler(freeze_every_s=3600.0, min_growth=10)
    settler.tick(population=5)  # not grown enough, not due
    assert gc.get_freeze_count() == 0
    settler.tick(population=20)
    assert gc.get_freeze_count() > 0
