"""The agents' per-request records as stored (table ``request_records``, keyed by agent id
and the agent's sequence number, so a batch sent twice is stored once).
coordinator/fleet/request_records.py validates what agents send."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class RequestRecord:
    agent_id: str
    seq: int
    # When the coordinator received it (POSIX seconds).
    received_at: float
    # When the agent served it (POSIX seconds; 0: not said).
    at: float = 0.0
    key_id: str | None = None
    model: str = ""
    version: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    served_by: str = ""
    endpoint: str = ""
    status: int = 0
    # > 0: a gap record, this many records were lost at the agent (its spool was full).
    dropped: int = 0

    def json(self) -> dict[str, Any]:
        return {"object": "request_record", **asdict(self)}


class RequestRecordTable(Protocol):
    async def add_request_records(self, records: Sequence[RequestRecord]) -> int:
        """Store the records whose (agent_id, seq) is new; how many were."""
        ...

    async def count_request_records(self) -> int: ...

    async def prune_request_records(self, count: int) -> int:
        """Delete the ``count`` received longest ago; how many went."""
        ...

    async def list_request_records(
        self, *, agent_id: str | None, after_seq: int, limit: int
    ) -> list[RequestRecord]:
        """By agent id, then seq."""
        ...
