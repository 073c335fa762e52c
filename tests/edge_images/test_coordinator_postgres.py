"""The coordinator image on PostgreSQL: the image carries the ``postgres`` extra (psycopg
with its own libpq, psycopg_pool), and the coordinator started from it as deployed
(podman, read-only root, its own user and entrypoint, host network) runs with
``store_url`` and its password from a mounted file, on the test cluster: it migrates the
database, serves, and its CLI in the container writes there. ``backup`` in the image says
what it lacks (PostgreSQL's client programs are not in it)."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import psycopg

from coordinator.store.postgres import SCHEMA_VERSION
from edge_images.images import UID, ImageBuild
from tests.postgres_cluster import PostgresCluster, free_port

ROLE = "fleet_image"


def test_the_coordinator_image_runs_on_postgresql(
    coordinator_image: ImageBuild,
    podman: dict[str, str],
    postgres_cluster: PostgresCluster,
    tmp_path: Path,
) -> None:
    password = secrets.token_urlsafe(16)
    postgres_cluster.create_role(ROLE, password)
    url = postgres_cluster.create_database(owner=ROLE).replace("postgres@", f"{ROLE}@", 1)
    secret = tmp_path / "store-password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    os.chown(secret, UID, UID)  # the image's user reads it
    http, grpc_port, enroll = free_port(), free_port(), free_port()
    name = f"edgefleet-coordinator-pg-{os.getpid()}"
    env = podman
    run = subprocess.run
    run(["podman", "rm", "-f", name], env=env, capture_output=True, check=False)
    started = run(
        ["podman", "run", "-d", "--name", name, "--read-only", "--network", "host",
         "-v", f"{secret}:/run/secrets/store-password:ro",
         "-e", f"EDGEFLEET_COORDINATOR_ADMIN_TOKEN={secrets.token_urlsafe(32)}",
         "-e", f"EDGEFLEET_COORDINATOR_STORE_URL={url}",
         "-e", "EDGEFLEET_COORDINATOR_STORE_PASSWORD_FILE=/run/secrets/store-password",
         "-e", f"EDGEFLEET_COORDINATOR_HTTP_PORT={http}",
         "-e", f"EDGEFLEET_COORDINATOR_GRPC_PORT={grpc_port}",
         "-e", f"EDGEFLEET_COORDINATOR_ENROLL_PORT={enroll}",
         "-e", f"EDGEFLEET_HEALTHCHECK_PORT={http}",
         coordinator_image.ref],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 90
        while run(["podman", "healthcheck", "run", name], env=env, capture_output=True,
                  check=False).returncode != 0:  # fmt: skip
            state = run(["podman", "inspect", "-f", "{{.State.Running}}", name], env=env,
                        capture_output=True, text=True).stdout.strip()  # fmt: skip
            if state != "true" or time.monotonic() > deadline:
                tail = run(["podman", "logs", name], env=env, capture_output=True, text=True)
                raise AssertionError(f"never healthy (running: {state}):\n{tail.stderr[-3000:]}")
            time.sleep(1)
        # the image's CLI, in the container, on the same database
        token = run(["podman", "exec", name, "edgefleet-coordinator", "tokens", "create",
                     "--site", "store-042"],
                    env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert token.returncode == 0 and token.stdout.strip(), token.stderr
        backup = run(["podman", "exec", name, "edgefleet-coordinator", "backup",
                      "/var/lib/edgefleet/backup"],
                     env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert backup.returncode == 1
        assert "pg_dump is not installed" in backup.stderr, backup.stderr
        logs = run(["podman", "logs", name], env=env, capture_output=True, text=True).stderr
    finally:
        run(["podman", "rm", "-f", "-t", "5", name], env=env, capture_output=True, check=False)
    database = url.rsplit("/", 1)[1]
    shown = f"postgresql://{ROLE}@127.0.0.1:{postgres_cluster.port}/{database}"
    assert f"fleet database {shown}: open" in logs
    assert password not in logs
    with psycopg.connect(postgres_cluster.url(database)) as db:
        assert db.execute("SELECT version FROM edgefleet_schema").fetchone() == (SCHEMA_VERSION,)
        sites = db.execute("SELECT site FROM join_tokens").fetchall()
    assert sites == [("store-042",)]
