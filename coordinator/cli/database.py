"""What the CLI's commands do on the coordinator's database directly (no ``--url``): the
store opened where the config says (SQLite in the data directory, or PostgreSQL at
``store_url``) for one piece of work (``run_offline``), a value the
store or a service refuses (``ValueError``) turned into the CLI's one-line error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from coordinator.cli.client import AdminRequestError
from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation
from coordinator.store.offline import run_offline

T = TypeVar("T")


def on_database(where: Path | StoreLocation, work: Callable[[FleetStore], Awaitable[T]]) -> T:
    """``work(store)`` on the database ``where`` says (a Path: SQLite in that data_dir)."""
    try:
        return run_offline(where, work)
    except ValueError as exc:
        raise AdminRequestError(str(exc)) from exc
