"""Every SQL statement of the coordinator: the store's interface, its backends, migrations.

What lives here:

- ``interface.py``: ``FleetStore``, the whole interface, as async methods that take and
  return records (frozen dataclasses), never rows, cursors or connections;
- one module per resource with its records and its table protocol: ``join_tokens``,
  ``agents`` (agents, sites, removed agents, revoked certificates), ``api_keys``,
  ``generations`` (the desired-state section counter, and ``GenerationCounter`` over it),
  ``last_state`` (the agents' live state snapshots), ``admin_tokens``, ``audit``,
  ``catalog`` (published model versions), ``assignments`` (model rules and per-agent
  choices), ``request_records``, ``rollouts``, ``membership`` (coordinators sharing the
  database, the leader lease and its fencing);
- ``sqlite/``: the default backend, ``SQLiteFleetStore``: one module per resource with its
  SQL, all run on one thread that owns the connection (``sqlite/worker.py``: off the event
  loop, each call within a statement timeout, StoreError past it);
- ``postgres/``: the second backend, ``PostgresFleetStore`` (psycopg 3 and psycopg_pool;
  ``postgres/pool.py``: every call within a statement and lock timeout and a client-side
  deadline; ``postgres/migrations.py``: its own numbered history, run under an advisory
  lock), for fleets that outgrow one machine (``store_url = "postgresql://..."``);
- ``migrations.py``: the SQLite schema's numbered history (``PRAGMA user_version``);
- ``report_json.py``: a load report as both backends keep it in ``agent_last_state``;
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

Adding a backend: a package beside ``sqlite/`` and ``postgres/`` with a class that
implements ``FleetStore`` (a mixin per resource module; each method one statement or one
transaction, bounded by a statement timeout, raising StoreError for what fails), its own
migrations to the same tables, and the choice of backend where the store is made
(``coordinator/app.py``, ``offline.py``). The conformance suite
(tests/coordinator/test_store_conformance*.py, parametrized over the backends by
tests/coordinator/store_backends.py) is what it has to pass.
"""
