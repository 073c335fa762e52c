"""Token buckets keyed by the caller's IP address, in a bounded table."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


def peer_ip(peer: str) -> str:
    """The IP address in a gRPC peer string ("ipv4:10.0.0.7:5123", "ipv6:[::1]:5123")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer  # unix sockets and the like: one bucket per peer string


class PeerRateLimiter:
    """``rate_per_s`` calls per second per peer IP, bursts of up to ``burst``.

    The table holds ``max_peers`` buckets at most; the least recently used goes first
    (a forgotten peer starts again with a full bucket).
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_peers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._max_peers = max_peers
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def try_acquire(self, peer: str) -> float:
        """0.0 when the call may go ahead; else the seconds until it may."""
        ip = peer_ip(peer)
        now = self._clock()
        tokens, when = self._buckets.pop(ip, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate_per_s)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate_per_s
        self._buckets[ip] = (tokens, now)
        while len(self._buckets) > self._max_peers:
            self._buckets.popitem(last=False)
        return wait
