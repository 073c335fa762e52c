"""The agents' per-request records at the coordinator: validated, stored, acknowledged.

An agent sends ``RequestRecords`` batches over its session (see
``agent/request_log.py`` for the record fields); records are numbered per agent, the
batch's first one ``first_seq`` and the rest following without gaps. This module checks
a batch the way it would check one from a hostile agent (size caps on the batch, the
records, every string and number; unknown keys ignored; a record that is not a map of
the known shapes is skipped and counted), stores what passes in the store
(coordinator/store/request_records.py) keyed by (agent id, seq) so a batch sent twice
(its ack lost) is stored once, and answers the ``RecordsAck`` the agent drops its spool
up to. Never prompt or completion text: no field holds any, and strings are capped at
256 characters.

The table is bounded: past ``max_rows`` the oldest tenth is deleted (retention; the
audit log, unlike these records, is never pruned).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from coordinator.errors import ProtocolError
from coordinator.store.request_records import RequestRecord, RequestRecordTable
from edgefleet.contract import RecordsAck, RequestRecords

logger = logging.getLogger(__name__)

MAX_BATCH_BYTES = 1 << 20
MAX_RECORDS_PER_BATCH = 2000
MAX_STRING = 256
MAX_SEQ = 2**62
_MAX_INT = 2**40
_MAX_MS = 1e9

_STRINGS = ("key_id", "model", "version", "served_by", "endpoint")
_INTS = ("prompt_tokens", "completion_tokens", "status", "gap")
_FLOATS = ("at", "latency_ms", "ttft_ms")


@dataclass(frozen=True, slots=True)
class BatchResult:
    ack: RecordsAck | None
    stored: int
    invalid: int
    # Records the agent lost before this batch (its spool was full).
    lost_at_agent: int = 0
    # Old records removed here to keep the table under max_rows.
    pruned: int = 0


def _string(value: Any) -> str | None:
    if isinstance(value, str):
        return value[:MAX_STRING]
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_INT:
        return value
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and 0 <= number <= max(_MAX_MS, 1e10):
            return number
    return None


def validate_record(raw: Any) -> dict[str, Any] | None:
    """The record's known fields, checked; None when it is not a usable record."""
    if not isinstance(raw, dict) or len(raw) > 32:
        return None
    out: dict[str, Any] = {}
    for name in _STRINGS:
        if name in raw and raw[name] is not None:
            if (text := _string(raw[name])) is None:
                return None
            out[name] = text
    for name in _INTS:
        if name in raw and raw[name] is not None:
            if (number := _int(raw[name])) is None:
                return None
            out[name] = number
    for name in _FLOATS:
        if name in raw and raw[name] is not None:
            if (real := _float(raw[name])) is None:
                return None
            out[name] = real
    return out


def decode_batch(batch: RequestRecords) -> list[Any]:
    """The batch's records as msgpack objects; ProtocolError when the batch is unusable."""
    if not 1 <= batch.first_seq <= MAX_SEQ:
        raise ProtocolError(f"RequestRecords.first_seq {batch.first_seq} is out of range")
    if len(batch.records_msgpack) > MAX_BATCH_BYTES:
        raise ProtocolError(f"RequestRecords batch over {MAX_BATCH_BYTES} bytes")
    try:
        records = msgpack.unpackb(
            batch.records_msgpack,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_BATCH_BYTES,
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=MAX_RECORDS_PER_BATCH,
            max_map_len=64,
        )
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise ProtocolError(f"RequestRecords.records_msgpack is not a msgpack array: {exc}") \
            from None  # fmt: skip
    if not isinstance(records, list):
        raise ProtocolError("RequestRecords.records_msgpack must be a msgpack array")
    return records


class RequestRecordStore:
    """Stores validated records; ``accept`` answers the ack. ``await load()`` first."""

    def __init__(self, store: RequestRecordTable, *, max_rows: int = 5_000_000) -> None:
        self._store = store
        self.max_rows = max_rows
        self._rows = 0
        #: Records refused as invalid since start.
        self.invalid = 0

    async def load(self) -> None:
        """Count the records on record (the cap is checked against the count)."""
        self._rows = await self._store.count_request_records()

    async def accept(self, agent_id: str, batch: RequestRecords) -> BatchResult:
        """Store a batch from ``agent_id``; raises ProtocolError for an unusable batch."""
        records = decode_batch(batch)
        if not records:
            return BatchResult(None, 0, 0)
        now = time.time()
        rows = []
        invalid = 0
        for offset, raw in enumerate(records):
            record = validate_record(raw)
            if record is None:
                invalid += 1
                continue
            rows.append(RequestRecord(
                agent_id, batch.first_seq + offset, now, record.get("at", 0.0),
                record.get("key_id"), record.get("model", ""), record.get("version", ""),
                record.get("prompt_tokens", 0), record.get("completion_tokens", 0),
                record.get("latency_ms", 0.0), record.get("ttft_ms"),
                record.get("served_by", ""), record.get("endpoint", ""),
                record.get("status", 0), record.get("gap", 0),
            ))  # fmt: skip
        stored = await self._store.add_request_records(rows)
        self._rows += stored
        self.invalid += invalid
        if invalid:
            logger.warning("agent %s sent %d invalid request records (skipped)", agent_id,
                           invalid)  # fmt: skip
        if batch.dropped:
            logger.warning("agent %s lost %d request records (its spool was full)", agent_id,
                           batch.dropped)  # fmt: skip
        pruned = await self._prune() if self._rows > self.max_rows else 0
        return BatchResult(
            RecordsAck(batch.first_seq + len(records) - 1),
            stored,
            invalid,
            lost_at_agent=batch.dropped,
            pruned=pruned,
        )

    async def _prune(self) -> int:
        """Remove the oldest tenth beyond the cap; returns how many rows went."""
        excess = self._rows - self.max_rows + self.max_rows // 10
        removed = await self._store.prune_request_records(excess)
        self._rows = await self._store.count_request_records()
        logger.warning("request records reached their cap of %d: removed the %d oldest",
                       self.max_rows, removed)  # fmt: skip
        return removed

    async def list(
        self, *, agent_id: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        found = await self._store.list_request_records(
            agent_id=agent_id, after_seq=after_seq, limit=limit
        )
        return [r.json() for r in found]

    def count(self) -> int:
        return self._rows
