"""The audit log as stored (table ``audit_log``, append-only: the schema's triggers refuse
updates and deletes). coordinator/access/audit.py decides what is written."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Protocol


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


class AuditTable(Protocol):
    async def append_audit(
        self,
        *,
        at: datetime,
        actor_id: str,
        actor_name: str,
        role: str,
        action: str,
        target: str,
        peer: str,
        outcome: str,
        status: int,
        detail: str,
    ) -> None:
        """Append one entry (its ``seq`` is the next one)."""
        ...

    async def audit_entries(
        self, *, since: datetime | None, after_seq: int, limit: int
    ) -> list[AuditEntry]:
        """Entries in the order written, at ``since`` or later and after ``after_seq``."""
        ...
