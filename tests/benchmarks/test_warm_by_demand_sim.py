"""The warm-by-demand benchmark's simulated agent counts what the real agent would do: a
request loads a model not in memory, the model stays keep-alive after its last use, a
LOAD_MODEL nobody used before it went counts as an extra load, and memory time is kept
within the measured day."""

from __future__ import annotations

import random

from benchmarks.warm_by_demand import (
    KEEP_ALIVE_S,
    LOAD_S,
    SERVICE_S,
    SITES,
    SimAgent,
    Tally,
    generate,
    replay,
)
from coordinator.routing.warmth import WarmthSettings

T0 = 1_000_000.0


def test_a_request_loads_and_the_model_stays_for_its_keep_alive() -> None:
    tally = Tally()
    agent = SimAgent(SITES[0], (T0, T0 + 86_400), tally)
    agent.request(T0, "chat", morning=True)  # cold: loads
    agent.request(T0 + KEEP_ALIVE_S, "chat", morning=False)  # warm
    last = T0 + 2 * KEEP_ALIVE_S  # warm: the request before kept it
    agent.request(last, "chat", morning=False)
    assert agent.record(last + 5).last_report.cold_models == (  # type: ignore[union-attr]
        ("code", LOAD_S),
        ("rare", LOAD_S),
    )
    agent.request(last + SERVICE_S + KEEP_ALIVE_S + 1, "chat", morning=False)  # gone: cold
    assert (tally.requests, tally.cold_requests, tally.loads) == (4, 2, 2)
    assert (tally.morning_requests, tally.cold_morning_requests) == (1, 1)


def test_an_unused_warm_load_is_an_extra_load_and_a_used_one_is_not() -> None:
    tally = Tally()
    agent = SimAgent(SITES[0], (T0, T0 + 86_400), tally)
    agent.load_model(T0, "code")  # nobody asks: unloaded after keep-alive, unused
    agent.load_model(T0 + 1000, "chat")
    agent.request(T0 + 1100, "chat", morning=False)  # warm: the load served it
    agent.finish(T0 + 86_400)
    assert (tally.loads, tally.policy_loads, tally.extra_loads) == (2, 2, 1)
    assert tally.cold_requests == 0
    # memory time: code for load + keep-alive, chat until keep-alive after its request
    code_s = LOAD_S + KEEP_ALIVE_S
    chat_s = 1100 + SERVICE_S + KEEP_ALIVE_S - 1000
    assert tally.warm_s == code_s + chat_s


def test_the_policy_off_loads_nothing_ahead_and_on_fewer_requests_pay_a_load() -> None:
    lookups = generate(random.Random(1))
    off, _ = replay(lookups, None, 30.0)
    on, pairs = replay(lookups, WarmthSettings(), 30.0)
    assert off.policy_loads == 0 and off.extra_loads == 0
    assert off.requests == on.requests > 0
    assert on.cold_requests < off.cold_requests
    assert pairs > 0
