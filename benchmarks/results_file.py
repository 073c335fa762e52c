"""Writing a benchmark's results as ``benchmarks/results/NAME.json`` (DESIGN.md's format)."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def target(value: float | None, expression: str, met: bool) -> dict[str, Any]:
    return {"value": value, "target": expression, "met": met}


def write_results(name: str, figures: dict[str, Any], targets: dict[str, dict[str, Any]]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {
        "benchmark": name,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "figures": figures,
        "targets": targets,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
