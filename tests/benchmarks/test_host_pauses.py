"""benchmarks/host_pauses: a probe process on a CPU sees that CPU taken away from it (here
by stopping the probe itself with SIGSTOP, as a VM's host stops a virtual CPU), the
benchmark's window counts only the pauses inside it, and a probe whose benchmark died
ends itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from benchmarks.host_pauses import HostPauses

pytestmark = pytest.mark.timeout(60)


def _probe_pids() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "benchmarks.host_pauses" in " ".join(p.info["cmdline"] or [])
    ]


def test_a_cpu_taken_away_is_seen_and_counted_in_its_window_only() -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    host = HostPauses([cpu])
    host.start()
    try:
        time.sleep(1.0)  # the probe is up and waking every millisecond
        (pid,) = _probe_pids()
        before = time.time()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.08)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
        after = time.time()
    finally:
        host.stop()
    seen = [ms for _, when, ms in host.pauses if before - 0.01 <= when <= after]
    assert seen and max(seen) >= 60, host.pauses
    inside = host.between(before - 0.01, after, "w")
    assert inside["host_longest_pause_ms_w"] >= 60
    assert inside["host_pauses_over_10ms_w"] >= 1
    earlier = host.between(before - 100, before - 50, "w")
    assert earlier == {"host_longest_pause_ms_w": 0.0, "host_pauses_over_10ms_w": 0}
    assert not _probe_pids()


def test_a_probe_whose_benchmark_died_ends_itself() -> None:
    script = textwrap.dedent(
        """
        import os, time
        from benchmarks.host_pauses import HostPauses
        host = HostPauses([sorted(os.sched_getaffinity(0))[0]], over_ms=1e6)  # prints nothing
        host.start()
        print(host._probes[0].pid, flush=True)
        time.sleep(0.5)
        os._exit(0)  # gone without stopping its probe
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    probe = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(probe) and psutil.Process(probe).status() != "zombie":
        assert time.monotonic() < deadline, "the orphaned probe is still running"
        time.sleep(0.1)
