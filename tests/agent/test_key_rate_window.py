"""API-key rate limits at the agent: a sliding 60-second window per key and limit.

Unit tests with the clock injected (no server): a key idle for a minute may use its whole
share at once, and no 60-second window ever holds more than the share, also when the
share moves and when requests give back tokens they did not use (issue 24: a token bucket
holding a minute and refilling let twice the share through in the first minute).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from agent.api.http_io import error_response
from agent.auth.keys import COALESCE_S, WINDOW_S, KeyTable, SlidingWindow, new_secret, secret_digest
from agent.errors import KeyRateLimitError
from edgefleet.contract import ApiKey


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def table_with(**limits: Any) -> tuple[KeyTable, Clock, str, ApiKey]:
    key_id, secret = new_secret()
    key = ApiKey(key_id=key_id, secret_sha256=secret_digest(secret), **limits)
    clock = Clock()
    table = KeyTable(enabled=True, clock=clock, wall_clock=lambda: 1.7e9)
    table.set_source("coordinator", [key], generation=1)
    return table, clock, f"Bearer {secret}", key


def accepted(table: KeyTable, authorization: str) -> bool:
    try:
        table.authenticate(authorization)
    except KeyRateLimitError:
        return False
    return True


def max_in_any_window(times: list[tuple[float, float]], start: float, end: float) -> float:
    """The most accepted (amounts at times) in any [s, s + 60) for s from start to end,
    step 1 s."""
    most = 0.0
    for step in range(int(end - start) + 1):
        s = start + step
        most = max(most, sum(a for t, a in times if s <= t < s + WINDOW_S))
    return most


def test_idle_key_bursts_its_whole_share_then_retry_after_in_window() -> None:
    table, clock, auth, _ = table_with(requests_per_minute=50)
    assert all(accepted(table, auth) for _ in range(50))
    with pytest.raises(KeyRateLimitError) as refused:
        table.authenticate(auth)
    assert 0 < refused.value.retry_after <= WINDOW_S
    # A minute later (idle since): the whole share at once again, not one more.
    clock.now += refused.value.retry_after
    assert all(accepted(table, auth) for _ in range(50))
    assert not accepted(table, auth)


def test_tokens_idle_key_bursts_whole_share_then_refused() -> None:
    table, clock, auth, _ = table_with(tokens_per_minute=1000)
    table.authenticate(auth).charge_tokens(1000)
    with pytest.raises(KeyRateLimitError) as refused:
        table.authenticate(auth).charge_tokens(1)
    assert 0 < refused.value.retry_after <= WINDOW_S
    assert "tokens/min" in str(refused.value)
    clock.now += refused.value.retry_after
    table.authenticate(auth).charge_tokens(1000)


def test_twice_the_share_offered_for_three_minutes_never_more_than_share_a_minute() -> None:
    """Issue 24's budget scenario at one agent: 600/min share, 1,200/min offered evenly.
    The token bucket accepted 1,200 in the first minute (full bucket + a minute of refill)."""
    share, offered_per_s = 600, 20
    table, clock, auth, _ = table_with(requests_per_minute=share)
    start = clock.now
    times: list[tuple[float, float]] = []
    refusals: list[float] = []
    for i in range(180 * offered_per_s):
        clock.now = start + i / offered_per_s
        try:
            table.authenticate(auth)
        except KeyRateLimitError as exc:
            refusals.append(exc.retry_after)
        else:
            times.append((clock.now, 1))
    assert max_in_any_window(times, start, start + 180) <= share
    # ... while still serving the whole share each minute (not a limit that merely refuses)
    assert len(times) >= 3 * share - offered_per_s
    assert all(0 < wait <= WINDOW_S for wait in refusals)


def test_tokens_with_give_backs_never_more_than_share_in_a_window() -> None:
    """Requests charge prompt + max_tokens up front and give back what they did not use,
    seconds later, interleaved with others: what stays counted (what they used, at the
    time they were charged) never exceeds the share in any 60-second window."""
    share = 5000
    table, clock, auth, _ = table_with(tokens_per_minute=share)
    start = clock.now
    rng = random.Random(24)
    pending: list[tuple[float, Any, int, int]] = []  # settle at, grant, charged, used
    used_at: list[tuple[float, float]] = []
    served = 0
    for i in range(180 * 10):
        clock.now = start + i / 10
        for item in [p for p in pending if p[0] <= clock.now]:
            pending.remove(item)
            _, grant, charged, used = item
            grant.settle(used // 2, used - used // 2, charged)
        charged = rng.randint(20, 400)
        try:
            grant = table.authenticate(auth)
            grant.charge_tokens(charged)
        except KeyRateLimitError as exc:
            assert 0 < exc.retry_after <= WINDOW_S
            continue
        served += 1
        used = rng.randint(0, charged)
        used_at.append((clock.now, used))
        pending.append((clock.now + rng.uniform(0.5, 20), grant, charged, used))
    assert max_in_any_window(used_at, start, start + 180) <= share
    assert served > 100  # given-back tokens were served again


def test_give_back_returns_to_the_request_that_was_charged() -> None:
    """A gives back after B was charged: the room comes from A's entry, so when A's entry
    expires B's charge still counts (taking it from the newest entry let a window hold
    A's unused room twice)."""
    table, clock, auth, _ = table_with(tokens_per_minute=100)
    a = table.authenticate(auth)
    a.charge_tokens(50)
    clock.now += 1
    table.authenticate(auth).charge_tokens(50)  # B, uses all it was charged
    clock.now += 1
    a.settle(0, 0, 50)  # A used nothing
    table.authenticate(auth).charge_tokens(50)  # C fits in A's room
    clock.now += WINDOW_S - 1.5  # A's entry has expired; B and C still count
    with pytest.raises(KeyRateLimitError) as refused:
        table.authenticate(auth).charge_tokens(50)
    assert refused.value.retry_after == pytest.approx(0.5)  # when B's entry expires


def test_share_moving_down_mid_window_refuses_until_it_drains_below_new_share() -> None:
    table, clock, auth, key = table_with(requests_per_minute=10)
    start = clock.now
    for i in range(8):
        clock.now = start + i
        assert accepted(table, auth)
    clock.now = start + 10
    table.set_source("coordinator", [dataclasses.replace(key, requests_per_minute=5)], 2)
    with pytest.raises(KeyRateLimitError) as refused:
        table.authenticate(auth)
    # 8 held; one more fits at 5 once 4 have expired: the 4th, taken at start + 3.
    assert refused.value.retry_after == pytest.approx(start + 3 + WINDOW_S - clock.now)
    clock.now = start + 3 + WINDOW_S - 0.01
    assert not accepted(table, auth)
    clock.now = start + 3 + WINDOW_S
    assert accepted(table, auth)
    assert not accepted(table, auth)  # 4 left from before + 1 = the new share
    # A share moving up keeps the window too: 5 held, so 15 more at 20, not 20.
    table.set_source("coordinator", [dataclasses.replace(key, requests_per_minute=20)], 3)
    assert sum(accepted(table, auth) for _ in range(25)) == 15


def test_request_larger_than_the_whole_share_is_refused_clearly() -> None:
    table, _clock, auth, _ = table_with(tokens_per_minute=60)
    with pytest.raises(KeyRateLimitError) as refused:
        table.authenticate(auth).charge_tokens(100)
    assert "more than this agent's whole share" in str(refused.value)
    assert refused.value.retry_after >= 1
    table.authenticate(auth).charge_tokens(60)  # the share itself still fits at once


def test_memory_stays_bounded_under_a_huge_share() -> None:
    window = SlidingWindow(1e12)
    now = 0.0
    for i in range(150_000):  # one request a millisecond for 150 s
        now = i / 1000
        assert window.take(7, now) == 0.0
        assert len(window.entries) <= WINDOW_S / COALESCE_S + 1
    # What counts is the last minute's (up to 100 ms more: coalesced entries are held
    # until their newest amount is a minute old, never released early).
    assert 60_000 * 7 <= window.used <= 60_100 * 7
    assert window.used == sum(entry[2] for entry in window.entries)


def test_retry_after_is_rounded_up_so_a_client_waiting_that_long_is_served() -> None:
    """The header holds whole seconds: 30.4 s of window left is "31" (never "30", after
    which the client would be refused once more), and never less than 1."""
    for wait, header in ((30.4, "31"), (30.0, "30"), (0.2, "1"), (59.9, "60")):
        response = error_response(KeyRateLimitError("over", retry_after=wait))
        assert response.status == 429 and response.headers["Retry-After"] == header, wait
