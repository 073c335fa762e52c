"""A rollout step's gate: what the moved agents must show before the rollout goes on.

A step passes only when, on the agents it moved (``evaluate_gate``):

- every one has the new version LOADED and its on-box self-check passed
  (``ModelInventory.self_check``); a FAILED state or a failed self-check fails the step;
- at least ``min_requests`` requests were served by the new version on them since the
  step started (fewer: the step has not passed, it waits);
- their error rate (``failed / requests``) is at most ``max_error_rate``;
- the TTFT p99 of the new version, from the MERGED per-bucket histograms of every moved
  agent's ``ModelStats``, is at most ``max_ttft_p99_ratio`` times the previous version's
  p99; percentiles are never averaged. The previous version's p99 comes from the agents
  the rollout has NOT moved, over the same step (a control group under the same load and
  at the same time, as canary analysis does), when they served at least
  ``min_baseline_requests``; otherwise (the last wave moves everyone) from the previous
  version's history: the hour before the rollout plus what unmoved agents served during
  it. Requests the old version served on a moved agent while it swapped (loading the new
  version, running its self-check) count toward neither: they measure the swap;
- the soak time has passed (wall clock since the step's stored start, paused time
  excluded).

The error-rate and TTFT checks fail a step as soon as ``min_requests`` requests are in,
before the soak ends: a bad version is stopped as early as the evidence allows.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgefleet.contract import Histogram, ModelInventory, ModelInventoryState, ModelStats

# What one report's stats entry may hold at most (anything beyond is an agent lying).
MAX_BUCKETS = 128
MAX_REQUESTS_PER_REPORT = 10_000_000


class InvalidStats(ValueError):
    """A ModelStats entry that cannot be true (ignored, never merged)."""


@dataclass(slots=True)
class MergedHistogram:
    """Per-bucket counts summed over agents and report intervals.

    Bounds are those of the first histogram merged. A histogram with other bounds is
    re-bucketed: each of its buckets' counts goes to the bucket holding that bucket's
    upper bound (never lower: a merge cannot make a version look faster).
    """

    upper_bounds: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts)

    def add(self, histogram: Histogram | MergedHistogram) -> None:
        bounds = tuple(histogram.upper_bounds)
        counts = list(histogram.counts)
        check_histogram(bounds, counts)
        if not any(counts):
            return
        if not self.counts:
            self.upper_bounds = bounds
            self.counts = [0] * (len(bounds) + 1)
        self.sum += histogram.sum
        if bounds == self.upper_bounds:
            for i, count in enumerate(counts):
                self.counts[i] += count
            return
        for i, count in enumerate(counts):
            upper = bounds[i] if i < len(bounds) else math.inf
            self.counts[_bucket_of(self.upper_bounds, upper)] += count

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1), linear within its bucket (as Prometheus'
        ``histogram_quantile``); above every bound it is the highest bound. None when
        empty."""
        total = self.total
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for i, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if i >= len(self.upper_bounds):
                    return self.upper_bounds[-1] if self.upper_bounds else None
                low = 0.0 if i == 0 else self.upper_bounds[i - 1]
                high = self.upper_bounds[i]
                return low + (high - low) * max(rank - seen, 0.0) / count
            seen += count
        return self.upper_bounds[-1] if self.upper_bounds else None

    def json(self) -> dict[str, Any]:
        return {"upper_bounds": list(self.upper_bounds), "counts": self.counts, "sum": self.sum}

    @classmethod
    def from_json(cls, data: Any) -> MergedHistogram:
        merged = cls()
        if isinstance(data, dict) and data.get("counts"):
            merged.add(
                Histogram(
                    upper_bounds=tuple(float(b) for b in data["upper_bounds"]),
                    counts=tuple(int(c) for c in data["counts"]),
                    sum=float(data.get("sum", 0.0)),
                )
            )
        return merged


def _bucket_of(bounds: Sequence[float], value: float) -> int:
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)


def check_histogram(bounds: Sequence[float], counts: Sequence[int]) -> None:
    """Raise InvalidStats unless the histogram is well formed."""
    if not counts and not bounds:
        return
    if len(bounds) > MAX_BUCKETS or len(counts) != len(bounds) + 1:
        raise InvalidStats(
            f"a histogram needs len(counts) == len(upper_bounds) + 1 <= {MAX_BUCKETS + 1}, "
            f"got {len(counts)} counts, {len(bounds)} bounds"
        )
    if any(not math.isfinite(b) or b < 0 for b in bounds):
        raise InvalidStats("histogram bounds must be finite and >= 0")
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise InvalidStats("histogram bounds must increase")
    if any(c < 0 or c > MAX_REQUESTS_PER_REPORT for c in counts):
        raise InvalidStats("histogram counts out of range")


def check_stats(stats: ModelStats) -> None:
    """Raise InvalidStats unless ``stats`` is plausible."""
    if not 0 <= stats.requests <= MAX_REQUESTS_PER_REPORT:
        raise InvalidStats(f"requests out of range: {stats.requests}")
    if not 0 <= stats.failed <= stats.requests:
        raise InvalidStats(f"failed ({stats.failed}) must be within [0, requests]")
    check_histogram(stats.ttft_seconds.upper_bounds, stats.ttft_seconds.counts)
    if sum(stats.ttft_seconds.counts) > stats.requests:
        raise InvalidStats("more TTFT observations than requests")
    if not math.isfinite(stats.ttft_seconds.sum) or stats.ttft_seconds.sum < 0:
        raise InvalidStats("histogram sum must be finite and >= 0")


@dataclass(slots=True)
class StepStats:
    """What the new version served on a step's moved agents since the step started."""

    requests: int = 0
    failed: int = 0
    ttft: MergedHistogram = field(default_factory=MergedHistogram)

    def add(self, stats: ModelStats) -> None:
        self.requests += stats.requests
        self.failed += stats.failed
        self.ttft.add(stats.ttft_seconds)

    def json(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed": self.failed, "ttft": self.ttft.json()}

    @classmethod
    def from_json(cls, data: Any) -> StepStats:
        if not isinstance(data, dict):
            return cls()
        return cls(
            requests=int(data.get("requests", 0)),
            failed=int(data.get("failed", 0)),
            ttft=MergedHistogram.from_json(data.get("ttft")),
        )


@dataclass(frozen=True, slots=True)
class GateThresholds:
    """A policy's gate: see the module docstring."""

    min_requests: int = 200
    max_error_rate: float = 0.02
    max_ttft_p99_ratio: float = 1.5
    # Fewer previous-version TTFT observations than this: no TTFT comparison is made.
    min_baseline_requests: int = 50
    require_self_check: bool = True


class Verdict(enum.StrEnum):
    WAIT = "wait"
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class GateResult:
    """One evaluation of a step's gate: the verdict and the figures behind it."""

    verdict: Verdict
    # Why it failed, or what it still waits for.
    reasons: tuple[str, ...]
    requests: int
    failed: int
    error_rate: float | None
    ttft_p99_s: float | None
    baseline_ttft_p99_s: float | None
    ttft_ratio: float | None
    # Where baseline_ttft_p99_s came from: "control" (unmoved agents, this step),
    # "history" (the previous version's window) or None (no comparison made).
    baseline_source: str | None
    loaded: int
    agents: int
    soak_elapsed_s: float
    soak_s: float

    def json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "requests": self.requests,
            "failed": self.failed,
            "error_rate": self.error_rate,
            "ttft_p99_s": self.ttft_p99_s,
            "baseline_ttft_p99_s": self.baseline_ttft_p99_s,
            "ttft_ratio": self.ttft_ratio,
            "baseline_source": self.baseline_source,
            "loaded": self.loaded,
            "agents": self.agents,
            "soak_elapsed_s": round(self.soak_elapsed_s, 3),
            "soak_s": self.soak_s,
        }


def self_check_failure(entry: ModelInventory) -> str | None:
    """Why this agent's inventory entry fails the step, or None (a self-check that was
    run and failed always fails it, required or not)."""
    if entry.state == ModelInventoryState.FAILED:
        detail = entry.last_error or (entry.self_check.detail if entry.self_check else "")
        return f"failed on the agent: {detail or 'no detail given'}"
    check = entry.self_check
    if check is not None and not check.passed and entry.state != ModelInventoryState.CHECKING:
        return (
            f"self-check failed: {check.detail or 'no detail given'} (perplexity ratio "
            f"{check.perplexity_ratio:.3f}, greedy {check.greedy_matched}/{check.greedy_total})"
        )
    return None


def self_check_ready(entry: ModelInventory, *, require_self_check: bool) -> bool:
    if entry.state != ModelInventoryState.LOADED:
        return False
    if not require_self_check:
        return True
    return entry.self_check is not None and entry.self_check.passed


def evaluate_gate(
    *,
    thresholds: GateThresholds,
    inventories: dict[str, ModelInventory | None],
    stats: StepStats,
    baseline: MergedHistogram,
    soak_elapsed_s: float,
    soak_s: float,
    control: MergedHistogram | None = None,
) -> GateResult:
    """The step's verdict. ``inventories``: each moved agent's inventory entry for the new
    version (None: it has not reported one yet). ``control``: the previous version's TTFT
    on unmoved agents since the step started; ``baseline``: its history."""
    failures: list[str] = []
    waiting: list[str] = []
    loaded = 0
    for agent_id, entry in sorted(inventories.items()):
        if entry is None:
            continue
        why = self_check_failure(entry)
        if why is not None:
            failures.append(f"agent {agent_id}: {why}")
        elif self_check_ready(entry, require_self_check=thresholds.require_self_check):
            loaded += 1
    if loaded < len(inventories) and not failures:
        waiting.append(f"{loaded}/{len(inventories)} moved agents loaded and self-checked")
    error_rate = stats.failed / stats.requests if stats.requests else None
    p99 = stats.ttft.quantile(0.99)
    base_p99, source = None, None
    if control is not None and control.total >= thresholds.min_baseline_requests:
        base_p99, source = control.quantile(0.99), "control"
    elif baseline.total >= thresholds.min_baseline_requests:
        base_p99, source = baseline.quantile(0.99), "history"
    ratio = None
    if p99 is not None and base_p99 is not None:
        ratio = p99 / base_p99 if base_p99 > 0 else (1.0 if p99 <= 0 else math.inf)
    enough = stats.requests >= thresholds.min_requests
    if enough:
        if error_rate is not None and error_rate > thresholds.max_error_rate:
            failures.append(f"error rate {error_rate:.4f} above {thresholds.max_error_rate}")
        if ratio is not None and ratio > thresholds.max_ttft_p99_ratio:
            failures.append(
                f"TTFT p99 {p99:.4f} s is {ratio:.2f}x the previous version's "
                f"{base_p99:.4f} s ({_SOURCES[source]}; limit {thresholds.max_ttft_p99_ratio}x)"
            )
    else:
        waiting.append(f"{stats.requests}/{thresholds.min_requests} requests on the new version")
    if soak_elapsed_s < soak_s:
        waiting.append(f"soak {soak_elapsed_s:.0f}/{soak_s:.0f} s")
    verdict = Verdict.FAIL if failures else Verdict.WAIT if waiting else Verdict.PASS
    return GateResult(
        verdict=verdict,
        reasons=tuple(failures or waiting),
        requests=stats.requests,
        failed=stats.failed,
        error_rate=error_rate,
        ttft_p99_s=p99,
        baseline_ttft_p99_s=base_p99,
        ttft_ratio=ratio,
        baseline_source=source if base_p99 is not None else None,
        loaded=loaded,
        agents=len(inventories),
        soak_elapsed_s=soak_elapsed_s,
        soak_s=soak_s,
    )


_SOURCES = {
    "control": "on the agents not moved, same step",
    "history": "its recent history",
    None: "",
}


def merged(histograms: Iterable[Histogram | MergedHistogram]) -> MergedHistogram:
    out = MergedHistogram()
    for histogram in histograms:
        out.add(histogram)
    return out
