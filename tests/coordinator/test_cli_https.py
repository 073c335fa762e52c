"""The operator CLI against a coordinator serving HTTPS with the certificate its own fleet
CA issued (as beyond loopback): every command that talks to it trusts the fleet CA
(``--ca-file``, or the data directory's ``ca/ca.pem``), and without ``--url`` it uses the
configured address with https.

Found by the rollouts end-to-end test run with TLS on: ``rollouts start --url https://...``
had no ``--ca-file`` and failed verifying the coordinator's certificate, as did ``keys``,
``tokens``, ``admin-tokens``, ``agents`` and ``audit``; only ``models`` trusted the fleet
CA. ``agents`` and ``rollouts`` without ``--url`` spoke plain HTTP to the HTTPS port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from devtools.fleet import CoordinatorProcess
from devtools.process import REPO_ROOT

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def coordinator() -> AsyncIterator[CoordinatorProcess]:
    async with CoordinatorProcess(tls=True) as running:
        assert running.http_url.startswith("https://")
        yield running


def cli(coordinator: CoordinatorProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator ARGS`` as an operator runs it, with the admin token."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "EDGEFLEET_ADMIN_TOKEN": coordinator.admin_token},
    )  # fmt: skip


LISTS = [("keys", "list"), ("tokens", "list"), ("admin-tokens", "list"),
         ("rollouts", "list"), ("models", "list")]  # fmt: skip


def reached(done: subprocess.CompletedProcess[str], command: tuple[str, ...]) -> None:
    """The command got the coordinator's answer (a list; 404 for the unknown agent)."""
    if command[0] == "agents":
        assert done.returncode == 1 and "404" in done.stderr, done.stderr
    elif command[0] == "audit":
        assert done.returncode == 0, done.stderr
        assert all(json.loads(line) for line in done.stdout.splitlines())
    else:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["object"] == "list"


@pytest.mark.parametrize(
    "command", [*LISTS, ("audit", "export"), ("agents", "drain", "no-such-agent")],
    ids=lambda c: " ".join(c),
)  # fmt: skip
async def test_every_command_trusts_the_fleet_ca_given_as_ca_file(
    coordinator: CoordinatorProcess, command: tuple[str, ...]
) -> None:
    json_flag = [] if command[0] == "audit" else ["--json"]
    done = cli(coordinator, *command, "--url", coordinator.http_url,
               "--ca-file", str(coordinator.ca_file), *json_flag)  # fmt: skip
    reached(done, command)


@pytest.mark.parametrize(
    "command", [("rollouts", "list"), ("models", "list"), ("agents", "drain", "no-such-agent")],
    ids=lambda c: " ".join(c),
)  # fmt: skip
async def test_without_url_the_configured_https_address_and_its_data_directory_ca(
    coordinator: CoordinatorProcess, command: tuple[str, ...], tmp_path: Path
) -> None:
    port = coordinator.http_url.rsplit(":", 1)[1]
    config = tmp_path / "coordinator.toml"
    config.write_text(f'data_dir = "{coordinator.data_dir}"\nhttp_port = {port}\nhttp_tls = "on"\n')
    done = cli(coordinator, *command, "--config", str(config), "--json")
    reached(done, command)


async def test_a_certificate_of_another_ca_is_still_refused(
    coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    from coordinator.identity.ca import CertificateAuthority

    CertificateAuthority.load_or_create(tmp_path / "other")
    done = cli(coordinator, "keys", "list", "--url", coordinator.http_url,
               "--ca-file", str(tmp_path / "other" / "ca.pem"))  # fmt: skip
    assert done.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
