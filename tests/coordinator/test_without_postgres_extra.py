"""An install without the ``postgres`` extra (the edge images, ``pip install edgefleet``)
runs the coordinator on SQLite: nothing imports psycopg until PostgreSQL is asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.fleet import CoordinatorProcess
from devtools.process import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


def _without_psycopg(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python finds psycopg and psycopg_pool missing."""
    for name in ("psycopg", "psycopg_pool"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed (test: no postgres extra)')\n"
        )
    return {"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"}


async def test_the_coordinator_and_its_cli_run_without_psycopg(tmp_path: Path) -> None:
    env = _without_psycopg(tmp_path / "blocked")
    async with CoordinatorProcess(env=env) as coordinator:
        assert await coordinator.get_json("/healthz")
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "tokens", "list", "--data-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=30, check=False, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    asked = subprocess.run(
        [sys.executable, "-m", "coordinator", "--set", "store_url=postgresql://u@127.0.0.1:1/db"],
        env=env, capture_output=True, text=True, timeout=30, check=False, cwd=REPO_ROOT,
    )  # fmt: skip
    assert asked.returncode != 0
    assert "edgefleet[postgres]" in asked.stderr
