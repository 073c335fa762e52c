"""The event loop the coordinator runs on: uvloop when it is installed, else asyncio's own.

Every agent session, route lookup and admin request of a coordinator shares one event
loop on one core, so the loop's own cost per read, write and callback is paid thousands
of times a second. uvloop (libuv underneath, a dependency on Linux and macOS) does that
work in C: an HTTP route lookup on an otherwise idle coordinator took 152 us of its CPU
instead of 237 (one keep-alive client, 4,000 lookups). At the scale benchmark's load
(5,000 agents, 500 lookups/s, 2 cores) the difference was lost in the rest: 0.93 cores
with uvloop, 0.94 without, side by side (``benchmarks/coordinator_scale``). gRPC's
asyncio server runs on any asyncio loop.

``event_loop`` (config): ``auto`` (the default: uvloop when importable), ``uvloop``
(refuse to start without it) or ``asyncio`` (the standard library's loop, e.g. to rule
the loop out when debugging). The loop in use is logged at start and exported as
``edgefleet_coordinator_event_loop_info{loop}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from coordinator.errors import ConfigError

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]


def runner_for(choice: EventLoopChoice) -> tuple[str, Runner[Any]]:
    """(name of the loop, the function that runs a coroutine on it to completion)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError(
                    "event_loop = uvloop, but uvloop is not installed (pip install uvloop), "
                    "or set event_loop = auto"
                ) from None
        else:
            return "uvloop", uvloop.run
    return "asyncio", asyncio.run


def running_loop_name() -> str:
    """ "uvloop" or "asyncio": the kind of the running loop (a test's may differ from the
    process's choice)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
