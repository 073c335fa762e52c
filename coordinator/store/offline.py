"""The store for commands that run without the coordinator's event loop (the CLI's
database commands, backups, building a model set for an image): ``run_offline(where,
work)`` opens the store ``where`` says (a data directory's SQLite file, or a
``StoreLocation``: coordinator/store/location.py), awaits ``work(store)`` in a loop of its own
(``asyncio.run``) and closes the store again. The coordinator itself opens its store in
its app (coordinator/app.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from coordinator.store.interface import FleetStore
from coordinator.store.location import StoreLocation

T = TypeVar("T")


def run_offline(
    where: Path | StoreLocation,
    work: Callable[[FleetStore], Awaitable[T]],
    *,
    migrate: bool = True,
) -> T:
    """``work(store)`` on the store ``where`` says (a Path: SQLite in that data directory),
    from synchronous code; ``migrate`` False leaves the schema as it is."""
    location = where if isinstance(where, StoreLocation) else StoreLocation(data_dir=where)

    async def main() -> T:
        store = location.open_store(migrate=migrate)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Synchronous code called on a thread that runs an event loop (an async test, a tool
    # built on one): asyncio.run cannot nest, so the work gets a thread and a loop of its
    # own, and this thread waits for it as any blocking call would.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-offline") as pool:
        return pool.submit(asyncio.run, main()).result()
