"""All SQL lives behind the store: no module of the product imports a database driver
(sqlite3 today; psycopg, psycopg_pool or asyncpg for PostgreSQL) outside
``coordinator/store/``. Services call the store's typed, awaited methods (its interface
is coordinator/store/interface.py), so a second backend needs no change elsewhere.

Every ``.py`` file of the product's packages is parsed with ``ast``: ``import sqlite3``,
``import sqlite3 as x``, ``from sqlite3 import Row`` and ``import psycopg.rows`` all
count, at module level, inside functions and under ``TYPE_CHECKING`` alike. Tests may
still open database files with sqlite3 to look inside them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "agent", "coordinator", "models", "edgefleet", "edgefleet_client", "devtools",
    "benchmarks", "edge_images",
)  # fmt: skip
#: The one place allowed to talk to a database.
STORE = REPO / "coordinator" / "store"
DRIVERS = frozenset({"sqlite3", "psycopg", "psycopg_pool", "asyncpg"})


def drivers_imported(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of each database driver ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in DRIVERS]
    return found


def product_modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "v1" not in path.relative_to(REPO).parts[:2]  # generated protobuf code
    )


def test_no_module_outside_the_store_imports_a_database_driver() -> None:
    modules = product_modules()
    assert len(modules) > 100  # the walk found the packages
    offenders = [
        f"{path.relative_to(REPO)}:{line}: import {name}"
        for path in modules
        if not path.is_relative_to(STORE)
        for line, name in drivers_imported(path.read_text(encoding="utf-8"), str(path))
    ]
    assert offenders == [], (
        "database drivers are imported only inside coordinator/store/ (add a store method "
        "instead):\n" + "\n".join(offenders)
    )


def test_the_store_itself_is_where_sqlite_and_psycopg_are_used() -> None:
    """The walk sees the store's own imports: a check that cannot fail proves nothing.
    PostgreSQL's driver stays inside its backend's package, SQLite's outside it."""
    inside = {
        name.split(".")[0]: path
        for path in product_modules()
        if path.is_relative_to(STORE)
        for _, name in drivers_imported(path.read_text(encoding="utf-8"))
    }
    assert {"sqlite3", "psycopg", "psycopg_pool"} <= set(inside)
    postgres = STORE / "postgres"
    for path in product_modules():
        if path.is_relative_to(STORE):
            names = {n.split(".")[0] for _, n in drivers_imported(path.read_text("utf-8"))}
            in_postgres = path.is_relative_to(postgres)
            assert in_postgres or not names & {"psycopg", "psycopg_pool", "asyncpg"}, path
            assert not in_postgres or "sqlite3" not in names, path


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import sqlite3", ["sqlite3"]),
        ("import json, sqlite3 as db", ["sqlite3"]),
        ("from sqlite3 import Row", ["sqlite3"]),
        ("def f():\n    import psycopg.rows\n", ["psycopg.rows"]),
        ("if TYPE_CHECKING:\n    from asyncpg import Connection\n", ["asyncpg"]),
        ("import psycopg_pool", ["psycopg_pool"]),
        ("from . import sqlite3", []),  # a module of our own named so: not the driver
        ("import sqlite3_helpers\nfrom coordinator.store import sqlite", []),
    ],
)
def test_the_finder_sees_every_form_of_import(source: str, expected: list[str]) -> None:
    assert [name for _, name in drivers_imported(source)] == expected
