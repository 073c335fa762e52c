"""A throwaway PostgreSQL cluster for tests: Debian's ``postgresql`` server (installed by
devtools/system_deps.sh), started once per test session (per xdist worker) in a temporary
directory, on a free loopback port, and stopped at the end.

``initdb`` refuses to run as root, so as root the server's tools run as the ``postgres``
user (``runuser``), which owns the cluster's directory. The cluster trusts local
connections of its superuser (it listens on 127.0.0.1 only, and lives as long as the test
run; other roles need their password: ``create_role``) and runs without fsync. Nothing
here skips: a server that cannot start is an error naming what failed, with the end of
the server's log.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

#: The database user the tests connect as (the cluster's superuser).
USER = "postgres"
#: Where Debian puts each major version's server programs.
DEBIAN_LIB = Path("/usr/lib/postgresql")
START_TIMEOUT_S = 60
HBA = f"""\
local all {USER} trust
host  all {USER} 127.0.0.1/32 trust
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
"""


class ClusterError(RuntimeError):
    """The test cluster could not be set up (the message says what and why)."""


def server_bin_dir() -> Path:
    """The newest installed server's bin directory (with initdb and pg_ctl)."""
    candidates = sorted(
        (p for p in DEBIAN_LIB.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0),
    )
    if candidates:
        return candidates[-1]
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).parent
    raise ClusterError(
        f"no PostgreSQL server found (no {DEBIAN_LIB}/*/bin/initdb, no initdb on PATH): "
        "install Debian's postgresql (devtools/system_deps.sh does; `make system-deps`)"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresCluster:
    """One running test cluster; ``url(database)`` to connect, ``create_database()`` for a
    fresh database per test."""

    root: Path
    port: int
    bin_dir: Path
    _names: count[int] = field(default_factory=count)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def start(cls, parent: Path | None = None, attempts: int = 3) -> PostgresCluster:
        """A running cluster; a free port can be taken between choosing and binding it
        (xdist workers start theirs at once), so a failed start is tried again on another."""
        for attempt in range(1, attempts + 1):
            root = Path(tempfile.mkdtemp(prefix="edgefleet-pg-", dir=parent))
            cluster = cls(root=root, port=free_port(), bin_dir=server_bin_dir())
            try:
                cluster._init_and_start()
            except ClusterError:
                cluster.stop()
                if attempt == attempts:
                    raise
                continue
            except BaseException:
                cluster.stop()
                raise
            return cluster
        raise AssertionError("unreachable")

    def restart(self) -> None:
        """Start the server (again, after ``stop_server``: same directory, same port)."""
        self._tool(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
            "-t", str(START_TIMEOUT_S), "-o", self._options(), "start",
        )  # fmt: skip

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keep its files: fast shutdown, which ends every client's
        connection (an outage, as clients see it). Not immediate by default: with
        synchronous_commit off (this cluster's default) that would lose the last commits,
        as a crash does; ``mode="immediate"`` for a database that sets it on."""
        self._tool("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def _init_and_start(self) -> None:
        as_root = os.geteuid() == 0
        if as_root:
            try:
                owner = pwd.getpwnam(USER)
            except KeyError as exc:
                raise ClusterError(
                    f"running as root, and there is no '{USER}' user to run initdb as "
                    "(Debian's postgresql package creates it)"
                ) from exc
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._tool(
            "initdb", "-D", str(self.data_dir), "-A", "trust", "-U", USER, "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        # The superuser without a password (the tests' own connections); every other role
        # with one (tests of the store's password handling create such roles).
        (self.data_dir / "pg_hba.conf").write_text(HBA)
        self.restart()

    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory; idempotent."""
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            try:
                self._tool("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            except ClusterError:
                # pg_ctl could not stop it: end the server this cluster started, by its pid
                with contextlib.suppress(OSError, ValueError, IndexError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        shutil.rmtree(self.root, ignore_errors=True)

    def _tool(self, name: str, *args: str) -> str:
        command = [str(self.bin_dir / name), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", USER, "--", *command]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=START_TIMEOUT_S + 30,
                cwd=self.root,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"PostgreSQL test cluster: {name} did not run: {exc}") from exc
        if done.returncode != 0:
            raise ClusterError(
                f"PostgreSQL test cluster: {' '.join(command)} exited {done.returncode}:\n"
                f"{done.stdout}{done.stderr}{self._log_tail()}"
            )
        return done.stdout

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "server log (last lines):\n" + "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------ databases

    def create_database(self, owner: str = USER, *, synchronous_commit: bool = False) -> str:
        """A new, empty database (owned by ``owner``); its URL (as the superuser).
        ``synchronous_commit``: on for this database (a commit acknowledged survives an
        immediate stop, as on a production server; the cluster's default is off)."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as db:
            db.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(owner)
                )
            )
            if synchronous_commit:
                db.execute(
                    sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
                        sql.Identifier(name)
                    )
                )
        return self.url(name)

    def create_role(self, name: str, password: str) -> None:
        """A login role that must give ``password`` (scram-sha-256), once per cluster."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as db:
            exists = db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if exists is None:
                db.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(name), sql.Literal(password)
                    )
                )


#: What a failed database call raises (for code outside coordinator/store/, which never
#: imports a database driver itself: tests/test_layout_store.py).
DatabaseError = psycopg.Error


def async_connect(url: str, application_name: str) -> Any:
    """An autocommit asyncio connection to ``url`` named ``application_name`` (in
    pg_stat_activity): await it, then use it as an async context manager."""
    return psycopg.AsyncConnection.connect(url, autocommit=True, application_name=application_name)
