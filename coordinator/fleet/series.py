"""The fleet's last hour at 10 s resolution, built from the agents' load reports.

Each accepted LoadReport is folded into the current 10 s bucket (``record``): requests,
failures, prompt/completion tokens and the TTFT histogram of every ``model_stats`` entry
(per-interval deltas, contract v1.3), rejections from ``key_usage``, overflow use by
target (``overflow_usage``: per-interval deltas) and redactions by type. An agent reports
``redactions`` as totals since it started (contract field 19), so the series counts the
growth of each type's total between two reports of the same agent: its first report seen
is a baseline only, and a total lower than before means the agent restarted (what it
reports then happened since its start, and is counted).

Type and target names come from agents: hostile text. A type name is counted under its
own name only when it is 1-32 upper-case letters, digits and underscores (what the
coordinator's report validation accepts), and each bucket keeps at most
MAX_KEYS_PER_BUCKET type names and as many target names, ``OTHER`` / ``other`` (the
rest) included, so a point stays small whatever the fleet sends.

Fleet TTFT percentiles are computed from the MERGED per-bucket counts of every agent's
histogram (the same bounds are summed bucket by bucket; a different bound set is merged
onto the union of bounds, each count kept at its own upper bound), never from averaged
percentiles.

A closed bucket becomes a ``point`` (JSON-ready dict); ``points()`` is the hour behind
now, and subscribers (the dashboard's SSE stream) are called with each new point.
"""

from __future__ import annotations

import math
import re
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgefleet.contract import Histogram, LoadReport

STEP_S = 10
HOUR_POINTS = 360
MAX_TRACKED = 200_000
# Distinct redaction types / overflow targets one bucket keeps by name (the rest: OTHER).
MAX_KEYS_PER_BUCKET = 32
REDACTION_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,31}")
OTHER_TYPE = "OTHER"
OTHER_TARGET = "other"
MAX_TARGET_CHARS = 128


def _bounded_key(counts: dict[str, Any], key: str, other: str) -> str:
    """``key`` if the bucket has it or room for it, else ``other`` (names and ``other``
    together: at most MAX_KEYS_PER_BUCKET)."""
    if key in counts or len(counts) < MAX_KEYS_PER_BUCKET - 1:
        return key
    return other


def histogram_quantile(bounds: list[float], counts: list[int], q: float) -> float | None:
    """The q-quantile of per-bucket counts (last count: above every bound), interpolated
    linearly inside the bucket as Prometheus does; None without observations. A quantile
    landing in the overflow bucket answers the highest bound."""
    total = sum(counts)
    if total <= 0 or not bounds:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(bounds):
                return bounds[-1]
            low = 0.0 if i == 0 else bounds[i - 1]
            high = bounds[i]
            return low + (high - low) * ((rank - seen) / count)
        seen += count
    return bounds[-1]


@dataclass(slots=True)
class _Bucket:
    start: int  # unix seconds, a multiple of STEP_S
    reports: int = 0
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejected: int = 0
    ttft: dict[float, int] = field(default_factory=dict)  # upper bound (inf: above) -> count
    ttft_sum: float = 0.0
    overflow_requests: dict[str, int] = field(default_factory=dict)
    overflow_cost: dict[str, float] = field(default_factory=dict)
    redactions: dict[str, int] = field(default_factory=dict)

    def add_histogram(self, histogram: Histogram) -> None:
        bounds, counts = histogram.upper_bounds, histogram.counts
        for i, count in enumerate(counts):  # every bound, even empty: the union of bounds
            bound = bounds[i] if i < len(bounds) else math.inf
            self.ttft[bound] = self.ttft.get(bound, 0) + max(0, count)
        self.ttft_sum += histogram.sum

    def point(self) -> dict[str, Any]:
        finite = sorted(b for b in self.ttft if b != math.inf)
        counts = [self.ttft[b] for b in finite] + [self.ttft.get(math.inf, 0)]
        observations = sum(counts)
        return {
            "t": self.start,
            "reports": self.reports,
            "requests_per_s": self.requests / STEP_S,
            "failed_per_s": self.failed / STEP_S,
            "tokens_per_s": self.completion_tokens / STEP_S,
            "prompt_tokens_per_s": self.prompt_tokens / STEP_S,
            "rejections_per_s": self.rejected / STEP_S,
            "ttft_observations": observations,
            "ttft_p50_s": histogram_quantile(finite, counts, 0.5),
            "ttft_p99_s": histogram_quantile(finite, counts, 0.99),
            "ttft_mean_s": self.ttft_sum / observations if observations else None,
            "overflow_per_s": {k: v / STEP_S for k, v in sorted(self.overflow_requests.items())},
            "overflow_cost": dict(sorted(self.overflow_cost.items())),
            # Values redacted in the 10 s, by type (count and rate).
            "redactions": dict(sorted(self.redactions.items())),
            "redactions_per_s": {k: v / STEP_S for k, v in sorted(self.redactions.items())},
        }


class FleetSeries:
    """The last hour of fleet totals at STEP_S resolution (see the module doc)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._points: deque[dict[str, Any]] = deque(maxlen=HOUR_POINTS)
        self._current = _Bucket(self._bucket_start(clock()))
        self._subscribers: list[Callable[[dict[str, Any]], None]] = []
        # agent -> its last requests and failed totals, and its redaction totals by type
        self._totals: dict[str, tuple[int, int, tuple[tuple[str, int], ...]]] = {}

    @staticmethod
    def _bucket_start(now: float) -> int:
        return int(now // STEP_S) * STEP_S

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``callback(point)`` for each closed bucket; returns the unsubscriber."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def roll(self) -> None:
        """Close the current bucket if its 10 s are over (empty buckets in between are
        closed as zero points, so the series has no holes)."""
        start = self._bucket_start(self._clock())
        while self._current.start < start:
            point = self._current.point()
            self._points.append(point)
            self._current = _Bucket(self._current.start + STEP_S)
            if start - self._current.start > HOUR_POINTS * STEP_S:  # asleep over an hour
                self._current = _Bucket(start - HOUR_POINTS * STEP_S)
            for callback in list(self._subscribers):
                callback(point)

    def record(self, report: LoadReport, agent_id: str = "") -> None:
        """Fold one accepted report into the current bucket (cheap: per model entry).

        Requests come from ``model_stats`` (per-interval deltas); an agent that sends none
        (before contract v1.3's stats) is counted by the growth of its ``requests_total``
        between two of its reports (``agent_id`` given), so requests/s are never missing."""
        self.roll()
        bucket = self._current
        bucket.reports += 1
        if agent_id:
            previous = self._totals.get(agent_id)
            if len(self._totals) >= MAX_TRACKED and previous is None:
                self._totals.clear()  # agents come and go: bounded, restarts the deltas
            redactions = tuple(report.redactions)
            self._totals[agent_id] = (
                report.requests_total, report.requests_failed_total, redactions
            )  # fmt: skip
            if previous is not None and redactions != previous[2]:
                self._add_redactions(bucket, dict(previous[2]), redactions)
            # A total lower than before: the agent restarted (a new baseline, no count).
            if (not report.model_stats and previous is not None
                    and report.requests_total >= previous[0]):  # fmt: skip
                bucket.requests += report.requests_total - previous[0]
                bucket.failed += max(0, report.requests_failed_total - previous[1])
        for stats in report.model_stats:
            bucket.requests += stats.requests
            bucket.failed += stats.failed
            bucket.prompt_tokens += stats.prompt_tokens
            bucket.completion_tokens += stats.completion_tokens
            bucket.add_histogram(stats.ttft_seconds)
        for usage in report.key_usage:
            bucket.rejected += usage.rejected
        for overflow in report.overflow_usage:
            target = str(overflow.target)[:MAX_TARGET_CHARS] or "unknown"
            target = _bounded_key(bucket.overflow_requests, target, OTHER_TARGET)
            requests = max(0, int(overflow.requests))
            bucket.overflow_requests[target] = bucket.overflow_requests.get(target, 0) + requests
            cost = float(overflow.cost)
            cost = cost if math.isfinite(cost) and cost > 0 else 0.0
            bucket.overflow_cost[target] = bucket.overflow_cost.get(target, 0.0) + cost

    @staticmethod
    def _add_redactions(
        bucket: _Bucket, before: dict[str, int], now: tuple[tuple[str, int], ...]
    ) -> None:
        """Count the growth of an agent's redaction totals (module doc)."""
        totals = {str(kind): max(0, int(count)) for kind, count in now}
        restarted = any(totals.get(kind, 0) < count for kind, count in before.items())
        for kind, total in totals.items():
            grown = total if restarted else total - before.get(kind, 0)
            if grown <= 0:
                continue
            name = kind if REDACTION_TYPE.fullmatch(kind) else OTHER_TYPE
            name = _bounded_key(bucket.redactions, name, OTHER_TYPE)
            bucket.redactions[name] = bucket.redactions.get(name, 0) + grown

    def points(self) -> list[dict[str, Any]]:
        """The closed buckets of the last hour, oldest first."""
        self.roll()
        return list(self._points)

    def current(self) -> dict[str, Any]:
        """The bucket still filling (for totals shown before it closes)."""
        return self._current.point()


# ------------------------------------------------------------------ per agent

# What an agent's history keeps per 10 s step (the dashboard's agent page): rates per
# second over the step, the longest queue (waiting sequences) any report of the step
# gave, and TTFT percentiles of the agent's merged histograms in the step.
AGENT_FIELDS = (
    "requests_per_s", "failed_per_s", "tokens_per_s", "queue", "ttft_p50_s", "ttft_p99_s",
)  # fmt: skip
# Agents with a history (the oldest-started dropped beyond it): 6 float32 a step, an hour
# of steps, about 8.6 kB an agent (86 MB at the bound).
MAX_AGENT_SERIES = 10_000


def _figure(value: float) -> float | None:
    """A stored float32 as JSON: 6 significant digits (not its binary noise); NaN: None."""
    return None if math.isnan(value) else float(f"{value:.6g}")


class _AgentHistory:
    """One agent's last hour: a ring of HOUR_POINTS steps of AGENT_FIELDS as float32
    (NaN: no report in that step), and the step still filling."""

    __slots__ = ("closed", "failed", "first", "queue", "requests", "ring", "start", "tokens",
                 "ttft")  # fmt: skip

    def __init__(self, start: int) -> None:
        self.first = start  # the first step with a report
        self.closed = start - STEP_S  # the newest closed step
        self.ring = array("f", [math.nan]) * (HOUR_POINTS * len(AGENT_FIELDS))
        self._open(start)

    def _open(self, start: int) -> None:
        self.start = start
        self.requests = self.failed = self.tokens = self.queue = 0
        self.ttft: dict[float, int] = {}

    def _values(self) -> tuple[float, ...]:
        finite = sorted(b for b in self.ttft if b != math.inf)
        counts = [self.ttft[b] for b in finite] + [self.ttft.get(math.inf, 0)]
        p50 = histogram_quantile(finite, counts, 0.5)
        p99 = histogram_quantile(finite, counts, 0.99)
        return (self.requests / STEP_S, self.failed / STEP_S, self.tokens / STEP_S,
                float(self.queue), math.nan if p50 is None else p50,
                math.nan if p99 is None else p99)  # fmt: skip

    def _write(self, start: int, values: tuple[float, ...]) -> None:
        at = (start // STEP_S) % HOUR_POINTS * len(AGENT_FIELDS)
        self.ring[at : at + len(AGENT_FIELDS)] = array("f", values)

    def roll(self, now_start: int) -> None:
        """Close the filling step if ``now_start`` is past it; steps without a report
        between it and now are written as NaN (shown as gaps)."""
        if self.start >= now_start:
            return
        self._write(self.start, self._values())
        gap = (now_start - self.start) // STEP_S - 1
        if gap >= HOUR_POINTS:  # nothing of the last hour but that step
            self.ring = array("f", [math.nan]) * (HOUR_POINTS * len(AGENT_FIELDS))
            self.first = now_start
        else:
            nans = (math.nan,) * len(AGENT_FIELDS)
            for k in range(gap):
                self._write(self.start + (k + 1) * STEP_S, nans)
        self.closed = now_start - STEP_S
        self._open(now_start)

    def add(self, report: LoadReport) -> None:
        self.queue = max(self.queue, report.waiting_sequences)
        for stats in report.model_stats:
            self.requests += stats.requests
            self.failed += stats.failed
            self.tokens += stats.completion_tokens
            bounds, counts = stats.ttft_seconds.upper_bounds, stats.ttft_seconds.counts
            for i, count in enumerate(counts):
                bound = bounds[i] if i < len(bounds) else math.inf
                self.ttft[bound] = self.ttft.get(bound, 0) + max(0, count)

    def points(self) -> list[dict[str, Any]]:
        width = len(AGENT_FIELDS)
        out = []
        for start in range(max(self.first, self.closed - (HOUR_POINTS - 1) * STEP_S),
                           self.closed + 1, STEP_S):  # fmt: skip
            at = (start // STEP_S) % HOUR_POINTS * width
            point: dict[str, Any] = {"t": start}
            for name, value in zip(AGENT_FIELDS, self.ring[at : at + width], strict=True):
                point[name] = _figure(value)
            out.append(point)
        return out

    def current(self) -> dict[str, Any]:
        values = self._values()
        return {"t": self.start} | {
            name: _figure(v) for name, v in zip(AGENT_FIELDS, values, strict=True)
        }


class AgentSeries:
    """Each agent's last hour at STEP_S resolution, from its own load reports (AGENT_FIELDS;
    the fleet's totals are FleetSeries). Steps close lazily, at the agent's next report or
    when its history is read."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._agents: dict[str, _AgentHistory] = {}

    def record(self, agent_id: str, report: LoadReport) -> None:
        start = int(self._clock() // STEP_S) * STEP_S
        history = self._agents.get(agent_id)
        if history is None:
            if len(self._agents) >= MAX_AGENT_SERIES:
                del self._agents[next(iter(self._agents))]  # the oldest-started
            history = self._agents[agent_id] = _AgentHistory(start)
        else:
            history.roll(start)
        history.add(report)

    def forget(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._agents

    def __len__(self) -> int:
        return len(self._agents)

    def history(self, agent_id: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """(the closed steps of the last hour, oldest first; the step still filling), each
        a dict of ``t`` and AGENT_FIELDS (None: no report, or no TTFT observation)."""
        history = self._agents.get(agent_id)
        if history is None:
            return [], None
        history.roll(int(self._clock() // STEP_S) * STEP_S)
        return history.points(), history.current()
