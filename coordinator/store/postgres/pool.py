"""The PostgreSQL backend's connections: a psycopg_pool pool, and every call bounded.

Callers on the event loop ``await pool.call(fn, *args)``; ``fn(db, *args)`` is a
coroutine given a pooled connection (autocommit: a call that writes more than one
statement opens its own transaction with ``db.transaction()``) and turns rows into
records before it returns: nothing psycopg leaves this package.

Timeouts, on every call: each connection starts with ``statement_timeout`` and
``lock_timeout`` set to ``statement_timeout_s`` (server side: a statement running past it,
or waiting that long for a row or table lock, is cancelled and its transaction rolled
back); waiting for a free connection ends after the same time; and the call as a whole
has a client-side deadline a little beyond it, for a server that stops answering at all
(a network partition: no server-side timeout fires then). What runs past any of them
raises ``StoreTimeoutError``; every other failure a ``StoreError`` naming the call.
``call_with_timeout`` gives the few calls that may rightly run longer (a prune, a copy)
a longer deadline, set for their transaction only (``SET LOCAL``).

The URL never holds a password (coordinator/config.py refuses one): it comes from the
environment or a file and is handed to libpq apart, so it appears in no log line and no
error message (``display_url``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row

from coordinator.errors import StoreError
from coordinator.store.interface import StoreTimeoutError, StoreUnavailableError

logger = logging.getLogger(__name__)

#: The default statement and lock timeout (seconds), as the SQLite backend's.
STATEMENT_TIMEOUT_S = 5.0
#: How much longer than its statement timeout a call may take, client side, before it is
#: abandoned (a server that does not answer at all).
CLIENT_GRACE_S = 2.0
#: Connections the pool keeps open at least / at most.
MIN_CONNECTIONS = 1
MAX_CONNECTIONS = 10

P = ParamSpec("P")
T = TypeVar("T")

Connection = psycopg.AsyncConnection[DictRow]


def display_url(url: str) -> str:
    """The URL without any password, for logs and messages."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(an unreadable URL)"
    user = params.get("user", "")
    host = params.get("host", "")
    port = params.get("port", "")
    database = params.get("dbname", "")
    return f"postgresql://{user}{'@' if user else ''}{host}{':' if port else ''}{port}/{database}"


class PostgresPool:
    """A connection pool to one database; ``open()`` before the first call."""

    def __init__(
        self,
        url: str,
        *,
        password: str = "",
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        min_size: int = MIN_CONNECTIONS,
        max_size: int = MAX_CONNECTIONS,
        application_name: str = "edgefleet-coordinator",
    ) -> None:
        if statement_timeout_s <= 0:
            raise ValueError(f"statement_timeout_s must be positive, got {statement_timeout_s}")
        self.url = url
        self.name = display_url(url)
        self.statement_timeout_s = statement_timeout_s
        timeout_ms = max(1, int(statement_timeout_s * 1000))
        extra: dict[str, Any] = {
            "application_name": application_name,
            "connect_timeout": max(2, int(statement_timeout_s + 0.999)),
            "options": (
                f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} "
                f"-c idle_in_transaction_session_timeout={max(timeout_ms * 4, 60_000)} "
                "-c TimeZone=UTC"
            ),
            # a server gone without a word (cable pulled, machine down) is noticed
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        }
        if password:
            extra["password"] = password
        self._conninfo = make_conninfo(url, **extra)
        self._pool: psycopg_pool.AsyncConnectionPool[Connection] = psycopg_pool.AsyncConnectionPool(
            self._conninfo,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=statement_timeout_s,
            name="fleet-store",
            # a connection the server dropped (a restart, an outage) is replaced, not used
            check=psycopg_pool.AsyncConnectionPool.check_connection,
        )
        self._opened = False
        self._closed = False
        # Calls whose callers stopped waiting (their deadline), still being cancelled.
        self._abandoned: set[asyncio.Future[Any]] = set()

    # ------------------------------------------------------------ lifecycle

    async def open(self, setup: Callable[[Connection], Awaitable[None]]) -> None:
        """Connect, and run ``setup`` (migrations) on one connection without a deadline.
        StoreError when the database cannot be reached or set up."""
        if self._closed:
            raise StoreError(f"the fleet database {self.name} was closed")
        if self._opened:
            return
        try:
            # Setup on a connection of its own first: a server that is not there fails at
            # once, with libpq's reason, rather than after the pool's retries.
            async with await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, row_factory=dict_row
            ) as db:
                await setup(db)
            await self._pool.open(wait=True, timeout=max(10.0, self.statement_timeout_s * 2))
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            await self._pool.close()
            self._closed = True
            raise StoreError(f"cannot open the fleet database {self.name}: {exc}") from exc
        except BaseException:
            await self._pool.close()
            self._closed = True
            raise
        self._opened = True
        logger.info(
            "fleet database %s: open (PostgreSQL, %d connections at most, statement and "
            "lock timeout %g s)", self.name, self._pool.max_size, self.statement_timeout_s,
        )  # fmt: skip

    async def close(self) -> None:
        """Wait for the calls under way, then close every connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._pool.close()

    def _forget(self, task: asyncio.Future[Any]) -> None:
        """An abandoned call ended (its outcome no longer awaited by anyone)."""
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: it was reported to its caller as a timeout

    async def connect(self) -> Connection:
        """A connection of its own, outside the pool (autocommit, the pool's settings): for
        a listener that holds it. StoreUnavailableError when the server cannot be reached."""
        try:
            return await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, row_factory=dict_row
            )
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot connect to {self.name}: {exc}") from exc

    @property
    def running(self) -> bool:
        return self._opened and not self._closed

    # ---------------------------------------------------------------- calls

    async def call(
        self,
        fn: Callable[Concatenate[Connection, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``await fn(db, *args, **kwargs)`` on a pooled connection, within the timeouts."""
        return await self._run(fn.__name__.strip("_"), None, lambda db: fn(db, *args, **kwargs))

    async def call_with_timeout(
        self,
        timeout_s: float,
        fn: Callable[Concatenate[Connection, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Like ``call``, for the few calls that may rightly run longer: ``fn`` runs in a
        transaction whose statement timeout is ``timeout_s``."""

        async def longer(db: Connection) -> T:
            async with db.transaction():
                await db.execute(
                    "SELECT set_config('statement_timeout', %s, true)",
                    (str(max(1, int(timeout_s * 1000))),),
                )
                return await fn(db, *args, **kwargs)

        return await self._run(fn.__name__.strip("_"), timeout_s, longer)

    async def _run(
        self, name: str, timeout_s: float | None, work: Callable[[Connection], Awaitable[T]]
    ) -> T:
        if not self.running:
            raise StoreError(f"the fleet database {self.name} is not open ({name})")
        limit = self.statement_timeout_s if timeout_s is None else timeout_s

        async def in_connection() -> T:
            async with self._pool.connection() as db:
                return await work(db)

        # The call runs as a task of its own that the caller stops waiting for at the
        # deadline: cancelled, psycopg asks the server to cancel the query and waits for
        # it (up to 10 s more against a server that answers nothing at all, a hung or
        # SIGSTOPped one), holding its connection meanwhile; the caller is not held.
        task = asyncio.ensure_future(in_connection())
        try:
            try:
                async with asyncio.timeout(limit + self.statement_timeout_s + CLIENT_GRACE_S):
                    return await asyncio.shield(task)
            except BaseException:
                if not task.done():
                    task.cancel()
                    self._abandoned.add(task)
                    task.add_done_callback(self._forget)
                raise
        except (pg_errors.QueryCanceled, pg_errors.LockNotAvailable) as exc:
            raise StoreTimeoutError(
                f"fleet database {self.name}: {name} ran past the statement timeout of "
                f"{limit:g} s and was stopped (nothing of it was written)"
            ) from exc
        except TimeoutError as exc:
            raise StoreTimeoutError(
                f"fleet database {self.name}: {name} got no answer within {limit:g} s "
                "(the server is slow or unreachable)"
            ) from exc
        except psycopg_pool.PoolTimeout as exc:
            raise StoreTimeoutError(
                f"fleet database {self.name}: {name} got no connection within "
                f"{self.statement_timeout_s:g} s (the server is unreachable, or every "
                "connection is busy)"
            ) from exc
        except psycopg.OperationalError as exc:  # the connection failed or was lost
            raise StoreUnavailableError(f"fleet database {self.name}: {name}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"fleet database {self.name}: {name}: {exc}") from exc
