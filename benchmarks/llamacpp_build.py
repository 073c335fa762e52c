"""llama-cpp-python[server] built for this machine's CPU, once, in a cache shared by clones.

The venv lives in ``$EDGEFLEET_CACHE_DIR/llamacpp/<key>/`` (default
``~/.cache/edgefleet/llamacpp/<key>/``, outside the clone, so every clone, test and CI run
on the machine shares it). The key is the cmake arguments (the instruction sets chosen by
``benchmarks.llamacpp_flags``), the llama-cpp-python version, the Python version and the
source of ``_build`` (what runs pip), so a build made for one kind of CPU is never used on
another: a native build used where the OS does not enable its instructions dies with
SIGILL. The ``KEEP`` most recently used builds are kept.

The build (compiling llama.cpp: about 5-8 minutes on 2 cores) runs under a lock: two
pytest-xdist workers wait for one build. ``build-info.json`` in the venv records what it
was built with; it is written last, so a venv without it is a build that was cut short.

    python -m benchmarks.llamacpp_build   # build if needed, print the build info
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.llamacpp_flags import (
    NEEDS,
    AmxProbe,
    choose_options,
    cmake_args,
    probe_amx,
    read_cpu_flags,
)

VERSION = "0.3.36"  # llama-cpp-python (vendors llama.cpp)
KEEP = 3  # builds kept per machine (other CPU kinds behind a shared home, older versions)
INFO = "build-info.json"
# what the build prints worth showing: pip's steps, cmake's CPU backend, ninja's [n/N] steps
_SHOWN = re.compile(
    r"^\s*(Collecting llama|Building|Created wheel|Installing|Successfully|ERROR|error|"
    r"\s*-- (x86 detected|Including \w+ backend))"
)
_STEP = re.compile(r"^\s*(\[\d+/\d+\]) (.*)")
_OUTPUT = re.compile(r" -o (\S+)")


def _progress(line: str, elapsed_s: float, shown_s: float) -> str | None:
    """The line to print for a line of pip's verbose output, or None: compile steps shortened
    to ``[n/N] target`` at most every 15 s, pip's and cmake's steps as they come."""
    if step := _STEP.match(line):
        if elapsed_s - shown_s < 15:
            return None
        output = _OUTPUT.search(step[2])  # ninja -v: the command line; its -o names the target
        return f"{step[1]} {Path(output[1]).name if output else step[2][:80]}"
    return line.strip() if _SHOWN.match(line) else None


class LlamaCppBuildError(RuntimeError):
    """llama-cpp-python could not be built (the build log says why)."""


def cache_root() -> Path:
    """``$EDGEFLEET_CACHE_DIR/llamacpp``, else ``$XDG_CACHE_HOME/edgefleet/llamacpp``, else
    ``~/.cache/edgefleet/llamacpp``."""
    base = os.environ.get("EDGEFLEET_CACHE_DIR")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgefleet")
    return Path(base).expanduser() / "llamacpp"


def build_key(args: list[str], version: str, python: str, script: str) -> str:
    """The cache key of a build: its cmake arguments, versions and build script, hashed."""
    digest = hashlib.sha256()
    for part in (*args, version, python, script):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def plan() -> tuple[list[str], dict[str, Any]]:
    """The cmake arguments for this machine, and what they were chosen from."""
    flags = read_cpu_flags()
    amx: AmxProbe = probe_amx(flags)
    options = choose_options(flags, amx)
    relevant = sorted(flags & set().union(*NEEDS.values()))
    return cmake_args(options), {
        "cpu_flags": relevant,
        "amx_probe": asdict(amx),
        "options": options,
    }


def venv_dir(args: list[str]) -> Path:
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return cache_root() / build_key(args, VERSION, python, inspect.getsource(_build))


def read_info(venv: Path) -> dict[str, Any] | None:
    """The build info of a complete build in ``venv``; None when there is none."""
    try:
        info: dict[str, Any] = json.loads((venv / INFO).read_text())
    except (OSError, ValueError):
        return None
    return info


def ensure_built() -> tuple[Path, dict[str, Any]]:
    """The python of a llama-cpp-python[server] venv built for this machine, and its build
    info; built first (minutes) when there is none."""
    args, chosen = plan()
    venv = venv_dir(args)
    python = venv / "bin" / "python"
    if (info := read_info(venv)) is not None:
        (venv / INFO).touch()  # used: pruning keeps the newest
        return python, info
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"llama.cpp: another process is building in {root}; waiting", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (info := read_info(venv)) is None:
            info = _build(venv, args, chosen)
            _prune(root, keep=venv)
    return python, info


def _build(venv: Path, args: list[str], chosen: dict[str, Any]) -> dict[str, Any]:
    on = [name for name, value in chosen["options"].items() if value]
    print(
        f"llama.cpp: building llama-cpp-python {VERSION} into {venv} (about 5-8 minutes on 2 "
        f"cores)\n  AMX probe: {chosen['amx_probe']['detail']}\n  CMAKE_ARGS={' '.join(args)}"
        f"\n  on: {' '.join(on) or '(none)'}",
        flush=True,
    )
    shutil.rmtree(venv, ignore_errors=True)  # a build that was cut short
    started = time.monotonic()
    last: collections.deque[str] = collections.deque(maxlen=40)  # the log's tail, for errors
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        log_path = venv / "build.log"
        env = {
            "CMAKE_ARGS": " ".join(args),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(Path.home()),
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }
        # --no-cache-dir: pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so it
        # would hand back a wheel built earlier with other flags (e.g. native)
        command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--verbose",
                   "--no-cache-dir", "--progress-bar", "off",
                   f"llama-cpp-python[server]=={VERSION}"]  # fmt: skip
        with (
            open(log_path, "w") as log,
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ) as pip,
        ):
            assert pip.stdout is not None
            shown = 0.0
            for line in pip.stdout:
                log.write(line)
                last.append(line)
                now = time.monotonic() - started
                if (text := _progress(line, now, shown)) is not None:
                    shown = now
                    print(f"  [{now:4.0f} s] {text}", flush=True)
        if pip.returncode != 0:
            raise LlamaCppBuildError(
                f"building llama-cpp-python failed (exit {pip.returncode}):\n" + "".join(last)
            )
        check = [str(venv / "bin" / "python"), "-c", "import llama_cpp.server"]
        done = subprocess.run(check, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise LlamaCppBuildError(f"llama_cpp.server does not import:\n{done.stderr[-2000:]}")
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    info = {
        "llama_cpp_python": VERSION,
        "cmake_args": args,
        **chosen,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_s": round(time.monotonic() - started),
    }
    (venv / INFO).write_text(json.dumps(info, indent=2) + "\n")
    print(f"llama.cpp: built in {info['build_s']} s", flush=True)
    return info


def _prune(root: Path, keep: Path) -> None:
    """Keep the ``KEEP`` most recently used builds (``keep`` among them); drop builds cut
    short. (The unkeyed ``../llamacpp-venv`` of earlier versions is left to older clones.)"""
    builds = sorted(
        (p for p in root.iterdir() if p.is_dir() and read_info(p) is not None),
        key=lambda p: (p / INFO).stat().st_mtime,
        reverse=True,
    )
    for stale in [p for p in builds if p != keep][KEEP - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)
    for partial in (p for p in root.iterdir() if p.is_dir() and read_info(p) is None):
        shutil.rmtree(partial, ignore_errors=True)  # we hold the lock: no build is running


def describe(info: dict[str, Any]) -> str:
    """One line for logs and benchmark output: version, the options on, AMX's probe."""
    on = [name.removeprefix("GGML_") for name, value in info["options"].items() if value]
    return (
        f"llama-cpp-python {info['llama_cpp_python']}, GGML_NATIVE=OFF, on: "
        f"{' '.join(on) or '(none)'}; AMX probe: {info['amx_probe']['detail']}"
    )


if __name__ == "__main__":
    python, built = ensure_built()
    print(python)
    print(json.dumps(built, indent=2))
