"""The SQLite backend's thread: it owns the one connection and runs every call in turn.

A sqlite3 connection belongs to the thread that made it, and SQLite serialises writers
anyway, so one thread per store is both the simplest and the safe choice: callers on the
event loop ``await worker.call(fn, *args)``, ``fn(db, *args)`` runs on the thread (in
the order the calls were made), and its result or exception comes back through a future
while the loop keeps serving. Nothing sqlite3 leaves this package: ``fn`` turns rows into
records before it returns.

Statement timeout: SQLite has none of its own. Each call gets a deadline,
``statement_timeout_s`` (default :data:`STATEMENT_TIMEOUT_S`) from when it starts on the
thread; a progress handler, run every :data:`PROGRESS_STEPS` virtual-machine
instructions, interrupts the statement running past it (sqlite3 raises "interrupted"),
the call's open transaction is rolled back and the caller gets ``StoreTimeoutError``
(coordinator/store/interface.py) saying which call and how long. Waiting for another
connection's write lock (the admin CLI's, a backup's) is bounded by ``busy_timeout``, set
to the same figure; it ends in "database is locked", a StoreError too. Python work inside
``fn`` between statements is not interrupted; the calls of this package do little of it.
A few calls that may rightly run long (pruning millions of request records, a backup)
take a longer deadline (``call_with_timeout``); opening (migrations) has none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from coordinator.errors import StoreError
from coordinator.store.interface import StoreTimeoutError, StoreUnavailableError

logger = logging.getLogger(__name__)

#: How long one store call's statements may run (seconds) before they are interrupted,
#: and how long a call waits for another connection's write lock (the coordinator's
#: ``store_statement_timeout_s``; offline commands use this default).
STATEMENT_TIMEOUT_S = 5.0
#: SQLite virtual-machine instructions between two checks of the deadline (a check is a
#: Python call: about a microsecond every few tens of microseconds of SQL).
PROGRESS_STEPS = 10_000

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(slots=True)
class _Call:
    fn: Callable[[sqlite3.Connection], Any]
    name: str
    timeout_s: float
    future: concurrent.futures.Future[Any]


class SQLiteWorker:
    """One thread, one connection (WAL journal), calls run in order."""

    def __init__(self, path: Path, *, statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> None:
        if statement_timeout_s <= 0:
            raise ValueError(f"statement_timeout_s must be positive, got {statement_timeout_s}")
        self.path = path
        self.statement_timeout_s = statement_timeout_s
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        # Set when the thread has closed the connection and ends.
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._db: sqlite3.Connection | None = None
        # Read and written on the worker thread only.
        self._deadline = float("inf")
        self._interrupted = False

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._closed.is_set()

    # ------------------------------------------------------------ lifecycle

    async def open(self, setup: Callable[[sqlite3.Connection], None]) -> None:
        """Start the thread, connect and run ``setup`` (migrations) there, without a
        deadline. Raises StoreError when the database cannot be opened."""
        if self._thread is not None:
            if self._closed.is_set():
                raise StoreError(f"the fleet database {self.path} was closed")
            return
        self._thread = threading.Thread(target=self._run, name="fleet-store", daemon=True)
        self._thread.start()
        try:
            await self._submit(lambda db: setup(db), "open", float("inf"))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Run the calls already queued, then close the connection and end the thread."""
        if self._thread is None:
            return
        if not self._closed.is_set():
            self._calls.put(None)
        await asyncio.wrap_future(self._stopped)

    # ---------------------------------------------------------------- calls

    async def call(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(db, *args, **kwargs)`` on the thread, within the statement timeout."""
        return await self._submit(
            lambda db: fn(db, *args, **kwargs), fn.__name__.strip("_"), self.statement_timeout_s
        )

    async def call_with_timeout(
        self,
        timeout_s: float,
        fn: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Like ``call``, for the few calls that may rightly run longer."""
        return await self._submit(lambda db: fn(db, *args, **kwargs), fn.__name__.strip("_"),
                                  timeout_s)  # fmt: skip

    async def _submit(
        self, fn: Callable[[sqlite3.Connection], T], name: str, timeout_s: float
    ) -> T:
        if self._thread is None or self._closed.is_set():
            raise StoreError(f"the fleet database {self.path} is not open ({name})")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put(_Call(fn, name, timeout_s, future))
        return await asyncio.wrap_future(future)

    # ------------------------------------------------------- the thread's side

    def _run(self) -> None:
        try:
            while (call := self._calls.get()) is not None:
                if not call.future.set_running_or_notify_cancel():
                    continue  # its caller gave up before it started
                try:
                    result = self._execute(call)
                except BaseException as exc:
                    call.future.set_exception(exc)
                else:
                    call.future.set_result(result)
        finally:
            self._closed.set()
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error as exc:
                    logger.warning("closing the fleet database %s: %s", self.path, exc)
                self._db = None
            while True:  # calls that raced the close
                try:
                    left = self._calls.get_nowait()
                except queue.Empty:
                    break
                if left is not None and left.future.set_running_or_notify_cancel():
                    left.future.set_exception(
                        StoreError(f"the fleet database {self.path} was closed ({left.name})")
                    )
            self._stopped.set_result(None)

    def _execute(self, call: _Call) -> Any:
        db = self._db
        if db is None:
            db = self._db = self._connect()
        self._interrupted = False
        self._deadline = time.monotonic() + call.timeout_s
        try:
            return call.fn(db)
        except sqlite3.Error as exc:
            _roll_back(db)
            if self._interrupted:
                raise StoreTimeoutError(
                    f"fleet database {self.path}: {call.name} ran past the statement timeout "
                    f"of {call.timeout_s:g} s and was stopped (nothing of it was written)"
                ) from exc
            if _locked(exc):  # another process's write lock, held past busy_timeout
                raise StoreTimeoutError(
                    f"fleet database {self.path}: {call.name}: {exc} (another process holds "
                    f"its write lock longer than the statement timeout of {call.timeout_s:g} s)"
                ) from exc
            if _unreadable(exc):  # the disk or the file is away
                raise StoreUnavailableError(
                    f"fleet database {self.path}: {call.name}: {exc}"
                ) from exc
            raise StoreError(f"fleet database {self.path}: {call.name}: {exc}") from exc
        except BaseException:
            _roll_back(db)
            raise
        finally:
            self._deadline = float("inf")

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # timeout= is SQLite's busy handler, in place before the first statement.
            db = sqlite3.connect(self.path, isolation_level=None, timeout=self.statement_timeout_s)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the fleet database {self.path}: {exc}") from exc
        try:
            db.row_factory = sqlite3.Row
            self._switch_to_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            db.set_progress_handler(self._progress, PROGRESS_STEPS)
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"cannot open the fleet database {self.path}: {exc}") from exc
        return db

    def _switch_to_wal(self, db: sqlite3.Connection) -> None:
        """Switching a new file to WAL needs its exclusive lock, and SQLite answers BUSY
        at once, without its busy handler, when two connections switch together (each
        holds a shared lock the other waits on): retried until the statement timeout."""
        deadline = time.monotonic() + self.statement_timeout_s
        pause = 0.005
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if not _locked(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _progress(self) -> int:
        """Non-zero interrupts the running statement."""
        if time.monotonic() > self._deadline:
            self._interrupted = True
            return 1
        return 0


def _roll_back(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            logger.warning("rolling back a failed store call: %s", exc)


@contextmanager
def write(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (BEGIN IMMEDIATE: the write lock from the start); rolled back
    when the block raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        _roll_back(db)
        raise
    db.execute("COMMIT")


def _locked(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "database is locked" in str(exc) or "database is busy" in str(exc)
    )


def _unreadable(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and (
        "disk I/O error" in text or "unable to open database file" in text
    )
