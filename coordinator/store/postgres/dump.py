"""A PostgreSQL fleet database into one file and back, with PostgreSQL's own tools: the
database half of ``python -m coordinator backup`` and ``restore`` (coordinator/store/backup.py
carries the rest of data_dir beside it).

``dump_database`` runs ``pg_dump --format=custom`` (one consistent snapshot, taken while
the coordinator runs and writes: pg_dump reads in one repeatable-read transaction), without
owners or privileges, so the file restores into a database owned by any role.
``restore_database`` runs ``pg_restore --single-transaction --exit-on-error`` into a
database that holds no tables (all of the dump or none of it is restored); ``replace``
drops the dump's objects first (``--clean --if-exists``).

The tools are PostgreSQL's client programs (Debian's ``postgresql-client``), looked for on
PATH and then in ``/usr/lib/postgresql/*/bin``; the psycopg wheel does not bring them.
pg_dump must be at least as new as the server it dumps (it refuses an older one), and
pg_restore at least as new as the pg_dump that wrote the file: both are checked first,
and a missing or too old tool is an error that says which version to install. The
password goes to the tools in their environment (``PGPASSWORD``), never on a command line;
without one, libpq's own ``PGPASSWORD`` and ``~/.pgpass`` apply, as for the store.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from coordinator.errors import StoreError
from coordinator.store.postgres.migrations import SCHEMA_VERSION
from coordinator.store.postgres.pool import display_url

#: Where Debian installs each major version's client programs (besides PATH).
DEBIAN_LIB = Path("/usr/lib/postgresql")
#: How long a connection attempt and a wait for a table lock may take.
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_S = 60


class DumpError(StoreError):
    """pg_dump or pg_restore could not run, or refused (the message says why and what to do)."""


@dataclass(frozen=True, slots=True)
class DatabaseState:
    """What a database holds, as far as a backup or restore cares."""

    name: str  # display_url: no password
    server_version: str  # "15.14"
    schema_version: int  # edgefleet's PostgreSQL schema version; 0 when none
    tables: tuple[str, ...]  # the tables in its current schema

    @property
    def server_major(self) -> int:
        return major_of(self.server_version)


@dataclass(frozen=True, slots=True)
class Tool:
    path: Path
    version: str  # "15.14"

    @property
    def major(self) -> int:
        return major_of(self.version)


def major_of(version: str) -> int:
    """15 for "15.14", 9 for "9.6.24"... (a major version before 10 counts as its first
    number: none of those is new enough for anything here)."""
    match = re.match(r"\d+", version)
    return int(match.group()) if match else 0


def inspect_database(url: str, password: str = "") -> DatabaseState:
    name = display_url(url)
    try:
        with psycopg.connect(
            url, password=password or None, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True
        ) as db:
            server = str(db.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            tables = tuple(
                str(row[0])
                for row in db.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                    " ORDER BY tablename"
                ).fetchall()
            )
            version = 0
            if "edgefleet_schema" in tables:
                row = db.execute("SELECT version FROM edgefleet_schema WHERE id = 1").fetchone()
                version = 0 if row is None else int(row[0])
    except psycopg.Error as exc:
        raise DumpError(f"cannot open the fleet database {name}: {exc}") from exc
    return DatabaseState(name, server.split()[0], version, tables)


def find_tool(name: str, at_least: int) -> Tool:
    """PostgreSQL's ``name`` (pg_dump, pg_restore) of major version ``at_least`` or newer:
    the one on PATH, else the newest in /usr/lib/postgresql/*/bin."""
    found: list[Tool] = []
    on_path = shutil.which(name)
    candidates = [Path(on_path)] if on_path else []
    candidates += sorted(
        DEBIAN_LIB.glob(f"*/bin/{name}"), key=lambda p: major_of(p.parent.parent.name),
        reverse=True,
    )  # fmt: skip
    for path in candidates:
        version = _tool_version(path)
        if version is None:
            continue
        tool = Tool(path, version)
        if tool.major >= at_least:
            return tool
        found.append(tool)
    package = f"postgresql-client-{at_least}" if at_least else "postgresql-client"
    if not found:
        raise DumpError(
            f"{name} is not installed (not on PATH, nor in {DEBIAN_LIB}/*/bin): a backup of "
            f"a fleet database on PostgreSQL needs PostgreSQL's client programs, version "
            f"{at_least} or newer (Debian: apt-get install {package}; or put {name} on PATH)"
        )
    have = ", ".join(f"{t.version} at {t.path}" for t in found)
    raise DumpError(
        f"the {name} found ({have}) is older than {at_least}, the version it must be at least (the "
        f"{'server' if name == 'pg_dump' else 'pg_dump that wrote the backup'}'s): install "
        f"{package} or newer, or put a newer {name} first on PATH"
    )


def _tool_version(path: Path) -> str | None:
    try:
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    # "pg_dump (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
    match = re.search(r"\)\s+(\d+(?:\.\d+)*)", done.stdout)
    return match.group(1) if done.returncode == 0 and match else None


def _environment(password: str, *, lock_timeout: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if password:
        env["PGPASSWORD"] = password
    env.setdefault("PGCONNECT_TIMEOUT", str(CONNECT_TIMEOUT_S))
    if lock_timeout:  # a restore that would wait on a running coordinator's locks ends
        options = env.get("PGOPTIONS", "")
        env["PGOPTIONS"] = f"{options} -c lock_timeout={LOCK_TIMEOUT_S * 1000}".strip()
    return env


def _run(tool: Tool, args: list[str], env: dict[str, str], **kwargs: Any) -> None:
    try:
        done = subprocess.run(
            [str(tool.path), *args], env=env, stderr=subprocess.PIPE, text=True, check=False,
            **kwargs,
        )  # fmt: skip
    except OSError as exc:
        raise DumpError(f"{tool.path.name} did not run: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise DumpError(f"{tool.path.name} {tool.version} failed (exit {done.returncode}): {tail}")


def dump_database(url: str, password: str, destination: Path) -> tuple[DatabaseState, Tool]:
    """Dump the fleet database at ``url`` into ``destination`` (a new file, 0600)."""
    state = inspect_database(url, password)
    if state.schema_version == 0:
        raise DumpError(
            f"{state.name} holds no fleet database (no edgefleet_schema table): is store_url "
            "right? A coordinator creates its tables when it first starts there"
        )
    if state.schema_version > SCHEMA_VERSION:
        raise DumpError(
            f"the fleet database {state.name} has schema version {state.schema_version}, "
            f"newer than this coordinator's {SCHEMA_VERSION}: back it up with a coordinator "
            "at least as new as the one that wrote it"
        )
    tool = find_tool("pg_dump", state.server_major)
    fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            _run(
                tool,
                ["--format=custom", "--no-owner", "--no-acl",
                 f"--lock-wait-timeout={LOCK_TIMEOUT_S * 1000}", "--dbname", url],
                _environment(password), stdout=out,
            )  # fmt: skip
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        destination.unlink(missing_ok=True)
        raise
    return state, tool


def restore_database(
    url: str,
    password: str,
    dump: Path,
    *,
    dumped_with: str,
    schema_version: int,
    replace: bool = False,
) -> DatabaseState:
    """Restore ``dump`` (written by pg_dump ``dumped_with``, edgefleet schema
    ``schema_version``) into the database at ``url``, which must hold no tables unless
    ``replace``; all or nothing. Returns the database as restored."""
    target = inspect_database(url, password)
    if target.tables and not replace:
        shown = ", ".join(target.tables[:5]) + (", ..." if len(target.tables) > 5 else "")
        raise DumpError(
            f"the database {target.name} is not empty (it holds {len(target.tables)} tables: "
            f"{shown}): restore into a new, empty database (CREATE DATABASE ... OWNER ...), "
            "or pass --force to replace the fleet tables in it"
        )
    if replace and target.schema_version > schema_version:
        raise DumpError(
            f"the database {target.name} has fleet schema version {target.schema_version}, "
            f"newer than the backup's {schema_version}: --force would leave tables of the "
            "newer version behind; restore into a new, empty database"
        )
    tool = find_tool("pg_restore", major_of(dumped_with))
    _run(
        tool,
        ["--no-owner", "--no-acl", "--single-transaction", "--exit-on-error",
         *(["--clean", "--if-exists"] if replace else []), "--dbname", url, str(dump)],
        _environment(password, lock_timeout=True), stdout=subprocess.DEVNULL,
    )  # fmt: skip
    restored = inspect_database(url, password)
    if restored.schema_version != schema_version:
        raise DumpError(
            f"after pg_restore the database {restored.name} has fleet schema version "
            f"{restored.schema_version}, not the backup's {schema_version}"
        )
    return restored
