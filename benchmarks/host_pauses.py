"""Pauses of a whole CPU, seen by a real-time probe: what no code in the machine caused.

    .venv/bin/python -m benchmarks.host_pauses --cpu 0 --over-ms 5

A thread pinned to ``--cpu`` with the real-time policy SCHED_FIFO (when allowed: root or
CAP_SYS_NICE) sleeps 1 ms at a time and prints ``<unix time> <ms late>`` for each wake-up
more than ``--over-ms`` late, until it is terminated. A SCHED_FIFO thread runs as soon as it
is woken, ahead of every normal process on its CPU, so a late wake-up means the CPU itself
was not running this machine's code: a virtual machine's CPU taken away by its host (steal
time, which such VMs often do not report), or an interrupt storm. The scale benchmark runs
one per CPU it uses, so that a latency spike can be told apart from the host's (it writes
``host_pauses_*``). Without real-time rights the probe runs at normal priority, says so on
its first line, and its figures then include the machine's own load.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

PERIOD_S = 0.001


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, required=True)
    parser.add_argument("--over-ms", type=float, default=5.0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        realtime = True
    except PermissionError:
        realtime = False
    print(f"realtime {int(realtime)}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    over_s = args.over_ms / 1000
    parent = os.getppid()
    due = time.monotonic() + PERIOD_S
    wakeups = 0
    while True:
        time.sleep(max(0.0, due - time.monotonic()))
        wakeups += 1
        if not wakeups % 1000 and os.getppid() != parent:
            return 0  # whoever started it is gone
        now = time.monotonic()
        late = now - due
        if late > over_s:
            print(f"{time.time() - late:.4f} {late * 1000:.1f}", flush=True)
            due = now
        due += PERIOD_S


if __name__ == "__main__":
    sys.exit(main())


class HostPauses:
    """One probe per CPU of ``cpus`` (subprocesses, from ``start`` to ``stop``), and what
    they saw between two times (``time.time()``)."""

    def __init__(self, cpus: Iterable[int], over_ms: float = 5.0) -> None:
        self._cpus = sorted(cpus)
        self._over_ms = over_ms
        self._probes: list[subprocess.Popen[str]] = []
        self.realtime = False
        # (cpu, when the late wake-up was due (unix time), how late in ms)
        self.pauses: list[tuple[int, float, float]] = []

    def start(self) -> None:
        for cpu in self._cpus:
            command = [sys.executable, "-m", "benchmarks.host_pauses", "--cpu", str(cpu)]
            command += ["--over-ms", str(self._over_ms)]
            self._probes.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))

    def stop(self) -> None:
        realtime = []
        for cpu, probe in zip(self._cpus, self._probes, strict=True):
            probe.terminate()
            out, _ = probe.communicate(timeout=10)
            lines = out.splitlines()
            realtime.append(bool(lines) and lines[0] == "realtime 1")
            for line in lines[1:]:
                when, ms = line.split()
                self.pauses.append((cpu, float(when), float(ms)))
        self.realtime = bool(realtime) and all(realtime)
        self._probes = []

    def between(self, start: float, end: float, name: str) -> dict[str, Any]:
        """``host_pauses_*`` figures for the window ``name``: the longest pause and how many
        over 10 ms, on any of the CPUs."""
        seen = [ms for _, when, ms in self.pauses if start <= when <= end]
        return {
            f"host_longest_pause_ms_{name}": round(max(seen, default=0.0), 1),
            f"host_pauses_over_10ms_{name}": sum(ms > 10 for ms in seen),
        }
