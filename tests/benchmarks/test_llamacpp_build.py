"""The llama.cpp peer's build cache: keyed by what it was built for, built once, pruned."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import llamacpp_build
from benchmarks.llamacpp_build import INFO, build_key, ensure_built, venv_dir
from benchmarks.llamacpp_flags import AMX_NOT_LISTED, choose_options, cmake_args
from tests.benchmarks.test_llamacpp_flags import AMD_ZEN3, INTEL_AMX, PROBE_RAN, PROBE_SIGILL


def args_for(flags: frozenset[str], probe: Any) -> list[str]:
    return cmake_args(choose_options(flags, probe))


def test_the_key_differs_for_different_flag_sets() -> None:
    with_amx = args_for(INTEL_AMX, PROBE_RAN)
    without_amx = args_for(INTEL_AMX, PROBE_SIGILL)
    zen3 = args_for(AMD_ZEN3, AMX_NOT_LISTED)
    keys = {build_key(args, "0.3.36", "3.11", "script") for args in (with_amx, without_amx, zen3)}
    assert len(keys) == 3
    assert build_key(with_amx, "0.3.36", "3.11", "script") == build_key(
        list(with_amx), "0.3.36", "3.11", "script"
    )


def test_the_key_differs_for_another_version_python_or_build_script() -> None:
    args = args_for(AMD_ZEN3, AMX_NOT_LISTED)
    key = build_key(args, "0.3.36", "3.11", "script")
    assert build_key(args, "0.3.37", "3.11", "script") != key
    assert build_key(args, "0.3.36", "3.12", "script") != key
    assert build_key(args, "0.3.36", "3.11", "script v2") != key


def test_venvs_for_different_cpus_live_apart_under_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_CACHE_DIR", str(tmp_path))
    amx, no_amx = (
        venv_dir(args_for(INTEL_AMX, PROBE_RAN)),
        venv_dir(args_for(INTEL_AMX, PROBE_SIGILL)),
    )
    assert amx != no_amx
    assert amx.parent == no_amx.parent == tmp_path / "llamacpp"


def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: list[Path]) -> None:
    """ensure_built with this machine's flags and a build that only writes its info."""
    monkeypatch.setenv("EDGEFLEET_CACHE_DIR", str(tmp_path))
    args = args_for(AMD_ZEN3, AMX_NOT_LISTED)
    monkeypatch.setattr(llamacpp_build, "plan", lambda: (args, {"options": {}}))

    def build(venv: Path, args: list[str], chosen: dict[str, Any]) -> dict[str, Any]:
        calls.append(venv)
        time.sleep(0.3)  # long enough for the other caller to reach the lock
        venv.mkdir(parents=True)
        info = {"cmake_args": args}
        (venv / INFO).write_text(json.dumps(info))
        return info

    monkeypatch.setattr(llamacpp_build, "_build", build)


def test_two_processes_wanting_the_peer_build_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    fake_build(tmp_path, monkeypatch, calls)
    results: list[tuple[Path, dict[str, Any]]] = []
    # flock locks conflict between two open()s in one process as between two processes
    threads = [threading.Thread(target=lambda: results.append(ensure_built())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results[0] == results[1] and results[0][0] == calls[0] / "bin" / "python"
    assert ensure_built()[1]["cmake_args"] == args_for(AMD_ZEN3, AMX_NOT_LISTED)
    assert len(calls) == 1


def test_a_build_keeps_the_newest_and_drops_those_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "llamacpp"
    for i, name in enumerate(["old1", "old2", "old3", "old4"]):
        (root / name).mkdir(parents=True)
        (root / name / INFO).write_text("{}")
        os.utime(root / name / INFO, (1000 + i, 1000 + i))
    (root / "cut-short").mkdir()
    calls: list[Path] = []
    fake_build(tmp_path, monkeypatch, calls)
    ensure_built()
    kept = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert kept == sorted(["old4", "old3", calls[0].name])
