"""Prompt-lookup (n-gram) speculation: proposing tokens without a draft model.

Much edge work repeats its input (summaries quote the document, code edits copy the
file), so the tokens that followed the last n-gram where it appeared earlier in the
prompt or output are a good guess at what comes next. The batcher feeds a sequence's
proposals as extra positions of its decode row and keeps the longest prefix the model
agrees with (see :mod:`agent.engine.continuous_batcher`); this module only proposes and
decides how many to propose.

The lookup follows vLLM's ``ngram`` proposer: the longest suffix of ``n`` tokens,
``ngram_min <= n <= ngram_max``, that occurred earlier within the last ``lookback``
tokens; among matches of that length the most recent wins; the proposal is the up to
``k`` tokens that followed it. How many (:class:`DraftLength`) depends on how long the
match is (a longer match is more often right) and on what a proposed position costs on
this machine (:class:`StepCost`, measured from the engine's own steps).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

# a proposed position's cost, as a share of a whole one-position decode step, until the
# engine has measured its own (StepCost): on 2 cores of an AVX-512 machine, SmolLM2-135M
# int4, ONNX Runtime took ~9.6 ms for one position and ~1.7 ms for each further one, and
# the step's own work outside it (scheduling, sampling, handing the token on) ~2.5 ms, so
# ~0.13-0.15 (Qwen2.5-0.5B ~0.08). On an AVX2-only machine each further position cost
# 0.3-0.45 of a step (2026-12-05: 22.5 ms for one position, +8-9 ms for each further one,
# at a 650-token context): no one figure fits both, hence the measurement.
POSITION_COST = 0.15


class Match(NamedTuple):
    """Where a lookup found the context's last tokens earlier: the continuation starts at
    ``start`` (an index into the context) and ``length`` tokens matched before it."""

    start: int
    length: int


def lookup(
    context: npt.NDArray[np.int64], ngram_min: int, ngram_max: int, lookback: int
) -> Match | None:
    """The latest, longest earlier occurrence of the context's last ``n`` tokens
    (``ngram_min <= n <= ngram_max``) within its last ``lookback`` tokens; None when none."""
    end = int(context.shape[0])
    if end <= ngram_min:
        return None
    offset = max(0, end - lookback)
    window = context[offset:]
    last = window.shape[0] - 1
    # candidate ends of an earlier occurrence: every earlier position holding the last token
    # (not the last position itself), and at least ngram_min - 1 tokens in before it
    ends = np.flatnonzero(window[:last] == window[last])
    ends = ends[ends >= ngram_min - 1]
    if ends.size == 0:
        return None
    length = np.ones(ends.shape, dtype=np.int64)  # matched suffix length per candidate
    alive = np.ones(ends.shape, dtype=bool)
    for j in range(1, ngram_max):
        pos = ends - j
        ok = alive & (pos >= 0)
        ok[ok] = window[pos[ok]] == window[last - j]
        length += ok
        alive = ok
        if not alive.any():
            break
    best = int(length.max())
    if best < ngram_min:
        return None
    at = int(ends[np.flatnonzero(length == best)[-1]])  # the most recent of the longest
    return Match(offset + at + 1, best)


def best_length(
    rate: float,
    max_tokens: int,
    position_cost: float = POSITION_COST,
    first: float | None = None,
) -> int:
    """The number of tokens to propose that gives the most tokens per unit of step time
    when the first proposed token is taken with probability ``first`` (``rate`` when not
    given) and each further one with probability ``rate`` once the ones before it were:
    (1 + first x (1 + rate + ... + rate^(k-1))) / (1 + position_cost x k); 0 when none pays."""
    first = rate if first is None else first
    best, best_value, expected, term = 0, 1.0, 1.0, first
    for k in range(1, max_tokens + 1):
        expected += term
        term *= rate
        value = expected / (1 + position_cost * k)
        if value > best_value + 1e-9:
            best, best_value = k, value
    return best


class StepCost:
    """What a proposed position costs on this machine, as a share of a one-position decode
    step, measured from the engine's own steps of one sequence.

    A step's time is fitted as ``base + slope x (positions - 1)`` by least squares over the
    steps seen, each weighing ``WEIGHT`` more than the one before it (an exponential
    forgetting: the fit follows the context growing and the machine's load changing); the
    cost is ``slope / base``. Until steps of both kinds were seen (one position, and more),
    or when the fit makes no sense, it is ``prior``. A step far slower than the fit predicts
    (a pause of the process or of the machine) counts as ``OUTLIER`` times the prediction.
    """

    WEIGHT = 0.05
    MIN_SPREAD = 0.05  # variance of the extra positions below which the fit is not used
    OUTLIER = 2.0
    BOUNDS = (0.02, 1.0)

    def __init__(self, prior: float = POSITION_COST) -> None:
        self.prior = prior
        # exponentially weighted means of 1, x, y, x*x, x*y (x: extra positions, y: seconds)
        self._sums = [0.0] * 5
        self._fit: tuple[float, float] | None = None  # (base, slope) of the last fit

    def observe(self, positions: int, seconds: float) -> None:
        """A decode step of one sequence ran ``positions`` positions in ``seconds``."""
        x = float(positions - 1)
        if self._fit is not None:
            base, slope = self._fit
            seconds = min(seconds, self.OUTLIER * (base + slope * x))
        for i, value in enumerate((1.0, x, seconds, x * x, x * seconds)):
            self._sums[i] += self.WEIGHT * (value - self._sums[i])
        self._fit = self._fitted()

    def _fitted(self) -> tuple[float, float] | None:
        w, sx, sy, sxx, sxy = self._sums
        mx, my = sx / w, sy / w
        spread = sxx / w - mx * mx
        if spread < self.MIN_SPREAD:
            return None
        slope = (sxy / w - mx * my) / spread
        base = my - slope * mx
        return (base, slope) if base > 0 else None

    @property
    def position_cost(self) -> float:
        """One proposed position's cost as a share of a one-position step."""
        if self._fit is None:
            return self.prior
        base, slope = self._fit
        low, high = self.BOUNDS
        return min(max(slope / base, low), high)


class DraftLength:
    """How many tokens one sequence proposes next, from its recent acceptance.

    Copying comes in runs: once a proposal's first token is right, the model is usually
    copying and the next tokens are right too, while whether the first one is right
    depends on how long a match found it. So two kinds of estimate, each a moving average
    over the verified tokens: per matched length (1, 2, 3, 4 or more), the chance that a
    proposal's first token is taken (``first``), and, for the sequence, the chance that a
    further token is taken once the one before it was (``rate``; tokens after the first
    refused one say nothing). The length is :func:`best_length` of them. When none pays
    for a match length (output that repeats nothing), the sequence proposes nothing for
    ``PAUSE`` of its lookups that match that long, then one token to see whether that
    changed: so such output pays (almost) nothing.
    """

    PAUSE = 16
    WEIGHT = 0.2  # of one verified first token in its moving average
    RATE_WEIGHT = 0.1  # of one verified further token in the other
    START_RATE = 0.7  # a further token, before anything was verified
    # a first token, before anything was verified, by matched length: two or three tokens
    # for a match of 4 or more, one for a match of 2 or 3, none for a single token
    START_FIRST = (0.2, 0.4, 0.5, 0.6)

    def __init__(self, max_tokens: int, cost: StepCost | None = None) -> None:
        self._max = max_tokens
        self.cost = cost  # the engine's measured position cost (POSITION_COST without)
        self.first = list(self.START_FIRST)
        self.rate = self.START_RATE
        self.paused = [0] * len(self.START_FIRST)  # per matched length: lookups before a probe
        self._bucket = len(self.START_FIRST) - 1  # of the last wanted(): what update() learns

    def _of(self, match_length: int) -> int:
        return min(max(match_length, 1), len(self.first)) - 1

    def wanted(self, match_length: int = 4) -> int:
        """Tokens to propose after a match of ``match_length`` tokens (0 while that length
        is paused; counts its pause down)."""
        b = self._bucket = self._of(match_length)
        k = best_length(self.rate, self._max, self._position_cost(), first=self.first[b])
        if k:
            return k
        if self.paused[b]:
            self.paused[b] -= 1
            return 0
        return min(1, self._max)  # a probe

    def update(self, proposed: int, accepted: int) -> None:
        """What the verification of the last wanted() proposal took."""
        if not proposed:
            return
        b = self._bucket
        self.first[b] += self.WEIGHT * ((accepted > 0) - self.first[b])
        for j in range(1, min(accepted + 1, proposed)):  # further tokens verified
            self.rate += self.RATE_WEIGHT * ((j < accepted) - self.rate)
        if best_length(self.rate, self._max, self._position_cost(), first=self.first[b]) == 0:
            self.paused[b] = self.PAUSE

    def _position_cost(self) -> float:
        return POSITION_COST if self.cost is None else self.cost.position_cost
