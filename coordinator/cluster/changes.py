"""Changes made through one coordinator, applied by every other one sharing its database.

A coordinator serves the agents whose sessions are on it. When an operator changes
something through coordinator A that B and C hold in memory or must act on for their own
agents (an API key minted or revoked; an agent drained, resumed, revoked, removed or
given a fixed site; a model version published, deprecated or deleted, a model rule set or
cleared, an explicit assignment made or cleared), A applies it to its own sessions at
once and ``publish``es a row to the change feed (coordinator/store/changes.py). Every
coordinator runs ``run()``: it waits for a notice (PostgreSQL's ``NOTIFY``) or
``catch_up_s`` at most, reads the rows after the last it applied, in order, and hands
each one not its own to the handler of its kind; the handler rebuilds and pushes the
sections of the agents whose sessions are here. A notice lost while the listener
reconnects costs at most ``catch_up_s``; a feed row lost with its database write (the
coordinator died between the two) is covered by the periodic refreshes that already
reload keys every report interval (not for models: the next models change, or a restart,
reads them again).

The feed starts from the newest row on record when the coordinator starts: what came
before is in the state it loaded. Rows are pruned after ``retention_s``.

Kinds (``KIND_*``) and their handlers are wired in coordinator/app.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from coordinator.errors import StoreError
from coordinator.store.changes import Change, ChangeTable

logger = logging.getLogger(__name__)

#: An API key minted, revoked or changed (subject: its id): every coordinator reloads the
#: keys and pushes its agents' keys sections.
KIND_API_KEYS = "api_keys"
#: An operator action on one agent (subject: its id; detail: drain, resume, revoke,
#: remove or set): the coordinator its session is on acts on it. Also "claimed OWNER
#: EPOCH": its session opened on coordinator OWNER (a stale one elsewhere ends).
KIND_AGENT = "agent"
AGENT_ACTIONS = ("drain", "resume", "revoke", "remove", "set", "claimed")
#: The model catalog, or the rules and explicit assignments, changed (subject: name@version,
#: or the name; detail: coordinator/catalog/catalog.py's CATALOG_CHANGES or assignments.py's
#: ASSIGNMENT_CHANGES): every coordinator reads what changed again and pushes the models
#: sections of its agents whose desired models changed.
KIND_MODELS = "models"

#: How long a coordinator goes without reading the feed when no notice comes (seconds).
CATCH_UP_S = 1.0
#: How long changes are kept (seconds).
RETENTION_S = 3600.0
#: Rows read per round trip.
BATCH = 500

Handler = Callable[[Change], Awaitable[None]]


class ChangeFeed:
    """This coordinator's end of the change feed: ``publish`` what it changed, ``run()``
    to apply what the others did."""

    def __init__(
        self,
        store: ChangeTable,
        origin: str,
        *,
        catch_up_s: float = CATCH_UP_S,
        retention_s: float = RETENTION_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if catch_up_s <= 0:
            raise ValueError(f"catch_up_s must be > 0, got {catch_up_s}")
        self._store = store
        #: This process (its membership incarnation): rows it wrote are not applied again.
        self.origin = origin
        self.catch_up_s = catch_up_s
        self.retention_s = retention_s
        self._clock = clock
        self._handlers: dict[str, Handler] = {}
        #: The newest row read (applied, or this coordinator's own).
        self.seq = 0
        self._started = False
        self.applied: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.publish_failures = 0
        #: Seconds from a row's append (the database's clock) to its apply here (this
        #: machine's clock: as exact as the two clocks agree), for the newest applied.
        self.last_lag_s: float | None = None
        self.last_error: str | None = None

    def on(self, kind: str, handler: Handler) -> None:
        self._handlers[kind] = handler

    # ------------------------------------------------------------ publishing

    async def publish(self, kind: str, subject: str, detail: str = "") -> int | None:
        """Tell the other coordinators; the row's seq, or None when the database did
        not take it (logged: the change itself is in effect and saved, and the others
        pick up keys at their next periodic refresh)."""
        try:
            return await self._store.append_change(kind, subject, detail, self.origin)
        except StoreError as exc:
            self.publish_failures += 1
            logger.warning(
                "change feed: could not tell the other coordinators of %s %s %s: %s",
                kind, subject, detail, exc,
            )  # fmt: skip
            return None

    # --------------------------------------------------------------- applying

    async def start(self) -> None:
        """Begin after the newest change on record (call once the state is loaded)."""
        self.seq = await self._store.last_change_seq()
        self._started = True

    async def run(self) -> None:
        """Apply the others' changes until cancelled."""
        if not self._started:
            await self.start()
        while True:
            try:
                await self._store.wait_for_changes(self.catch_up_s)
            except StoreError as exc:
                self.last_error = str(exc)
                logger.warning("change feed: listener: %s (reading every %g s)", exc,
                               self.catch_up_s)  # fmt: skip
                await asyncio.sleep(self.catch_up_s)
            try:
                await self.catch_up()
            except StoreError as exc:
                self.last_error = str(exc)
                logger.warning("change feed: could not read changes: %s", exc)

    async def catch_up(self) -> int:
        """Apply every change after the last one read; how many were applied."""
        applied = 0
        while True:
            batch = await self._store.changes_after(self.seq, BATCH)
            for change in batch:
                if change.origin != self.origin:
                    await self._apply(change)
                    applied += 1
                self.seq = change.seq
            if len(batch) < BATCH:
                self.last_error = None
                return applied

    async def _apply(self, change: Change) -> None:
        handler = self._handlers.get(change.kind)
        if handler is None:  # a newer coordinator's kind: nothing this version holds
            logger.info("change feed: %s %s: no handler here", change.kind, change.subject)
            return
        try:
            await handler(change)
        except Exception:  # one bad change must not stop the feed
            self.failed[change.kind] = self.failed.get(change.kind, 0) + 1
            logger.exception(
                "change feed: applying %s %s %s failed", change.kind, change.subject,
                change.detail,
            )  # fmt: skip
            return
        self.applied[change.kind] = self.applied.get(change.kind, 0) + 1
        at = change.at if change.at.tzinfo else change.at.replace(tzinfo=UTC)
        self.last_lag_s = max(0.0, self._clock() - at.timestamp())
        logger.info(
            "change feed: applied %s %s %s from %s (seq %d)",
            change.kind, change.subject, change.detail, change.origin, change.seq,
        )  # fmt: skip

    async def prune(self) -> None:
        try:
            pruned = await self._store.prune_changes(self.retention_s)
        except StoreError as exc:
            logger.warning("change feed: could not prune: %s", exc)
            return
        if pruned:
            logger.info("change feed: pruned %d changes older than %g s", pruned,
                        self.retention_s)  # fmt: skip

    # ---------------------------------------------------------------- views

    def json(self) -> dict[str, object]:
        """``/healthz``'s ``change_feed`` object (no error text: the log has it)."""
        return {
            "seq": self.seq,
            "applied": sum(self.applied.values()),
            "lag_s": None if self.last_lag_s is None else round(self.last_lag_s, 3),
            "ok": self.last_error is None,
        }

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_FeedCollector(self))


class _FeedCollector(Collector):
    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        feed = self._feed
        applied = CounterMetricFamily(
            "edgefleet_coordinator_changes_applied",
            "Changes made through other coordinators and applied here, by kind and outcome.",
            labels=["kind", "outcome"],
        )
        for kind in sorted({*feed.applied, *feed.failed, KIND_API_KEYS, KIND_AGENT, KIND_MODELS}):
            applied.add_metric([kind, "ok"], feed.applied.get(kind, 0))
            applied.add_metric([kind, "failed"], feed.failed.get(kind, 0))
        yield applied
        yield CounterMetricFamily(
            "edgefleet_coordinator_change_publish_failures",
            "Changes made here that the database did not take into the feed.",
            value=feed.publish_failures,
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_change_feed_seq",
            "The newest change-feed row this coordinator has read.",
            value=float(feed.seq),
        )
        yield GaugeMetricFamily(
            "edgefleet_coordinator_change_feed_lag_seconds",
            "From the newest applied change's append (database clock) to its apply here "
            "(this machine's clock); NaN before the first.",
            value=float("nan") if feed.last_lag_s is None else feed.last_lag_s,
        )
