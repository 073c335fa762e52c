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
``k`` tokens that followed it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# a proposed position's cost in a verification call, as a share of a one-position step:
# measured on 2 cores, SmolLM2-135M int4 ~0.19 (8.4 ms for one position, +1.6 ms each
# further), Qwen2.5-0.5B ~0.08; the larger figure, so a doubtful proposal is not made
POSITION_COST = 0.2


def propose(
    context: npt.NDArray[np.int64], k: int, ngram_min: int, ngram_max: int, lookback: int
) -> npt.NDArray[np.int64]:
    """Up to ``k`` tokens that followed the latest, longest earlier occurrence of the
    context's last ``n`` tokens (``ngram_min <= n <= ngram_max``); empty when none."""
    end = int(context.shape[0])
    if k <= 0 or end <= ngram_min:
        return context[:0]
    window = context[max(0, end - lookback) :]
    last = window.shape[0] - 1
    # candidate ends of an earlier occurrence: every earlier position holding the last token
    # (not the last position itself), and at least ngram_min - 1 tokens in before it
    ends = np.flatnonzero(window[:last] == window[last])
    ends = ends[ends >= ngram_min - 1]
    if ends.size == 0:
        return context[:0]
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
        return context[:0]
    at = int(ends[np.flatnonzero(length == best)[-1]])  # the most recent of the longest
    return window[at + 1 : at + 1 + k].copy()


def best_length(rate: float, max_tokens: int, position_cost: float = POSITION_COST) -> int:
    """The number of tokens to propose that gives the most tokens per unit of step time
    when each proposed token is taken with probability ``rate`` once the ones before it
    were: (1 + rate + ... + rate^k) / (1 + position_cost x k); 0 when none pays."""
    best, best_value, expected = 0, 1.0, 1.0
    for k in range(1, max_tokens + 1):
        expected += rate**k
        value = expected / (1 + position_cost * k)
        if value > best_value + 1e-9:
            best, best_value = k, value
    return best


class DraftLength:
    """How many tokens one sequence proposes next, from its recent acceptance.

    ``rate`` estimates the chance that a proposed token is taken once the ones before it
    were (a moving average over the verified tokens: each taken one and the first refused
    one; those after it say nothing); the length is :func:`best_length` of it. When none
    pays (output that repeats nothing), the sequence proposes nothing for ``PAUSE``
    steps, then one token to see whether that changed: so such output pays (almost)
    nothing.
    """

    PAUSE = 16
    WEIGHT = 0.2  # of one verified token in the moving average
    START_RATE = 0.6  # before anything was verified: two or three tokens

    def __init__(self, max_tokens: int) -> None:
        self._max = max_tokens
        self.rate = self.START_RATE
        self.paused = 0  # steps left before the next probe

    def wanted(self) -> int:
        """Tokens to propose this step (0 while paused; counts the pause down)."""
        k = best_length(self.rate, self._max)
        if k:
            return k
        if self.paused:
            self.paused -= 1
            return 0
        return min(1, self._max)  # a probe

    def update(self, proposed: int, accepted: int) -> None:
        for _ in range(accepted):
            self.rate += self.WEIGHT * (1 - self.rate)
        if accepted < proposed:
            self.rate -= self.WEIGHT * self.rate
        if proposed and best_length(self.rate, self._max) == 0:
            self.paused = self.PAUSE
