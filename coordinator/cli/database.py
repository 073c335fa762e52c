"""What the CLI's commands do on the coordinator's database directly (no ``--url``): the
store opened in the data directory for one piece of work (``run_offline``), a value the
store or a service refuses (``ValueError``) turned into the CLI's one-line error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from coordinator.cli.client import AdminRequestError
from coordinator.store.interface import FleetStore
from coordinator.store.offline import run_offline

T = TypeVar("T")


def on_database(data_dir: Path, work: Callable[[FleetStore], Awaitable[T]]) -> T:
    """``work(store)`` on the database in ``data_dir``."""
    try:
        return run_offline(data_dir, work)
    except ValueError as exc:
        raise AdminRequestError(str(exc)) from exc
