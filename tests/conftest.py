"""Shared fixtures (model artifacts, built or found up to date once per session), and what
a failed test's report shows of the server processes it ran (tests/server_logs.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.process import ServiceProcess, forget_exited, started_processes
from tests.postgres_cluster import ClusterError, PostgresCluster
from tests.server_logs import report_section

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("EDGEFLEET_ARTIFACTS", REPO / "models" / "artifacts"))
# the moderation heads bundle themselves into the MiniLM artifact (issue 28)
REAL_MODELS = (
    "smollm2-135m-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "all-minilm-l6-v2",
    "moderation/all-minilm-l6-v2",
)


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
    "postgres_cluster": "postgres",  # a PostgreSQL server (postgres_url's too)
}
# A test run once per store backend (tests/coordinator/store_backends.py: the ``backend``
# fixture, or ``make_coordinator`` parametrized) asks for the cluster only in its
# PostgreSQL case, by name at run time: that case is marked from its parameter.
BACKEND_PARAMS = ("backend", "make_coordinator")


# `make test` runs each file whole on one of three workers (pytest-xdist --dist loadfile),
# handing out the next file when a worker runs dry, in collection order (the Makefile's
# --no-loadscope-reorder: xdist's own order, most tests first, left the few-test,
# minutes-long end-to-end files for last, and one worker ran one of them for minutes after
# the other had run out). Longest first instead: these files, by their seconds in 2-core
# runs (their tests' durations summed, rounded; on a loaded machine: only the order
# matters), then every other file holding a test marked as heavy (below), then the rest,
# each group in collection order. A new minutes-long file belongs in the table.
FILE_SECONDS = {
    "e2e/test_rollouts_llm_e2e.py": 480,
    "e2e/test_rollouts_e2e.py": 450,
    "e2e/test_demo_e2e.py": 430,
    "edge_images/test_bundle.py": 420,
    "edge_images/test_containerfile.py": 390,
    "edge_images/test_image.py": 300,
    "e2e/test_stream_resume_e2e.py": 240,
    "models/test_models_artifacts_e2e.py": 200,
    "coordinator/test_store_copy.py": 180,
    "edge_images/test_runbook.py": 160,
    "client/test_client_failover.py": 160,
    "coordinator/test_model_changes_feed.py": 150,
    "agent/test_self_check.py": 150,
    "agent/test_memory_soak.py": 140,
    "coordinator/test_rollout_leader_failover.py": 130,
    "coordinator/test_models_process.py": 120,
    "agent/test_resume_numerics.py": 120,
    "models/test_models_tiny.py": 90,
    "e2e/test_dashboard_rollouts_browser.py": 85,
    "coordinator/test_fleet_processes.py": 70,
    "edgefleet/test_tls_hardening.py": 65,
    "edge_images/test_coordinator_postgres.py": 60,
    "agent/test_mdns.py": 60,
    "e2e/test_grafana_prometheus.py": 55,
    "agent/test_coordinator_targets.py": 55,
    "agent/test_engine.py": 50,
}
HEAVY_MARKERS = ("e2e", "images", "llamacpp", "real_models", "slow", "postgres")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _unique_node_ids(items)
    here = Path(__file__).resolve().parent
    heavy_files: set[str] = set()
    for item in items:
        path = item.path.resolve()
        folder = path.relative_to(here).parts[0] if path.is_relative_to(here) else ""
        names = {FOLDER_MARKERS[folder]} if folder in FOLDER_MARKERS else set()
        fixtures = getattr(item, "fixturenames", ())
        names |= {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in fixtures}
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(params.get(name) == "postgres" for name in BACKEND_PARAMS):
            names.add("postgres")
        for name in sorted(names):
            item.add_marker(name)
        if any(item.get_closest_marker(name) for name in HEAVY_MARKERS):
            heavy_files.add(_test_file(item, here))

    def weight(item: pytest.Item) -> int:
        file = _test_file(item, here)
        return FILE_SECONDS.get(file, 1 if file in heavy_files else 0)

    items.sort(key=weight, reverse=True)  # stable: a file's tests keep their order


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """Give every test its own node id. schemathesis names its per-operation items
    ``test_x[POST /v1/completions]`` but (on pytest 9, which builds node ids from a call
    spec it does not pass) leaves their node id ``test_x``; pytest-xdist hands
    tests out by node id, so under ``make test`` it ran one operation per fuzz test and
    reported the rest as nothing (120 of 2,589 tests silently not run, the run still
    green). Such ids get their item's parameter part; any id still shared fails the
    collection, so no test can vanish that way again."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and "[" in item.name and not item.nodeid.endswith("]"):
            params = item.name[item.name.index("[") + 1 : -1]
            item._id = item._id.with_params(params)  # pytest 9's node id
    shared = [n for n, c in Counter(i.nodeid for i in items).items() if c > 1]
    if shared:
        raise pytest.UsageError(f"tests share a node id (xdist would run one): {shared[:5]}")


def _test_file(item: pytest.Item, here: Path) -> str:
    path = item.path.resolve()
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)


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
_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_SETUP] = _cpu_now()
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
    if report.when == "teardown" and _CPU_AT_SETUP in item.stash:  # fixtures' teardown too
        report.user_properties.append((CPU_PROPERTY, _cpu_now() - item.stash[_CPU_AT_SETUP]))
    if report.failed:
        marks = item.stash.get(_LOG_MARKS, {})
        for process in started_processes():
            title, text = report_section(process, marks.get(process, 0))
            # a section, not in longrepr: plugins may replace that (schemathesis does)
            report.sections.append((f"server log: {title}", text))
    return report


# CPU seconds per test file (this process and the processes it started and reaped: the
# servers a test or fixture ran), summed per file at the end like --durations: on 2 cores
# the suite is CPU-bound, so these, more than durations, say where `make test`'s time goes.
CPU_PROPERTY = "cpu_s"
TOP_CPU_FILES = 15


def _cpu_now() -> float:
    own, reaped = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                       resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


_CPU_BY_FILE: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == CPU_PROPERTY:
                _CPU_BY_FILE[report.nodeid.split("::")[0]] += float(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _CPU_BY_FILE:
        return
    total = sum(_CPU_BY_FILE.values())
    terminalreporter.write_sep("=", f"most CPU by test file (of {total:.0f} CPU-s counted)")
    for file, seconds in sorted(_CPU_BY_FILE.items(), key=lambda kv: -kv[1])[:TOP_CPU_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {file}")


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
