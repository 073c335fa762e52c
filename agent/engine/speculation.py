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

MISS_LIMIT = 4  # proposals rejected outright this many times in a row pause the lookups


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


class DraftLength:
    """How many tokens one sequence proposes next, from its recent acceptance.

    Starts at the configured maximum; grows back by one after a proposal taken whole,
    shrinks to one more than what was accepted after a partial one. ``miss_limit``
    proposals in a row with nothing accepted pause the lookups for a number of steps that
    doubles with each further miss (up to 64), so output without repetition pays (almost)
    nothing: a paused sequence decodes one position per step as without speculation.
    """

    MAX_PAUSE = 64

    def __init__(self, max_tokens: int, miss_limit: int = MISS_LIMIT) -> None:
        self._max = max_tokens
        self._miss_limit = max(1, miss_limit)
        self.k = max_tokens
        self.misses = 0  # proposals in a row with nothing accepted
        self.paused = 0  # steps left before the next lookup

    def wanted(self) -> int:
        """Tokens to propose this step (0 while paused; counts the pause down)."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        if accepted == 0:
            self.misses += 1
            self.k = max(1, self.k // 2)
            if self.misses >= self._miss_limit:
                self.paused = min(self.MAX_PAUSE, 4 << (self.misses - self._miss_limit))
            return
        self.misses = 0
        self.k = min(self._max, self.k + 1 if accepted == proposed else accepted + 1)
