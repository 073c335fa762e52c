"""When the agent reconnects to its coordinator: capped backoff and a port probe.

The delay between attempts grows exponentially with equal jitter (so a fleet that lost
its coordinator does not come back in lockstep), but never beyond the cap (by default
one report interval: an agent is never away longer than it would take to miss one
report), and it starts again from the beginning after a session that opened. While it
waits after failing to reach the coordinator, the agent probes the coordinator's TCP
port and reconnects as soon as the port answers again, after a short jitter, instead of
sleeping out the rest of the delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time


class ReconnectBackoff:
    """Delays between attempts: ``initial_s * 2**failures`` with equal jitter, capped."""

    def __init__(self, initial_s: float, rng: random.Random) -> None:
        if initial_s <= 0:
            raise ValueError("initial_backoff_s must be > 0")
        self.initial_s = initial_s
        self._rng = rng

    def delay(self, failures: int, cap_s: float) -> float:
        """Seconds to wait after ``failures`` failed attempts in a row (0 after a session)."""
        ceiling = min(cap_s, self.initial_s * 2.0 ** min(failures, 64))
        return ceiling / 2.0 + self._rng.uniform(0.0, ceiling / 2.0)


def host_port(target: str) -> tuple[str, int] | None:
    """Host and port of a gRPC target ('h:p', '[v6]:p', 'dns:///h:p', 'ipv4:h:p'); else None."""
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(prefix):
            target = target[len(prefix) :]
            break
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def port_open(host: str, port: int, timeout_s: float) -> bool:
    """True when a TCP connection to host:port succeeds within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_to_retry(
    stopping: asyncio.Event,
    delay_s: float,
    *,
    probe: tuple[str, int] | None,
    probe_interval_s: float,
    rng: random.Random,
) -> None:
    """Wait ``delay_s``, or less: until ``stopping`` is set, or the probed port comes back.

    With ``probe``, the port is tried every ``probe_interval_s``; when it was closed and
    then opens, the wait ends after a random fraction of ``probe_interval_s``. A port
    that is open from the first try does not shorten the wait (the coordinator is
    there and failed us for another reason: retrying at once would only hammer it).
    """
    deadline = time.monotonic() + delay_s
    if probe is not None:
        host, port = probe
        first = True
        while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
            if await port_open(host, port, min(probe_interval_s, left)):
                if first:
                    break
                left = min(left, rng.uniform(0.0, probe_interval_s))
                deadline = time.monotonic() + left
                break
            first = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stopping.wait(), min(probe_interval_s, max(deadline - time.monotonic(), 0))
                )
    left = deadline - time.monotonic()
    if left > 0 and not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), left)
