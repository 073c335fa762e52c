"""Which store the coordinator opens (coordinator/store/location.py): SQLite in data_dir by
default, PostgreSQL at store_url, with the password from the environment or a file (a
role that must give it, on the test cluster), shown in no message and no repr."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from coordinator.config import load_config
from coordinator.errors import StoreError
from coordinator.store.offline import run_offline
from coordinator.store.postgres import PostgresFleetStore
from coordinator.store.sqlite import SQLiteFleetStore
from tests.postgres_cluster import PostgresCluster

pytestmark = pytest.mark.timeout(60)

ROLE, PASSWORD = "fleet_owner", "correct-horse-battery-staple"


def test_sqlite_in_data_dir_is_the_default(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path)})
    where = config.store_location()
    assert where.backend == "sqlite" and where.password == ""
    store = where.open_store()
    assert isinstance(store, SQLiteFleetStore) and store.path == tmp_path / "fleet.db"


@pytest.fixture
def owned_database(postgres_cluster: PostgresCluster) -> str:
    """A fresh database owned by a role that must give its password; its URL (no password)."""
    postgres_cluster.create_role(ROLE, PASSWORD)
    url = postgres_cluster.create_database(owner=ROLE)
    return url.replace("postgresql://postgres@", f"postgresql://{ROLE}@")


@pytest.mark.parametrize("source", ["environment", "file"])
def test_postgres_with_the_password_from_the_environment_or_a_file(
    owned_database: str, tmp_path: Path, source: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    environ = {"EDGEFLEET_COORDINATOR_STORE_URL": owned_database}
    if source == "environment":
        environ["EDGEFLEET_COORDINATOR_STORE_PASSWORD"] = PASSWORD
    else:
        secret = tmp_path / "store-password"
        secret.write_text(PASSWORD + "\n")
        secret.chmod(0o600)
        environ["EDGEFLEET_COORDINATOR_STORE_PASSWORD_FILE"] = str(secret)
    config = load_config(environ=environ, overrides={"data_dir": str(tmp_path)})
    where = config.store_location()
    assert where.backend == "postgresql" and where.password == PASSWORD
    assert PASSWORD not in repr(where) and PASSWORD not in repr(config)
    assert isinstance(where.open_store(), PostgresFleetStore)

    async def agents(store: object) -> int:
        assert isinstance(store, PostgresFleetStore)
        return len(await store.list_agents())

    assert run_offline(where, agents) == 0  # connected as the role, and migrated
    assert PASSWORD not in caplog.text


def test_a_wrong_password_is_refused_and_never_shown(
    owned_database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-" + PASSWORD
    config = load_config(
        environ={
            "EDGEFLEET_COORDINATOR_STORE_URL": owned_database,
            "EDGEFLEET_COORDINATOR_STORE_PASSWORD": wrong,
        },
        overrides={"data_dir": str(tmp_path)},
    )
    with pytest.raises(StoreError, match="password authentication failed") as refused:
        run_offline(config.store_location(), lambda store: store.list_agents())
    assert wrong not in str(refused.value) and wrong not in caplog.text
