"""Shared fixtures: model artifacts (built on demand) and free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("EDGEFLEET_ARTIFACTS", REPO / "models" / "artifacts"))
REAL_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2")


def _ensure_built(names: tuple[str, ...]) -> Path:
    missing = [n for n in names if not (ARTIFACTS / n / "manifest.json").is_file()]
    if missing:
        # the build is cached: this is quick when another test session already built them
        subprocess.run(
            [sys.executable, "-m", "models", "build", "--out", str(ARTIFACTS), "--only", *missing],
            cwd=REPO,
            check=True,
        )
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_artifacts() -> Path:
    """The directory holding the tiny random model (built in seconds when missing)."""
    return _ensure_built(("tiny-llama",))


@pytest.fixture(scope="session")
def real_artifacts() -> Path:
    """The directory holding the real quantized models (built when missing: minutes)."""
    return _ensure_built(REAL_MODELS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test is a failing feature: fail the run when anything was skipped."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == 0:
        reporter.write_line(f"FAILED: {len(skipped)} test(s) skipped; skips are not allowed")
        session.exitstatus = 1
