"""Shared fixtures (model artifacts, built or found up to date once per session), and what
a failed test's report shows of the server processes it ran (tests/server_logs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from devtools.process import ServiceProcess, forget_exited, started_processes
from tests.postgres_cluster import ClusterError, PostgresCluster
from tests.server_logs import report_section

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("EDGEFLEET_ARTIFACTS", REPO / "models" / "artifacts"))
REAL_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2")


def _ensure_built(names: tuple[str, ...]) -> Path:
    # Always run the build: it is cached, so it returns in about a second when the artifacts
    # match the current build key, and rebuilds them when they are stale (e.g. after a
    # BUILD_VERSION bump), which a check for manifest.json alone would miss.
    subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(ARTIFACTS), "--only", *names],
        cwd=REPO,
        check=True,
    )
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_artifacts() -> Path:
    """The directory holding the tiny random model (built in seconds when missing or stale)."""
    return _ensure_built(("tiny-llama",))


@pytest.fixture(scope="session")
def real_artifacts() -> Path:
    """The directory holding the real quantized models (built when missing or stale: minutes)."""
    return _ensure_built(REAL_MODELS)


# What a test needs, as markers (declared in pyproject.toml), so that a run can leave it out
# by name (`make test-fast` deselects all five; `make test` runs everything): by the folder a
# test lives in, and by the fixtures it uses (directly or through other fixtures). A test
# slow for itself (several seconds on a quiet machine: the durations `make test` prints)
# says so by hand.
FOLDER_MARKERS = {
    "e2e": "e2e",  # real processes, most with the real quantized models
    "edge_images": "images",  # buildah/podman images (the folder's fixtures need the tools)
}
FIXTURE_MARKERS = {
    "real_artifacts": "real_models",  # the real quantized models: minutes to build
    "llamacpp_server": "llamacpp",  # llama.cpp, built once per machine: minutes
    "agent_image": "images",
    "empty_agent_image": "images",
    "coordinator_image": "images",
    "tiny_out": "slow",  # a fresh tiny-llama conversion (tests/models): about 12 s
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        path = item.path.resolve()
        folder = path.relative_to(here).parts[0] if path.is_relative_to(here) else ""
        names = {FOLDER_MARKERS[folder]} if folder in FOLDER_MARKERS else set()
        fixtures = getattr(item, "fixturenames", ())
        names |= {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in fixtures}
        for name in sorted(names):
            item.add_marker(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test is a failing feature: fail the run when anything was skipped."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == 0:
        reporter.write_line(f"FAILED: {len(skipped)} test(s) skipped; skips are not allowed")
        session.exitstatus = 1


# Each running (or just exited) ServiceProcess's log length as a test starts: what it logs
# after that is the test's.
_LOG_MARKS = pytest.StashKey[dict[ServiceProcess, int]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    forget_exited()
    item.stash[_LOG_MARKS] = {p: p.lines_logged for p in started_processes()}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report shows, for every server process it ran (started during the
    test, or still running from a fixture), the tracebacks it logged during the test and
    its last log lines: a 5xx comes with its cause."""
    report = yield
    if report.failed:
        marks = item.stash.get(_LOG_MARKS, {})
        for process in started_processes():
            title, text = report_section(process, marks.get(process, 0))
            # a section, not in longrepr: plugins may replace that (schemathesis does)
            report.sections.append((f"server log: {title}", text))
    return report


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL server (tests/postgres_cluster.py) for this session (one per
    xdist worker), stopped and deleted at its end. Its directory is under the system's
    temporary directory, not pytest's (which only root may enter; the server runs as
    postgres). It never skips: a server that cannot start fails the tests that need it,
    saying why."""
    try:
        cluster = PostgresCluster.start()
    except ClusterError as exc:
        failure = str(exc)
    else:
        yield cluster
        cluster.stop()
        return
    pytest.fail(failure, pytrace=False)


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """The URL of a fresh, empty database on the test cluster."""
    return postgres_cluster.create_database()
