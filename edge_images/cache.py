"""Where built things are kept (``~/.cache/edgefleet/images``) and how they are keyed."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from edge_images.errors import ImageBuildError


def cache_root() -> Path:
    """``$EDGEFLEET_CACHE_DIR`` or ``~/.cache/edgefleet``, then ``images``: outside the clone,
    so every clone and CI run on the machine shares it."""
    base = os.environ.get("EDGEFLEET_CACHE_DIR") or str(Path.home() / ".cache" / "edgefleet")
    root = Path(base) / "images"
    root.mkdir(parents=True, exist_ok=True)
    return root


def key_of(*parts: Any) -> str:
    """A short digest of JSON-able inputs: a change in any of them is a new key."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def digest_files(paths: Iterable[Path], root: Path | None = None) -> str:
    """sha256 over the names and contents of ``paths`` (files, or every file under a
    directory), in sorted order; names are relative to ``root`` when given."""
    h = hashlib.sha256()
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file()]
        else:
            files.append(path)
    for file in sorted(files):
        name = file.relative_to(root) if root else file
        h.update(str(name).encode() + b"\0")
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:16]


def run(
    step: str,
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 1800,
    capture: bool = True,
) -> str:
    """Run a build tool; on failure raise :class:`ImageBuildError` naming ``step`` with the
    tail of the tool's output. Returns its stdout."""
    full_env = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            list(args),
            env=full_env,
            cwd=cwd,
            capture_output=capture,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(
            f"{step}: {args[0]} is not installed (devtools/system_deps.sh installs it)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{step}: timed out after {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = ((done.stderr or "") + (done.stdout or ""))[-3000:]
        raise ImageBuildError(f"{step} failed ({done.returncode}): {' '.join(args)}\n{tail}")
    return done.stdout or ""


def publish(tmp: Path, final: Path) -> None:
    """Move a finished build output into place atomically (a half-built one never is)."""
    if final.exists():
        if final.is_dir():
            shutil.rmtree(final)
        else:
            final.unlink()
    tmp.rename(final)


def keep_recent(current: Path, pattern: str, keep: int) -> None:
    """Mark ``current`` as just used and remove all but the ``keep`` most recently used
    entries of its kind (``pattern``, a glob in its directory), so a cache that gains a
    key with every commit does not fill the disk. ``current`` and half-built
    (``.partial``) entries are never removed. Call it under the lock that builds them."""
    os.utime(current)
    entries = sorted(
        (p for p in current.parent.glob(pattern) if not p.name.endswith(".partial")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in entries[keep:]:
        if stale == current:
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


class Timer:
    """Seconds since it was made (for the build log's per-step figures)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    @property
    def s(self) -> float:
        return round(time.perf_counter() - self.t0, 2)


@contextlib.contextmanager
def cache_lock(name: str = "build") -> Iterator[None]:
    """An exclusive lock on the cache (builds, and tests that run fixed container names),
    so two clones or CI runs on one machine take turns instead of racing."""
    path = cache_root() / f"{name}.lock"
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
