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

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgpack

from coordinator.errors import ProtocolError, StoreError
from coordinator.store.interface import StoreUnavailableError
from coordinator.store.request_records import RequestRecord, RequestRecordTable
from coordinator.store.write_behind import FIRST_RETRY_S, MAX_RETRY_S, REFUSED_ATTEMPTS
from edgefleet.contract import RecordsAck, RequestRecords

if TYPE_CHECKING:
    from coordinator.store.health import StoreHealth

logger = logging.getLogger(__name__)

MAX_BATCH_BYTES = 1 << 20
MAX_RECORDS_PER_BATCH = 2000
MAX_STRING = 256
MAX_SEQ = 2**62
_MAX_INT = 2**40
_MAX_MS = 1e9
#: Records kept in memory at most while the database is away (about 300 bytes each).
MAX_PENDING_ROWS = 200_000
#: Records written in one transaction at most when several batches wait.
ROWS_PER_WRITE = 5_000

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


@dataclass(slots=True)
class _Kept:
    """A batch validated and waiting for its write; ``done`` answers it once written."""

    agent_id: str
    session: str
    rows: list[RequestRecord]
    result: BatchResult
    done: Callable[[BatchResult], None]


class RequestRecordStore:
    """Stores validated records; ``accept`` answers the ack. ``await load()`` first.

    A session's batches go through ``submit``: validated at once (a ProtocolError for the
    session), then written by one task, in order, several batches a transaction, and
    acknowledged (``done``) only once written: an acknowledged record is in the database.
    While the database is away or too slow, the batches wait in memory (up to
    ``max_pending_rows`` records) and are written when it is back; the agents keep serving
    and keep their records in their spools meanwhile. Past that bound a session's batch,
    and every later one of that session, is left unacknowledged (counted: ``deferred``,
    logged): the agent still holds those records, and once the kept ones are written the
    session is ended (``resend``), so that the agent reconnects and sends them again.
    """

    name = "request records"

    def __init__(
        self,
        store: RequestRecordTable,
        *,
        max_rows: int = 5_000_000,
        max_pending_rows: int = MAX_PENDING_ROWS,
        health: StoreHealth | None = None,
    ) -> None:
        self._store = store
        self.max_rows = max_rows
        self.max_pending_rows = max_pending_rows
        self._health = health
        self._rows = 0
        #: Records refused as invalid since start.
        self.invalid = 0
        #: Records left unacknowledged for the bound (the agents send them again).
        self.deferred = 0
        #: Records given up: the database refused them (not for being away).
        self._dropped = 0
        self._kept: deque[_Kept] = deque()
        self._kept_rows = 0
        self._deferred_sessions: dict[tuple[str, str], None] = {}
        self._writer: asyncio.Task[None] | None = None
        self._resend: Callable[[str, str], None] | None = None
        #: Whether this coordinator prunes the table (the leader only, issue 24: two
        #: coordinators pruning at once would each remove "the oldest tenth").
        self.prunes: Callable[[], bool] = lambda: True

    def bind(self, resend: Callable[[str, str], None]) -> None:
        """``resend(agent_id, session)`` ends a session whose records were deferred."""
        self._resend = resend

    def watched_by(self, health: StoreHealth) -> None:
        self._health = health
        health.watch(self)

    def pending(self) -> int:
        """Records kept in memory, not yet written."""
        return self._kept_rows

    @property
    def dropped(self) -> int:
        return self._dropped

    async def load(self) -> None:
        """Count the records on record (the cap is checked against the count)."""
        self._rows = await self._store.count_request_records()

    def _validated(self, agent_id: str, batch: RequestRecords) -> tuple[list[Any], BatchResult]:
        records = decode_batch(batch)
        if not records:
            return [], BatchResult(None, 0, 0)
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
        self.invalid += invalid
        if invalid:
            logger.warning("agent %s sent %d invalid request records (skipped)", agent_id,
                           invalid)  # fmt: skip
        if batch.dropped:
            logger.warning("agent %s lost %d request records (its spool was full)", agent_id,
                           batch.dropped)  # fmt: skip
        result = BatchResult(
            RecordsAck(batch.first_seq + len(records) - 1),
            len(rows),
            invalid,
            lost_at_agent=batch.dropped,
        )
        return rows, result

    async def accept(self, agent_id: str, batch: RequestRecords) -> BatchResult:
        """Store a batch from ``agent_id`` now; raises ProtocolError for an unusable batch,
        StoreError when the database cannot take it."""
        rows, result = self._validated(agent_id, batch)
        if result.ack is None:
            return result
        stored = await self._store.add_request_records(rows)
        self._rows += stored
        pruned = await self._prune() if self._rows > self.max_rows and self.prunes() else 0
        return replace(result, stored=stored, pruned=pruned)

    def submit(
        self,
        agent_id: str,
        session: str,
        batch: RequestRecords,
        done: Callable[[BatchResult], None],
    ) -> None:
        """Validate a batch of ``session`` now (ProtocolError for an unusable one) and
        write it behind; ``done(result)`` once written (its ack), in the order submitted."""
        rows, result = self._validated(agent_id, batch)
        if result.ack is None:
            return
        key = (agent_id, session)
        if key in self._deferred_sessions or (
            self._kept and self._kept_rows + len(rows) > self.max_pending_rows
        ):
            count = result.ack.through_seq - batch.first_seq + 1
            self.deferred += count
            if key not in self._deferred_sessions:
                self._deferred_sessions[key] = None
                logger.error(
                    "request records: %d are waiting for the fleet database, the most kept; "
                    "agent %s's records from %d on stay in its spool (sent again on its next "
                    "session, which starts once the database is back)",
                    self._kept_rows, agent_id, batch.first_seq,
                )  # fmt: skip
            return
        self._kept.append(_Kept(agent_id, session, rows, result, done))
        self._kept_rows += len(rows)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_kept(), name="request-records-writer"
            )

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every batch submitted so far is written; False past ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._writer is not None:
                    await asyncio.shield(self._writer)
        except TimeoutError:
            return False
        return True

    async def _write_kept(self) -> None:
        pause = FIRST_RETRY_S
        refused = 0
        try:
            while self._kept:
                group = [self._kept[0]]
                size = len(group[0].rows)
                for kept in itertools.islice(self._kept, 1, None):
                    if size + len(kept.rows) > ROWS_PER_WRITE:
                        break
                    group.append(kept)
                    size += len(kept.rows)
                try:
                    stored = await self._store.add_request_records(
                        [row for kept in group for row in kept.rows]
                    )
                except StoreUnavailableError as exc:
                    if self._health is not None:
                        self._health.failed(exc)
                    if pause == FIRST_RETRY_S:
                        logger.warning("request records: %d kept until the fleet database "
                                       "answers: %s", self._kept_rows, exc)  # fmt: skip
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, MAX_RETRY_S)
                    continue
                except StoreError as exc:
                    refused += 1
                    if refused < REFUSED_ATTEMPTS:
                        await asyncio.sleep(FIRST_RETRY_S)
                        continue
                    # never acknowledged: the agents still hold them (sent again)
                    self._dropped += size
                    logger.error("request records: the fleet database refused %d records "
                                 "%d times, left to the agents' spools: %s", size, refused,
                                 exc)  # fmt: skip
                    for kept in group:
                        self._deferred_sessions[(kept.agent_id, kept.session)] = None
                    stored = -1
                if pause != FIRST_RETRY_S and self._health is not None:
                    self._health.succeeded()
                pause, refused = FIRST_RETRY_S, 0
                for _ in group:
                    self._kept.popleft()
                self._kept_rows -= size
                if stored < 0:
                    continue
                self._rows += stored
                over = self._rows > self.max_rows and self.prunes()
                pruned = await self._prune_quietly() if over else 0
                # the database says how many of the group's rows were new (records sent
                # again after a lost ack are not stored twice): the batches' counts add up
                # to that, as ``accept``'s do, so the stored metric counts no duplicate
                left = stored
                for kept in group:
                    new = min(left, len(kept.rows))
                    left -= new
                    try:
                        kept.done(replace(kept.result, stored=new, pruned=pruned))
                    except Exception:
                        logger.exception("request records: acknowledging a batch failed")
                    pruned = 0
            self._resend_deferred()
        finally:
            self._writer = None

    async def _prune_quietly(self) -> int:
        try:
            return await self._prune()
        except StoreError as exc:  # tried again after the next write
            logger.warning("request records: could not prune: %s", exc)
            return 0

    def _resend_deferred(self) -> None:
        """Everything kept is written: the sessions whose records were left unacknowledged
        end, so that their agents send them again."""
        deferred, self._deferred_sessions = self._deferred_sessions, {}
        if not deferred:
            return
        logger.warning("request records: ending %d sessions so that their agents send the "
                       "records left in their spools again", len(deferred))  # fmt: skip
        for agent_id, session in deferred:
            if self._resend is not None:
                self._resend(agent_id, session)

    async def prune_if_over(self) -> int:
        """Count the table's rows (every coordinator's) and prune it when over its cap: the
        leader's periodic job, which also covers the records the others wrote."""
        self._rows = await self._store.count_request_records()
        return await self._prune() if self._rows > self.max_rows else 0

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
