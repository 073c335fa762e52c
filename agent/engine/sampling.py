"""Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

Each random draw comes from a generator keyed by ``(seed, position)``, position being the
token's index in the completion, not from one stream per sequence: a stream resumed after
``k`` delivered tokens (on this agent or another) draws token ``k`` exactly as the
uninterrupted run did, and a speculative step verifying proposed tokens draws each position
as a plain decode step would.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from agent.engine.interface import SamplingParams


def _seed_entropy(seed: int) -> int:
    """A seed as the non-negative integer numpy's SeedSequence takes (zigzag: -1 -> 1, 1 -> 2)."""
    return 2 * seed if seed >= 0 else -2 * seed - 1


class TokenSampler:
    """One sampler per sequence; a fixed seed makes its choices repeatable, token by token.

    ``position`` is the index in the completion of the next token it chooses; it advances
    by one per :meth:`sample` or :meth:`skip`.
    """

    def __init__(
        self, params: SamplingParams, eos_token_ids: Iterable[int] = (), *, position: int = 0
    ) -> None:
        self._params = params
        # unseeded: a random seed of its own, so both cases take the same path
        self._seed = _seed_entropy(params.seed if params.seed is not None else secrets.randbits(63))
        self._eos = np.asarray(sorted(eos_token_ids), dtype=np.intp)
        self.position = position

    def skip(self) -> None:
        """Pass over one position whose token is already known (a resumed stream's replay)."""
        self.position += 1

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        p = self._params
        position = self.position
        self.position += 1
        if position < p.min_tokens and self._eos.size:
            logits = logits.copy()
            logits[self._eos] = -np.inf
        if p.greedy:
            return int(np.argmax(logits))
        scores = logits.astype(np.float64) / p.temperature
        if 0 < p.top_k < scores.shape[-1]:
            kth = np.partition(scores, -p.top_k)[-p.top_k]
            scores = np.where(scores < kth, -np.inf, scores)
        scores -= scores.max()
        probs = np.exp(scores)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = _most_likely_first(probs, p.top_p)
            cumulative = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (always at least one token)
            keep = int(np.searchsorted(cumulative, p.top_p) + 1)
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[:keep]] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        # an exponential race (the Gumbel-max trick): the token with the largest p / E, one
        # E ~ Exp(1) per token from this (seed, position)'s generator, is a draw from probs.
        # Unlike inverting the cumulative distribution in vocabulary order (where a slight
        # change to any earlier token's probability moves the draw to an unrelated token),
        # the choice only changes when two tokens' p / E are nearly tied, so logits that
        # differ by kernel rounding (batched, speculative or resumed decoding) choose the
        # same token but for such near-ties
        rng = np.random.default_rng([self._seed, position])
        return int(np.argmax(probs / rng.standard_exponential(probs.shape[-1])))


_CANDIDATES = 1024


def _most_likely_first(probs: npt.NDArray[np.float64], mass: float) -> npt.NDArray[np.intp]:
    """Token ids by falling probability, at least until ``mass`` is covered.

    Sorting the whole vocabulary costs milliseconds per token; the nucleus almost always
    lies within the top thousand, so those are sorted first and the full sort is the
    fallback.
    """
    if probs.shape[-1] > _CANDIDATES:
        top = np.argpartition(-probs, _CANDIDATES)[:_CANDIDATES]
        top = top[np.argsort(-probs[top], kind="stable")]
        if probs[top].sum() >= mass:
            return top
    return np.argsort(-probs, kind="stable")
