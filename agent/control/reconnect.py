"""When the agent reconnects to its coordinator: capped backoff and a port probe.

The delay between attempts grows exponentially with equal jitter (so a fleet that lost
its coordinator does not come back in lockstep), but never beyond the cap (by default
one report interval: an agent is never away longer than it would take to miss one
report), and it starts again from the beginning after a session that opened. While it
waits after failing to reach the coordinator, the agent probes the coordinator's TCP
port and reconnects as soon as the port answers again, after a short jitter, instead of
sleeping out the rest of the delay.

With several coordinators (``coordinator.target`` a list, or a name with several
addresses) a round tries each of them once, the last one that worked first
(:func:`round_order`), moving on at once; the delay comes only after a whole round failed,
and the wait then ends as soon as any of the ports that were closed opens.

Coordinators learned from Welcome (``Welcome.coordinators``: the ones alive when the
session opened) join the rotation after the configured ones (:func:`learned_targets`):
each checked as ``host:port``, at most :data:`MAX_LEARNED` of them, a bad entry ignored
with a log line. The configured targets always stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast


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


@dataclass(frozen=True, slots=True)
class Candidate:
    """One coordinator to try: ``entry`` as configured, ``target`` what gRPC connects to
    (the entry, or one of the addresses its name resolved to) and, for an address,
    ``server_name``: the name its TLS certificate is checked against."""

    entry: str
    target: str
    server_name: str = ""

    @property
    def label(self) -> str:
        """How logs and metrics name it: the entry, with the address when resolved."""
        return self.entry if self.target == self.entry else f"{self.entry} ({self.target})"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve(entries: Sequence[str]) -> list[Candidate]:
    """The coordinators behind ``entries``: a ``host:port`` whose name resolves to several
    addresses is one candidate per address (looked up now: DNS may have changed since the
    last round); anything else (an IP address, a name with one address or none, a gRPC
    target with a scheme) is itself, left to gRPC as before."""
    loop = asyncio.get_running_loop()
    found: list[Candidate] = []
    for entry in entries:
        parsed = host_port(entry) if ":" in entry and "://" not in entry else None
        if parsed is None or entry.startswith(("dns:", "ipv4:", "ipv6:")) or _is_ip(parsed[0]):
            found.append(Candidate(entry, entry))
            continue
        host, port = parsed
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            infos = []
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if len(addresses) <= 1:
            found.append(Candidate(entry, entry))
            continue
        for address in addresses:
            target = f"ipv6:[{address}]:{port}" if ":" in address else f"ipv4:{address}:{port}"
            found.append(Candidate(entry, target, server_name=host))
    return found


#: The most coordinators an agent takes from one Welcome (beyond its configured ones).
MAX_LEARNED = 16
# A learned address's host: a DNS name or an IPv4 address (IPv6 comes in brackets).
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252}[A-Za-z0-9])?")
# Hosts that name no machine to dial (a listener's "every interface").
_WILDCARDS = frozenset({"0.0.0.0", "::"})
# The longest address taken: a DNS name's 253 characters, a colon and a port.
_MAX_ADDRESS = 253 + 6


def learned_address_problem(entry: str) -> str | None:
    """Why ``entry`` (from a coordinator's Welcome) is no ``host:port`` to dial; None when it
    is one. Stricter than a configured target: a port is required, and no gRPC scheme
    (``unix:``, ``dns:``, ...) is taken from the network."""
    if not entry:
        return "an empty entry"
    if len(entry) > _MAX_ADDRESS:
        return f"longer than {_MAX_ADDRESS} characters"
    if entry.startswith("["):
        host, close, rest = entry[1:].partition("]")
        if not close or not rest.startswith(":"):
            return "an IPv6 address must be written [address]:port"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address in the brackets"
        port = rest[1:]
    else:
        host, sep, port = entry.partition(":")
        if not sep:
            return "no port"
        if not _HOST.fullmatch(host):
            return "the host is no DNS name or IPv4 address"
    if host in _WILDCARDS:
        return "a wildcard address (every interface), not one to dial"
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        return f"port {port[:8]!r} is not a number from 1 to 65535"
    return None


def learned_targets(
    configured: Sequence[str], listed: Sequence[str], limit: int = MAX_LEARNED
) -> tuple[tuple[str, ...], list[str]]:
    """The coordinators to add to ``configured`` from a Welcome's list ``listed``: each
    valid address once, none already configured, at most ``limit``; and why each entry
    left out was (one line each, for the log)."""
    learned: list[str] = []
    problems: list[str] = []
    for entry in listed:
        if (why := learned_address_problem(entry)) is not None:
            problems.append(f"{entry[:80]!r}: {why}")
        elif entry in configured or entry in learned:
            continue
        elif len(learned) >= limit:
            problems.append(f"{entry!r}: beyond the {limit} coordinators taken from a Welcome")
        else:
            learned.append(entry)
    return tuple(learned), problems


def round_order(candidates: Sequence[Candidate], preferred: Candidate | None) -> list[Candidate]:
    """``candidates`` starting with ``preferred`` (the last that worked), in their order."""
    items = list(candidates)
    if preferred in items:
        start = items.index(preferred)
        items = items[start:] + items[:start]
    return items


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


def _probes(
    probe: tuple[str, int] | Sequence[tuple[str, int]] | None,
) -> list[tuple[str, int]]:
    if probe is None:
        return []
    if isinstance(probe[0], str):
        return [cast(tuple[str, int], probe)]
    return list(cast(Sequence[tuple[str, int]], probe))


async def wait_to_retry(
    stopping: asyncio.Event,
    delay_s: float,
    *,
    probe: tuple[str, int] | Sequence[tuple[str, int]] | None,
    probe_interval_s: float,
    rng: random.Random,
) -> None:
    """Wait ``delay_s``, or less: until ``stopping`` is set, or a probed port comes back.

    With ``probe`` (one ``(host, port)`` or several), the ports are tried every
    ``probe_interval_s``; when one was closed and then opens, the wait ends after a random
    fraction of ``probe_interval_s``. Ports that are all open from the first try do not
    shorten the wait (the coordinators are there and failed us for another reason:
    retrying at once would only hammer them).
    """
    deadline = time.monotonic() + delay_s
    probes = _probes(probe)
    if probes:
        first = True
        closed: set[tuple[str, int]] = set()
        while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
            timeout_s = min(probe_interval_s, left)
            answers = await asyncio.gather(*(port_open(h, p, timeout_s) for h, p in probes))
            if first and all(answers):
                break
            if any(ok and where in closed for where, ok in zip(probes, answers, strict=True)):
                left = min(left, rng.uniform(0.0, probe_interval_s))
                deadline = time.monotonic() + left
                break
            closed = {where for where, ok in zip(probes, answers, strict=True) if not ok}
            first = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stopping.wait(), min(probe_interval_s, max(deadline - time.monotonic(), 0))
                )
    left = deadline - time.monotonic()
    if left > 0 and not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), left)
