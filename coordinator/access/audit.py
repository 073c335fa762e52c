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
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from coordinator.store.admin_db import AdminDatabase

REFUSALS_PER_S = 1.0
REFUSAL_BURST = 20
MAX_FIELD = 512
# Most rows one export or page returns.
MAX_PAGE = 100_000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    at: str
    actor_id: str
    actor_name: str
    role: str
    action: str
    target: str
    peer: str
    outcome: str
    status: int
    detail: str

    def json(self) -> dict[str, object]:
        return {"object": "audit_entry", **asdict(self)}


def _clip(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


class AuditLog:
    """Append and read; nothing else."""

    def __init__(self, db: AdminDatabase) -> None:
        self._db = db
        self._tokens = float(REFUSAL_BURST)
        self._refill_at = time.monotonic()
        #: Refusals not recorded because of the rate cap (since start).
        self.refusals_suppressed = 0
        self._suppressed_since_last = 0

    def append(
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
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO audit_log (at, actor_id, actor_name, role, action, target, peer,"
                " outcome, status, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    datetime.now(UTC).isoformat(timespec="microseconds"),
                    _clip(actor_id), _clip(actor_name), role, _clip(action), _clip(target),
                    _clip(peer), outcome, status, _clip(detail),
                ),
            )  # fmt: skip

    def append_refusal(self, **fields: object) -> bool:
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
        self.append(**fields)  # type: ignore[arg-type]
        return True

    def entries(self, *, since: datetime | None = None, after_seq: int = 0,
                limit: int = MAX_PAGE) -> Iterator[AuditEntry]:  # fmt: skip
        """Rows in the order written, from ``since`` (a time) and after ``after_seq``."""
        since_text = "" if since is None else since.astimezone(UTC).isoformat()
        rows = self._db.query(
            "SELECT * FROM audit_log WHERE seq > ? AND at >= ? ORDER BY seq LIMIT ?",
            after_seq, since_text, min(max(limit, 0), MAX_PAGE),
        )  # fmt: skip
        for r in rows:
            yield AuditEntry(**{k: r[k] for k in r.keys()})  # noqa: SIM118


def to_jsonl(entries: Iterator[AuditEntry]) -> Iterator[str]:
    for entry in entries:
        yield json.dumps(entry.json(), ensure_ascii=False, separators=(",", ":")) + "\n"
