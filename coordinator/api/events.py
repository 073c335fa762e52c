"""Live fleet events for the dashboard: every accepted load report and liveness change in,
the changed agents' rows and the series points out to each SSE subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from coordinator.api.views import agent_json
from coordinator.background import running_task
from coordinator.fleet.records import AgentRecord
from coordinator.fleet.series import AgentSeries, FleetSeries
from edgefleet.contract import LoadReport

logger = logging.getLogger(__name__)

# Rows of changed agents are pushed this often (a live update within ~100 ms).
FLUSH_S = 0.025
HEARTBEAT_S = 15.0


# A subscriber that falls this many messages behind is dropped (it reconnects and resyncs).
SUBSCRIBER_QUEUE = 256


class FleetEvents:
    """Fan-out of fleet changes to the dashboard's SSE subscribers (module doc)."""

    def __init__(
        self,
        series: FleetSeries,
        agent_view: Callable[[str], AgentRecord | None],
        report_interval_ms: int,
    ) -> None:
        self.series = series
        self.agent_series = AgentSeries()  # each agent's own hour (the agent page)
        self._agent_view = agent_view
        self._interval_ms = report_interval_ms
        self._dirty: dict[str, float] = {}  # agent id -> receive time (unix ms)
        self._subscribers: set[asyncio.Queue[bytes | None]] = set()
        series.subscribe(self._on_point)

    def on_report(self, agent_id: str, report: LoadReport) -> None:
        """Called for every accepted load report (on the event loop)."""
        self.series.record(report, agent_id)
        self.agent_series.record(agent_id, report)
        if self._subscribers:
            self._dirty.setdefault(agent_id, time.time() * 1000.0)

    def knows(self, agent_id: str) -> bool:
        """The registry has a record of the agent."""
        return self._agent_view(agent_id) is not None

    def on_change(self, agent_id: str) -> None:
        """An agent's state changed without a report (liveness, drain, bye)."""
        if self._subscribers:
            self._dirty.setdefault(agent_id, time.time() * 1000.0)

    def subscribe(self) -> asyncio.Queue[bytes | None]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[bytes | None]) -> None:
        self._subscribers.discard(queue)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def _broadcast(self, event: str, data: Any) -> None:
        message = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:  # too slow: ends its stream, the page reconnects
                self._subscribers.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.get_nowait()
                    queue.put_nowait(None)

    def _on_point(self, point: dict[str, Any]) -> None:
        self._broadcast("point", point)

    def flush(self) -> int:
        """Send the rows of the agents that changed since the last flush; returns how many."""
        self.series.roll()
        if not self._dirty:
            return 0
        dirty, self._dirty = self._dirty, {}
        if not self._subscribers:
            return 0
        now = datetime.now(UTC)
        rows = []
        for agent_id, received_ms in dirty.items():
            record = self._agent_view(agent_id)
            if record is None:
                self.agent_series.forget(agent_id)
                rows.append({"agent_id": agent_id, "removed": True, "received_ms": received_ms})
                continue
            rows.append(agent_json(record, now, self._interval_ms) | {"received_ms": received_ms})
        self._broadcast("agents", {"sent_ms": time.time() * 1000.0, "agents": rows})
        return len(rows)

    def close_streams(self) -> None:
        """End every subscriber's stream (the coordinator is stopping)."""
        for queue in list(self._subscribers):
            self._subscribers.discard(queue)
            if queue.full():  # the end marker goes in even behind a slow reader
                queue.get_nowait()
            queue.put_nowait(None)

    def heartbeat(self) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(b": keep-alive\n\n")


EVENTS_KEY = web.AppKey("fleet_events", FleetEvents)


async def events_flusher(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: flush changed agents every FLUSH_S, heartbeat every HEARTBEAT_S."""
    events = app[EVENTS_KEY]

    async def loop() -> None:
        last_beat = time.monotonic()
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                events.flush()
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    last_beat = time.monotonic()
                    events.heartbeat()
            except Exception:  # keep flushing; log once per failure burst
                logger.exception("dashboard event flush failed")
                await asyncio.sleep(1.0)

    try:
        async with running_task("dashboard events", loop()):
            yield
    finally:
        events.close_streams()


async def end_event_streams(app: web.Application) -> None:
    """on_shutdown: end the open event streams, so that the server's wait for its
    handlers (before cleanup) is not held by dashboards that never hang up: a
    coordinator with a dashboard open stops at once on SIGTERM."""
    app[EVENTS_KEY].close_streams()
