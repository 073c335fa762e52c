"""The fleet database's health as the coordinator sees it: up or not, how fast, what failed.

``StoreHealth`` is fed by a periodic probe (``probe()``: one ``SELECT 1`` within a short
timeout, run by the app every ``PROBE_PERIOD_S``) and by the writers that keep what they
could not write (``WriteBehind`` queues, the request records' buffer), which report each
failure and success here. ``/healthz``, the dashboard and ``/metrics`` read it:

- ``ok``: the last probe answered and no kept write is failing;
- ``degraded``: the database did not answer the last probe, or writes are waiting for it
  (they are retried, never dropped unless a buffer's bound is hit: ``dropped``).

Nothing on the hot paths (route lookups, load reports, sessions already open) waits for
the database, so a degraded store slows or refuses only what must be written now (admin
API writes: 503 with Retry-After) and new sessions' authentication.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.errors import StoreError
from coordinator.store.interface import StoreTimeoutError, StoreUnavailableError

logger = logging.getLogger(__name__)

#: How often the app probes the database, and how long one probe may take.
PROBE_PERIOD_S = 1.0
PROBE_TIMEOUT_S = 1.0
#: How long a client is told to wait before retrying a write refused for the store (503).
RETRY_AFTER_S = 5


class Pingable(Protocol):
    async def ping(self) -> None: ...


class KeptWrites(Protocol):
    """A writer that keeps what it could not write (WriteBehind, the records' buffer)."""

    name: str

    def pending(self) -> int:
        """Writes kept, not yet written."""
        ...

    @property
    def dropped(self) -> int:
        """Writes given up since start (a bound hit, or refused by the database)."""
        ...


class StoreHealth:
    """What is known of the database's health (see the module docstring)."""

    def __init__(
        self,
        store: Pingable,
        backend: str,
        database: str = "",
        *,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.backend = backend
        self.database = database
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        #: Whether the database answered the last probe (or write).
        self.up = True
        #: The last probe's round trip (seconds); None before the first.
        self.latency_s: float | None = None
        #: The last failure's text (logged), and its kind: what /healthz tells anyone who
        #: asks (``ERROR_KINDS``).
        self.last_error = ""
        self.last_error_kind = ""
        self.last_error_at: float | None = None
        self.last_ok_at: float | None = None
        #: Since when the database has not answered (None while it does).
        self.down_since: float | None = None
        #: Times it went away since start.
        self.outages = 0
        self._writers: list[KeptWrites] = []

    def watch(self, writer: KeptWrites) -> None:
        """Count ``writer``'s kept writes as the store's pending writes."""
        self._writers.append(writer)

    # ------------------------------------------------------------- feeding it

    async def probe(self) -> None:
        """One round trip within ``probe_timeout_s``; never raises."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                await self._store.ping()
        except TimeoutError:
            self.failed(
                StoreTimeoutError(f"no answer to SELECT 1 within {self.probe_timeout_s:g} s")
            )
        except StoreError as exc:
            self.failed(exc)
        else:
            self.latency_s = time.perf_counter() - started
            self.succeeded()

    def failed(self, error: str | BaseException) -> None:
        """A call to the database failed (the probe, or a kept write)."""
        now = self._clock()
        self.last_error = str(error)[:500]
        self.last_error_kind = error_kind(error)
        self.last_error_at = now
        if self.up:
            self.up = False
            self.down_since = now
            self.outages += 1
            logger.error(
                "fleet database (%s) unavailable: %s; route lookups and sessions carry on "
                "from memory, writes are kept and retried", self.backend, self.last_error,
            )  # fmt: skip

    def succeeded(self) -> None:
        """A call to the database worked."""
        now = self._clock()
        self.last_ok_at = now
        if not self.up:
            away = now - (self.down_since or now)
            self.up = True
            self.down_since = None
            logger.warning(
                "fleet database (%s) available again after %.1f s; %d kept writes to catch up",
                self.backend, away, self.pending_writes(),
            )  # fmt: skip

    # --------------------------------------------------------------- reading it

    def pending_writes(self) -> int:
        return sum(w.pending() for w in self._writers)

    def dropped_writes(self) -> dict[str, int]:
        return {w.name: w.dropped for w in self._writers}

    def deferred_writes(self) -> dict[str, int]:
        """Writes left to their senders for a bound (request records the agents still hold
        and send again), by queue."""
        return {w.name: int(getattr(w, "deferred", 0)) for w in self._writers}

    @property
    def status(self) -> str:
        return "ok" if self.up else "degraded"

    def json(self) -> dict[str, Any]:
        """The ``store`` object of ``/healthz``, which answers anyone on the network: what
        the database failed with as a kind (``ERROR_KINDS``), not the driver's text, and
        not which database (host, port, role or file path); the log has both."""
        return {
            "status": self.status,
            "backend": self.backend,
            "latency_ms": None if self.latency_s is None else round(self.latency_s * 1000, 2),
            "last_error": self.last_error_kind or None,
            "last_error_at": _iso(self.last_error_at),
            "last_ok_at": _iso(self.last_ok_at),
            "down_since": _iso(self.down_since),
            "outages": self.outages,
            "pending_writes": self.pending_writes(),
            "dropped_writes": sum(self.dropped_writes().values()),
            "deferred_writes": sum(self.deferred_writes().values()),
        }

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_StoreCollector(self))


#: What /healthz says a failure was, whatever the driver's words (which name hosts, ports,
#: roles and files).
ERROR_KINDS = {
    "timeout": "no answer within the statement timeout",
    "unavailable": "database unreachable or not accepting connections",
    "refused": "the database refused a statement",
}


def error_kind(error: str | BaseException) -> str:
    """The ``ERROR_KINDS`` text for ``error`` (a plain string counts as refused)."""
    if isinstance(error, StoreTimeoutError | TimeoutError):
        return ERROR_KINDS["timeout"]
    if isinstance(error, StoreUnavailableError | OSError):
        return ERROR_KINDS["unavailable"]
    return ERROR_KINDS["refused"]


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


class _StoreCollector(Collector):
    """edgefleet_coordinator_store_*: read at scrape time."""

    def __init__(self, health: StoreHealth) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        health = self._health
        prefix = "edgefleet_coordinator_store"
        up = GaugeMetricFamily(
            f"{prefix}_up",
            "1 when the fleet database answered the last probe, else 0.",
            labels=["backend"],
        )
        up.add_metric([health.backend], 1.0 if health.up else 0.0)
        yield up
        latency = GaugeMetricFamily(
            f"{prefix}_latency_seconds",
            "Round trip of the last probe of the fleet database (SELECT 1).",
            labels=["backend"],
        )
        if health.latency_s is not None:
            latency.add_metric([health.backend], health.latency_s)
        yield latency
        pending = GaugeMetricFamily(
            f"{prefix}_pending_writes",
            "Writes kept in memory until the fleet database takes them, by queue.",
            labels=["queue"],
        )
        for writer in health._writers:
            pending.add_metric([writer.name], float(writer.pending()))
        yield pending
        dropped = CounterMetricFamily(
            f"{prefix}_writes_dropped",
            "Writes given up (a queue's bound hit, or refused by the database), by queue.",
            labels=["queue"],
        )
        for name, count in health.dropped_writes().items():
            dropped.add_metric([name], float(count))
        yield dropped
        deferred = CounterMetricFamily(
            f"{prefix}_writes_deferred",
            "Writes left to their senders because a queue's bound was hit (request records "
            "stay in the agents' spools and are sent again), by queue.",
            labels=["queue"],
        )
        for name, count in health.deferred_writes().items():
            deferred.add_metric([name], float(count))
        yield deferred
        outages = CounterMetricFamily(
            f"{prefix}_outages", "Times the fleet database stopped answering since start."
        )
        outages.add_metric([], float(health.outages))
        yield outages
