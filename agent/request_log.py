"""The agent's per-request records: a local spool sent to the coordinator in batches.

One record per API request, never prompt or completion text. A record is a msgpack map:

    seq                int    numbered from 1 in the order written, no gaps
    at                 float  Unix time the request finished
    key_id             str?   the API key's id (None without keys, or when refused)
    model, version     str    model@version that served it ("" when none did)
    endpoint           str    route, e.g. /v1/chat/completions
    prompt_tokens      int    as the response's usage says (streamed or not, also when
    completion_tokens  int    the stream asked for no usage or the client left mid-way)
    latency_ms         float  request start to response end
    ttft_ms            float? request start to the first generated token (None when
                              nothing was generated, e.g. embeddings or a refusal)
    served_by          str    this agent's id
    status             int    HTTP status (499: the client went away)

or a gap record ``{seq, at, gap: N}``: N records were lost because the spool was full.

The spool is an append-only file of those maps (``requests.spool`` under the agent's
state directory) plus ``requests.acked``, the last sequence number the coordinator
acknowledged (``RecordsAck``). Records are removed only once acknowledged, so a restart
(even SIGKILL: a record is one unbuffered write to the file, made before a whole
response goes out, and for a stream right after its last bytes) loses none, and the
coordinator stores by (agent, seq), so records sent again after a lost ack count once.
A torn tail (a write cut short) is cut off on load. The cap is the agent's
``audit.spool_max_bytes``. When the unacknowledged records pass ``max_bytes`` the
oldest go, the loss is counted (``dropped_total``, a metric) and a gap record says so.
The file is rewritten (atomically) without the acknowledged records once they are most
of it. Memory: the unacknowledged records are also held in memory, so at most about
``max_bytes``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry, Counter

logger = logging.getLogger(__name__)

SPOOL_FILE = "requests.spool"
ACKED_FILE = "requests.acked"
DEFAULT_MAX_BYTES = 64 << 20


class RequestLog:
    """The spool. Used from one thread (the event loop)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        if max_bytes < 4096:
            raise ValueError("max_bytes must be at least 4096")
        self.directory = directory
        self.max_bytes = max_bytes
        self._on_drop = on_drop
        #: This agent's id, written in every record (set once the agent knows it).
        self.served_by = ""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._path = directory / SPOOL_FILE
        self._acked_path = directory / ACKED_FILE
        #: Unacknowledged records, oldest first: (seq, packed map).
        self._pending: collections.deque[tuple[int, bytes]] = collections.deque()
        self._pending_bytes = 0
        self.acked = self._read_acked()
        self.next_seq = self.acked + 1
        #: Records lost because the spool was full, since this process started.
        self.dropped_total = 0
        #: Records lost and not yet told to the coordinator (RequestRecords.dropped).
        self.dropped_unreported = 0
        self._load()
        self._file = open(self._path, "ab", buffering=0)  # noqa: SIM115 (kept open)
        if self._pending_bytes > self.max_bytes:
            self._drop_oldest()

    # ------------------------------------------------------------------ writing

    def append(self, record: dict[str, Any]) -> int:
        """Write one record (``seq`` and ``at`` are filled in); returns its seq."""
        seq = self.next_seq
        self.next_seq += 1
        packed = msgpack.packb({**record, "seq": seq, "at": record.get("at") or time.time()})
        self._file.write(packed)
        self._pending.append((seq, packed))
        self._pending_bytes += len(packed)
        if self._pending_bytes > self.max_bytes:
            self._drop_oldest()
        return seq

    def _drop_oldest(self) -> None:
        target = self.max_bytes * 9 // 10
        lost = carried = 0
        while self._pending and self._pending_bytes > target:
            _, packed = self._pending.popleft()
            self._pending_bytes -= len(packed)
            earlier = msgpack.unpackb(packed).get("gap") if b"\xa3gap" in packed else None
            if isinstance(earlier, int):
                carried += earlier  # a gap record that goes carries its count on
            else:
                lost += 1
        self.dropped_total += lost
        self.dropped_unreported += lost
        logger.warning("request log full (%d bytes): dropped the %d oldest records",
                       self.max_bytes, lost)  # fmt: skip
        if self._on_drop is not None:
            self._on_drop(lost)
        self.append({"gap": lost + carried})
        self._rewrite()

    # ------------------------------------------------------------------ sending

    def batch(self, after_seq: int, max_records: int = 500,
              max_bytes: int = 256 << 10) -> tuple[int, bytes, int] | None:  # fmt: skip
        """(first_seq, msgpack array, count) of pending records after ``after_seq``."""
        records: list[Any] = []
        first = 0
        size = 0
        for seq, packed in self._pending:
            if seq <= after_seq:
                continue
            if records and (len(records) >= max_records or size + len(packed) > max_bytes):
                break
            if not records:
                first = seq
            record = msgpack.unpackb(packed)
            record.pop("seq", None)
            records.append(record)
            size += len(packed)
        if not records:
            return None
        return first, msgpack.packb(records), len(records)

    def ack(self, through_seq: int) -> None:
        """The coordinator stored everything up to ``through_seq``: forget it."""
        if through_seq <= self.acked or through_seq >= self.next_seq:
            return
        self.acked = through_seq
        while self._pending and self._pending[0][0] <= through_seq:
            _, packed = self._pending.popleft()
            self._pending_bytes -= len(packed)
        self._write_acked()
        with contextlib.suppress(OSError):
            if self._path.stat().st_size > 2 * self._pending_bytes + (1 << 20):
                self._rewrite()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._file.close()

    # ------------------------------------------------------------------ files

    def _read_acked(self) -> int:
        try:
            return int(self._acked_path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            logger.warning("%s is unreadable: resending every spooled record", self._acked_path)
            return 0

    def _write_acked(self) -> None:
        tmp = self._acked_path.with_suffix(".tmp")
        tmp.write_text(str(self.acked))
        os.replace(tmp, self._acked_path)

    def _load(self) -> None:
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(data)
        good = 0  # where the last whole record ends
        try:
            for record in unpacker:
                good = unpacker.tell()
                if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
                    continue
                seq = record["seq"]
                self.next_seq = max(self.next_seq, seq + 1)
                if seq > self.acked:
                    packed = msgpack.packb(record)
                    self._pending.append((seq, packed))
                    self._pending_bytes += len(packed)
        except (ValueError, msgpack.UnpackException):
            pass
        if good < len(data):
            # A torn or corrupt tail: cut it off, or the records appended after it would
            # be unreadable on the next load.
            logger.warning("%s ends in %d unreadable bytes (cut off)", self._path,
                           len(data) - good)  # fmt: skip
            with open(self._path, "r+b") as spool:
                spool.truncate(good)

    def _rewrite(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for _, packed in self._pending:
                out.write(packed)
        os.replace(tmp, self._path)
        self._file.close()
        self._file = open(self._path, "ab", buffering=0)  # noqa: SIM115


class RequestLogSlot:
    """Where the app finds the spool once the agent opened it (None: records not kept)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.log: RequestLog | None = None
        self._dropped = (
            None
            if registry is None
            else Counter(
                "edgefleet_agent_request_records_dropped",
                "Per-request records lost because the spool was full (each loss leaves a "
                "gap record).",
                registry=registry,
            )
        )

    def open(
        self, directory: Path, served_by: str, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> RequestLog:
        dropped = self._dropped
        self.log = RequestLog(
            directory, max_bytes=max_bytes, on_drop=None if dropped is None else dropped.inc
        )
        self.log.served_by = served_by
        return self.log

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
