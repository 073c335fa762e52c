"""The audit log: an append-only record of admin actions at the coordinator.

One row per action: when, who (admin token id and name, and its role), what (the
method and route, and its target: agent id, token id...), from where (the peer
address of the HTTP connection, or ``cli`` for the command line) and the outcome
(the HTTP status; ``refused`` for a caller without the role). Rows are only ever
appended: this module has no update or delete path, and the table's triggers make
SQLite refuse both. Export: ``python -m coordinator audit export [--since]`` and
``GET /v1/admin/audit?format=jsonl``.

Refused attempts are recorded too, but at most ``REFUSALS_PER_S`` per second on
average (a burst of ``REFUSAL_BURST``), so an unauthenticated flood cannot grow the
database without bound; the refusals left out are counted in the next refusal
recorded (``detail``) and in a metric.

While the fleet database is away, an entry that cannot be appended is kept, with its
time, in a queue (``coordinator.store.write_behind``) and appended once it is back, in
order; so is every entry after it until the queue is empty. The request it records is
answered as it would be (a refused caller still gets 401), not failed for the audit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from coordinator.store.audit import AuditEntry, AuditTable
from coordinator.store.interface import StoreUnavailableError
from coordinator.store.write_behind import WriteBehind

__all__ = ["MAX_PAGE", "AuditEntry", "AuditLog", "to_jsonl"]

REFUSALS_PER_S = 1.0
REFUSAL_BURST = 20
MAX_FIELD = 512
# Most rows one export or page returns.
MAX_PAGE = 100_000


def _clip(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


class AuditLog:
    """Append and read; nothing else."""

    def __init__(self, store: AuditTable) -> None:
        self._store = store
        #: Entries kept while the database is away, appended in order once it is back.
        self.kept = WriteBehind("audit log", max_pending=10_000)
        self._tokens = float(REFUSAL_BURST)
        self._refill_at = time.monotonic()
        #: Refusals not recorded because of the rate cap (since start).
        self.refusals_suppressed = 0
        self._suppressed_since_last = 0

    async def append(
        self,
        *,
        action: str,
        outcome: str,
        status: int = 0,
        actor_id: str = "",
        actor_name: str = "",
        role: str = "",
        target: str = "",
        peer: str = "",
        detail: str = "",
    ) -> None:
        fields = dict(
            at=datetime.now(UTC), actor_id=_clip(actor_id), actor_name=_clip(actor_name),
            role=role, action=_clip(action), target=_clip(target), peer=_clip(peer),
            outcome=outcome, status=status, detail=_clip(detail),
        )  # fmt: skip

        async def write() -> None:
            await self._store.append_audit(**fields)  # type: ignore[arg-type]

        if self.kept.pending() or not self.kept.store_up():  # after those kept before it
            self.kept.submit(write, f"the audit entry {action}")
            return
        try:
            await write()
        except StoreUnavailableError:
            self.kept.submit(write, f"the audit entry {action}")

    async def append_refusal(self, **fields: object) -> bool:
        """Record a refused attempt unless over the rate cap; True when recorded."""
        now = time.monotonic()
        self._tokens = min(REFUSAL_BURST, self._tokens + (now - self._refill_at) * REFUSALS_PER_S)
        self._refill_at = now
        if self._tokens < 1:
            self.refusals_suppressed += 1
            self._suppressed_since_last += 1
            return False
        self._tokens -= 1
        if self._suppressed_since_last:
            fields["detail"] = (
                f"{fields.get('detail', '')} ({self._suppressed_since_last} refusals before "
                "this one not recorded: rate cap)"
            ).strip()
            self._suppressed_since_last = 0
        await self.append(**fields)  # type: ignore[arg-type]
        return True

    async def entries(self, *, since: datetime | None = None, after_seq: int = 0,
                      limit: int = MAX_PAGE) -> list[AuditEntry]:  # fmt: skip
        """Rows in the order written, from ``since`` (a time) and after ``after_seq``."""
        return await self._store.audit_entries(
            since=since, after_seq=after_seq, limit=min(max(limit, 0), MAX_PAGE)
        )


def to_jsonl(entries: Iterable[AuditEntry]) -> Iterator[str]:
    for entry in entries:
        yield json.dumps(entry.json(), ensure_ascii=False, separators=(",", ":")) + "\n"
