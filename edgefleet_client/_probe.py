"""Round-trip time to an agent: how long a TCP connect to its HTTP port takes."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from urllib.parse import urlsplit

from edgefleet_client._models import Agent


def probe_rtt_ms(url: str, *, timeout_s: float = 1.0) -> float | None:
    """Milliseconds for a TCP connect to the URL's host and port; None when unreachable."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    start = time.perf_counter()
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError:
        return None
    return (time.perf_counter() - start) * 1000.0


def probe_all(agents: list[Agent], *, timeout_s: float = 1.0) -> list[Agent]:
    """The agents with ``rtt_ms`` filled in, probed in parallel (unreachable ones dropped)."""
    if not agents:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(agents))) as pool:
        rtts = list(pool.map(lambda a: probe_rtt_ms(a.url, timeout_s=timeout_s), agents))
    return [replace(a, rtt_ms=rtt) for a, rtt in zip(agents, rtts, strict=True) if rtt is not None]
