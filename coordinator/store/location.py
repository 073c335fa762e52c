"""Where the fleet store is, and opening it there: SQLite in the data directory (the
default), or PostgreSQL at ``store_url`` (coordinator/config.py builds a ``StoreLocation``
from its settings: ``CoordinatorConfig.store_location()``).

The PostgreSQL backend is imported only when it is chosen: a coordinator installed without
the ``postgres`` extra (psycopg) runs on SQLite as before, and one told to use PostgreSQL
without it says what to install.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from coordinator.errors import StoreError
from coordinator.store.interface import FleetStore

#: The URL schemes that choose PostgreSQL (libpq's).
POSTGRES_SCHEMES = ("postgresql", "postgres")
#: In data_dir, written by a coordinator serving on PostgreSQL: which database this
#: installation's fleet is in, so that a command or a restart that forgot store_url is
#: refused instead of opening (or creating) an empty SQLite fleet beside it.
MARKER_NAME = "store.json"
#: The default statement timeout and pool size (the config's defaults).
STATEMENT_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 10


def check_store_url(url: str) -> str:
    """``url`` when it is empty or a PostgreSQL URL without a password; ValueError else."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ValueError(
            f"store_url must be empty (SQLite in data_dir) or postgresql://USER@HOST:PORT/DB, "
            f"got a URL with scheme {parts.scheme or '(none)'!r}"
        )
    if parts.password is not None or "password=" in parts.query:
        raise ValueError(
            "store_url must not hold the password (it would show in logs and in "
            "/proc/PID/cmdline): set store_password in the environment, or "
            "store_password_file"
        )
    return url


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """The fleet store of one installation: ``url`` empty for SQLite in ``data_dir``."""

    data_dir: Path
    url: str = ""
    password: str = field(default="", repr=False)
    statement_timeout_s: float = STATEMENT_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    @property
    def backend(self) -> str:
        """ "sqlite" or "postgresql"."""
        return "postgresql" if self.url else "sqlite"

    @property
    def marker(self) -> Path:
        return self.data_dir / MARKER_NAME

    def remember_backend(self) -> None:
        """Record in data_dir that this installation's fleet is in PostgreSQL (a no-op on
        SQLite); ``open_store`` on SQLite there is refused from then on."""
        if not self.url:
            return
        from coordinator.store.postgres import display_url  # PostgreSQL in use: installed

        self.data_dir.mkdir(parents=True, exist_ok=True)
        record = {"backend": "postgresql", "url": display_url(self.url)}
        partial = self.marker.with_suffix(".partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(partial, self.marker)

    def _refuse_if_moved(self) -> None:
        try:
            record = json.loads(self.marker.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.marker} cannot be read ({exc}): remove it or fix it") from exc
        if isinstance(record, dict) and record.get("backend") == "postgresql":
            raise StoreError(
                f"data_dir {self.data_dir} belongs to a coordinator whose fleet database is in "
                f"PostgreSQL ({record.get('url', '?')}, recorded in {self.marker}): set "
                "store_url (config file or EDGEFLEET_COORDINATOR_STORE_URL) and its password "
                f"to reach it; to go back to SQLite on purpose, remove {self.marker}"
            )

    def open_store(self, *, migrate: bool = True) -> FleetStore:
        """The store here, not opened yet (``await store.open()``). SQLite is refused in a
        data_dir whose installation moved to PostgreSQL (``remember_backend``)."""
        if not self.url:
            self._refuse_if_moved()
            from coordinator.store.sqlite import SQLiteFleetStore

            return SQLiteFleetStore.in_directory(
                self.data_dir, statement_timeout_s=self.statement_timeout_s, migrate=migrate
            )
        check_store_url(self.url)
        try:
            from coordinator.store.postgres import PostgresFleetStore
        except ImportError as exc:
            raise StoreError(
                f"store_url names PostgreSQL, and its driver is not installed ({exc}): "
                'pip install "edgefleet[postgres]"'
            ) from exc
        return PostgresFleetStore(
            self.url,
            password=self.password,
            statement_timeout_s=self.statement_timeout_s,
            max_connections=self.max_connections,
            migrate=migrate,
        )
