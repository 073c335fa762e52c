"""Every SQL statement of the coordinator: the store's interface, its backends, migrations.

What lives here:

- ``interface.py``: ``FleetStore``, the whole interface, as async methods that take and
  return records (frozen dataclasses), never rows, cursors or connections;
- one module per resource with its records and its table protocol: ``join_tokens``,
  ``agents`` (agents, sites, removed agents, revoked certificates), ``api_keys``,
  ``generations`` (the desired-state section counter, and ``GenerationCounter`` over it),
  ``last_state`` (the agents' live state snapshots), ``admin_tokens``, ``audit``,
  ``catalog`` (published model versions), ``assignments`` (model rules and per-agent
  choices), ``request_records``, ``rollouts``;
- ``sqlite/``: the default backend, ``SQLiteFleetStore``: one module per resource with its
  SQL, all run on one thread that owns the connection (``sqlite/worker.py``: off the event
  loop, each call within a statement timeout, StoreError past it);
- ``migrations.py``: the SQLite schema's numbered history (``PRAGMA user_version``);
- ``write_behind.py``: for callers that change state in synchronous code (the fleet
  registry): the change in memory at once, its write queued in order, flushed at
  shutdown;
- ``offline.py``: ``run_offline(data_dir, work)``, the store for commands without the
  coordinator's event loop (the CLI's database commands, ``backup.py``, image builds);
- ``backup.py``: ``python -m coordinator backup/restore``; ``fleet_json.py``: a Hello as
  stored.

Nothing outside this package imports a database driver (tests/test_layout_store.py).
Services hold the store (or the table protocols they need) and await its methods; what
they read on hot paths (route lookups, load reports, sessions opening) they keep in memory.

Adding a backend (PostgreSQL next): a package beside ``sqlite/`` with a class that
implements ``FleetStore`` (a mixin per resource module, as ``sqlite/`` does; each method
one statement or one transaction, bounded by a statement timeout, raising StoreError for
what fails), its own migrations to the same tables, and the choice of backend where the
store is made (``coordinator/app.py``, ``offline.py``). tests/coordinator/test_sqlite_store.py
and tests/coordinator/test_store_worker.py are what it has to pass too.
"""
