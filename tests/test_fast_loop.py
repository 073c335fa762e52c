"""The first test loop (`make test-fast`, docs/development/testing.md): plain `pytest`
imports the tests as `python -m pytest` does, and the markers that leave out what needs the
real models, edge images or llama.cpp are set from a test's folder and fixtures
(tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# one file per way a test is left out, and two that stay (one beside a left-out test)
KEPT = "tests/coordinator/test_routing.py"  # tests/coordinator once shadowed coordinator
LEFT_OUT = {
    "tests/e2e/test_slowloris.py": "e2e (folder)",
    "tests/edge_images/test_wheel_digest.py": "images (folder)",
    "tests/overflow/test_overflow_llamacpp.py": "llamacpp (llamacpp_server fixture)",
}
# PostgreSQL: a test using the cluster's fixture, and one starting a cluster of its own
# (marked by hand), left out beside one that needs no server
POSTGRES_MIXED = "tests/coordinator/test_postgres_store.py"
POSTGRES_KEPT = "test_an_unreachable_server_is_a_store_error_that_never_shows_the_password"
POSTGRES_LEFT_OUT = (
    "test_coordinators_starting_together_migrate_once",
    "test_a_server_that_goes_away_fails_calls_fast_and_is_used_again_when_back",
)
# run once per store backend: the SQLite case stays, the PostgreSQL case is left out
BOTH_BACKENDS = "tests/coordinator/test_store_conformance.py"
MIXED = "tests/agent/test_engine_supervision.py"
MIXED_KEPT = "test_restart_policy_rejects_nonsense"
# real_artifacts through its embedding_client fixture
MIXED_LEFT_OUT = "test_dead_embedding_engine_makes_healthz_503"


def fast_markers() -> str:
    """The marker expression `make test-fast` runs with."""
    for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith("FAST_MARKERS :="):
            return line.split(":=", 1)[1].strip()
    raise AssertionError("the Makefile defines no FAST_MARKERS")


def test_plain_pytest_collects_and_the_fast_markers_leave_out_the_heavy_tests() -> None:
    # -P: nothing put before sys.path (python -m would put the working directory there,
    # which is what hid the shadowing), as when the `pytest` script runs; without the
    # plugins these files do not use (seconds of imports)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
         "-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "no:hypothesispytest",
         "-m", fast_markers(), KEPT, MIXED, BOTH_BACKENDS, POSTGRES_MIXED, *LEFT_OUT],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    summary = done.stdout.splitlines()[-1]
    assert "error" not in summary and not output.startswith("ERROR"), output
    assert "\nERROR" not in output, output
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    files = {line.split("::")[0] for line in collected}
    assert files == {KEPT, MIXED, BOTH_BACKENDS, POSTGRES_MIXED}, (
        f"collected from {sorted(files)}; expected left out: {LEFT_OUT}"
    )
    cases = [line for line in collected if line.startswith(BOTH_BACKENDS)]
    assert any("[sqlite" in c for c in cases), cases
    assert not any("postgres" in c for c in cases), cases
    names = {line.split("::")[1] for line in collected if line.startswith(POSTGRES_MIXED)}
    assert POSTGRES_KEPT in names and not names & set(POSTGRES_LEFT_OUT), names
    names = {line.split("::")[1].split("[")[0] for line in collected if line.startswith(MIXED)}
    assert MIXED_KEPT in names and MIXED_LEFT_OUT not in names, names
