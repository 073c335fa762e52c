"""A request's keep_alive at the residency (issue 26): never a way for one key to push
other keys' models out. A long keep_alive only keeps an idle model loaded longer: a
newcomer still takes the least recently used idle model's room, however long that one's
keep_alive. Only a pin (a key allowed to pin models) protects a model, and an operator's
unload ends it; a negative keep_alive without the pin flag never means forever."""

from __future__ import annotations

import asyncio

from agent.engine.residency import ModelState
from tests.agent.test_residency import MiB, add, residency


async def test_a_long_keep_alive_does_not_protect_a_model_from_eviction_for_room() -> None:
    r = residency(budget_bytes=100 * MiB, keep_alive_s=60.0, max_request_keep_alive_s=3600.0)
    greedy, other, newcomer = add(r, "greedy", 40), add(r, "other", 40), add(r, "new", 40)
    await r.acquire("greedy", keep_alive_s=3600.0)  # the longest a request may ask
    r.release("greedy")
    await r.acquire("other")  # used after it: greedy is the least recently used
    r.release("other")
    await r.acquire("new")  # needs one of them to go
    r.release("new")
    assert (greedy.detached, other.detached, newcomer.builds) == (1, 0, 1)
    assert r.state("greedy") is ModelState.AVAILABLE
    await r.close()


async def test_a_requests_pin_protects_its_model_until_an_operator_unloads_it() -> None:
    r = residency(budget_bytes=100 * MiB, keep_alive_s=0.1, room_wait_s=0.2)
    pinned, other, newcomer = add(r, "pinned", 40), add(r, "other", 40), add(r, "new", 40)
    await r.acquire("pinned", pin=True)
    r.release("pinned")
    await r.acquire("other")  # used after it: pinned is the least recently used
    r.release("other")
    await r.acquire("new")  # room is made from the other one: the pinned one is no victim
    r.release("new")
    assert (pinned.detached, other.detached, newcomer.builds) == (0, 1, 1)
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["new"]  # idle past its keep-alive; the pin stays
    assert {s["model"]: s["pinned"] for s in r.snapshot()}["pinned"] is True
    assert await r.unload("pinned")  # the operator's unload ends the request's pin
    await r.acquire("pinned")  # loaded again by a request without the pin: on demand
    r.release("pinned")
    assert {s["model"]: s["pinned"] for s in r.snapshot()}["pinned"] is False
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["pinned"]
    await r.close()


async def test_a_negative_keep_alive_without_the_pin_flag_is_not_forever() -> None:
    r = residency(keep_alive_s=0.1)
    add(r, "a", 10)
    await r.acquire("a", keep_alive_s=-1.0)  # a caller that skipped the key's check
    r.release("a")
    assert [s["pinned"] for s in r.snapshot()] == [False]
    await asyncio.sleep(0.15)
    assert await r.expire_idle() == ["a"]
    await r.close()
