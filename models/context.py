"""What a target build is given: options, a stage timer with progress logs, shared memos."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

__all__ = ["BUILD_VERSION", "BuildContext", "BuildOptions", "StageTimer", "compute_build_key"]

log = logging.getLogger(__name__)

# Bump whenever the pipeline changes in a way that changes artifacts: every cached build
# key changes with it.
BUILD_VERSION: Final = "edgefleet-models-5"


@dataclass(frozen=True)
class BuildOptions:
    """Command-line options of ``python -m models build``."""

    out: Path
    only: tuple[str, ...] | None = None  # target names; None builds all
    force: bool = False  # rebuild even when the cache key matches
    skip_gate: bool = False  # ship the fewest-bits quantized variant without the gate
    threads: int = 2  # CPU threads for torch and onnxruntime
    # A directory shared by every clone on the machine (``~/.cache/edgefleet/models``):
    # a target built once is copied from there. None: build into ``out`` only.
    shared_cache: Path | None = None


def compute_build_key(source_sha256: str, options: dict[str, Any]) -> str:
    """sha256 over the source weights' digest, BUILD_VERSION and the relevant options."""
    payload = json.dumps(
        {"build_version": BUILD_VERSION, "source_sha256": source_sha256, "options": options},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


class StageTimer:
    """Times named stages of one target and logs their start and end with elapsed seconds."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.started = time.perf_counter()
        self.stages: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        log.info("[%s] %s ... (t=%.1fs)", self.target, name, self.elapsed())
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            self.stages[name] = self.stages.get(name, 0.0) + round(seconds, 2)
            log.info("[%s] %s done in %.1fs (t=%.1fs)", self.target, name, seconds, self.elapsed())

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@dataclass
class BuildContext:
    """Shared state of one ``build`` run."""

    options: BuildOptions
    memo: dict[str, Any] = field(default_factory=dict)

    def remember(self, key: str, make: Callable[[], Any]) -> Any:
        """Compute ``make()`` once per run (e.g. the tokenizer shared by two targets)."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    work_root: Path | None = None  # private scratch dir of this run, set by build()

    def work_dir(self, name: str) -> Path:
        """A scratch directory for target ``name``, private to this process."""
        if self.work_root is None:
            raise RuntimeError("BuildContext.work_root is set by build() before targets run")
        return self.work_root / name


def utc_now() -> str:
    """Current time, ISO 8601 UTC, seconds precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()
