"""What each model version served since the previous load report (``ModelStats``).

The request middleware records every generation or embedding request once it ends
(status, tokens, time to first token); :meth:`ModelStatsCollector.take` hands the
per-version deltas to the next LoadReport and starts a new interval. Rollout gates merge
the TTFT histograms fleet-wide, so buckets are fixed and counts per bucket.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from edgefleet.contract import Histogram, ModelStats

#: TTFT bucket upper bounds, seconds (a last bucket holds everything above): 1 ms (a small
#: model's TTFT on an idle box is a few ms) to about 56 s, each bound 1.2x the one before,
#: so a p99 interpolated within a bucket is within 20% of the truth and a rollout gate's
#: ratio limit (1.15x, 1.5x) means what it says (decade-wide buckets made a 2x regression
#: read as anything from 1x to 2.5x).
TTFT_BOUNDS: tuple[float, ...] = tuple(round(0.001 * 1.2**i, 6) for i in range(61))
#: Versions tracked in one interval at most (names come from loaded models only).
_MAX_KEYS = 256


@dataclass
class _Counts:
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BOUNDS) + 1))


class ModelStatsCollector:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], _Counts] = {}

    def record(
        self,
        name: str,
        version: str,
        *,
        failed: bool,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        ttft_s: float | None = None,
    ) -> None:
        key = (name, version)
        counts = self._counts.get(key)
        if counts is None:
            if len(self._counts) >= _MAX_KEYS:
                return
            counts = self._counts[key] = _Counts()
        counts.requests += 1
        counts.failed += int(failed)
        counts.prompt_tokens += prompt_tokens
        counts.completion_tokens += completion_tokens
        if ttft_s is not None:
            counts.ttft_sum += ttft_s
            counts.buckets[bisect.bisect_left(TTFT_BOUNDS, ttft_s)] += 1

    def take(self) -> tuple[ModelStats, ...]:
        """The interval's stats per version (then a fresh interval)."""
        counts, self._counts = self._counts, {}
        return tuple(
            ModelStats(
                name=name,
                version=version,
                requests=c.requests,
                failed=c.failed,
                prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens,
                ttft_seconds=Histogram(TTFT_BOUNDS, tuple(c.buckets), c.ttft_sum),
            )
            for (name, version), c in sorted(counts.items())
        )
