"""Nothing got slower: the agent-only serving benchmark on two commits, interleaved.

Runs ``python -m benchmarks.serving_vs_llamacpp --skip-llamacpp`` in a checkout of an
older commit and in this one, alternating (old, new, old, new, ...), ``--runs`` times each,
on the same machine in one sitting, and compares the medians of the single-stream decode
rate and the aggregate throughput at each concurrency.

    python -m benchmarks.before_after --before-tree DIR [--runs 3] [--concurrency 1 16]

``DIR`` is a checkout of the older commit (``git worktree add --detach DIR COMMIT``) whose
``models/artifacts`` holds (or links to) the same artifacts. Writes
``benchmarks/results/before_after.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.results_file import target, write_results
from devtools.process import REPO_ROOT

# the figures compared, per concurrency, from the benchmark's "ours c=N {json}" lines
FIGURES = ("decode_tokens_per_s_p50", "aggregate_tokens_per_s", "ttft_p50_s")


def run_once(tree: Path, concurrency: list[int], python: str) -> dict[str, dict[str, float]]:
    """One benchmark run in ``tree``; its per-concurrency figures."""
    command = [python, "-m", "benchmarks.serving_vs_llamacpp", "--skip-llamacpp",
               "--concurrency", *map(str, concurrency)]  # fmt: skip
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmark failed in {tree}:\n{done.stdout}\n{done.stderr}")
    figures: dict[str, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] == "ours" and parts[1].startswith("c="):
            data = json.loads(parts[2])
            figures[parts[1][2:]] = {name: float(data[name]) for name in FIGURES}
    missing = [str(c) for c in concurrency if str(c) not in figures]
    if missing:
        raise SystemExit(f"no figures for concurrency {missing} in {tree}:\n{done.stdout}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.before_after", description=__doc__)
    parser.add_argument("--before-tree", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args(argv)
    trees = {"before": args.before_tree.resolve(), "after": REPO_ROOT}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    for i in range(args.runs):
        for side, tree in trees.items():
            started = time.perf_counter()
            runs[side].append(run_once(tree, args.concurrency, sys.executable))
            print(f"run {i + 1}/{args.runs} {side}: {json.dumps(runs[side][-1])} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    medians: dict[str, Any] = {
        side: {
            str(c): {
                name: round(statistics.median(r[str(c)][name] for r in side_runs), 4)
                for name in FIGURES
            }
            for c in args.concurrency
        }
        for side, side_runs in runs.items()
    }
    targets: dict[str, Any] = {}
    for c in args.concurrency:
        key = "decode_tokens_per_s_p50" if c == 1 else "aggregate_tokens_per_s"
        before, after = medians["before"][str(c)][key], medians["after"][str(c)][key]
        ratio = round(after / before, 3)
        targets[f"c{c}_{key}_after_over_before"] = target(
            ratio, f">= {1 - args.tolerance}", ratio >= 1 - args.tolerance
        )
    figures = {
        "before_tree": str(trees["before"]),
        "before_commit": _commit(trees["before"]),
        "after_commit": _commit(trees["after"]),
        "runs": runs,
        "medians": medians,
    }
    path = write_results("before_after", figures, targets)
    for name, t in targets.items():
        print(f"  {name}: {t['value']} (target {t['target']}) {'MET' if t['met'] else 'NOT MET'}")
    print(f"-> {path.relative_to(REPO_ROOT)}")
    return 0


def _commit(tree: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    )
    return done.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
