"""Running a shell script in a new network namespace with only loopback (``unshare -n``):
how the tests prove an install needs no network and keep fixed ports private."""

from __future__ import annotations

import subprocess
from pathlib import Path

from edge_images.errors import ImageBuildError


def run_in_netns(script: str, *, cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    """Run ``script`` with ``bash -euo pipefail`` in a fresh network namespace whose loopback
    is up; return its stdout. A failure raises :class:`ImageBuildError` with its output."""
    try:
        done = subprocess.run(
            ["unshare", "-n", "bash", "-c",
             'ip link set lo up && exec bash -euo pipefail -c "$0"', script],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = str(exc.stdout or "") + str(exc.stderr or "")
        raise ImageBuildError(f"script timed out after {timeout_s:.0f} s:\n{out[-6000:]}") from exc
    if done.returncode != 0:
        out = done.stdout + done.stderr
        raise ImageBuildError(f"script failed ({done.returncode}):\n{out[-6000:]}")
    return done.stdout
