"""Running a scenario script inside a private network namespace (``unshare -n``): its own
loopback and addresses, never a real NIC. Tests that need mDNS multicast or a non-loopback
local address use it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


#: Skips where the namespace cannot be made (not root, no iproute2): CI runs as root.
needs_netns = pytest.mark.skipif(
    not netns_available(), reason="needs `unshare -n` (root) and iproute2"
)


def run_scenario(setup: str, script: str, *args: str, timeout_s: float) -> Any:
    """``setup`` (shell, e.g. ``ip link set lo up``) then ``python SCRIPT ARGS`` in a new
    namespace; returns the JSON of the script's last ``RESULT {...}`` line."""
    quoted = " ".join(f'"{a}"' for a in args)
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", f'{setup} && exec "{sys.executable}" {script} {quoted}'],
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))
