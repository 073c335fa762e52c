"""Semantic response cache: a reworded repeat of a prompt answered from an earlier answer.

Entries live per **context**: a digest of everything but the last user message (the API key,
the exact model version, the endpoint, every sampling parameter, the constraint or tools,
the system prompt and every earlier message, the embedding model's version and the
moderation heads' version), so an entry only ever answers the same key, model version and
conversation. Only the last user message (at most ``max_prompt_chars``) is compared by
meaning: a dot product of normalized MiniLM vectors over the context's entries (brute force
in numpy, no index), and for every candidate at or above the threshold the lexical guard
(:mod:`agent.semantic_guard`) must find nothing that differs. Prompts about "today" or "the
latest" are neither stored nor answered, entries expire after ``ttl_s``, a
``content_filter`` result is never stored, and all entries share one byte budget in
least-recently-used order.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgpack
import numpy as np
import numpy.typing as npt

from agent.response_cache import CachedGeneration
from agent.semantic_guard import Signature, misspelt_repeat, refusal, signature, time_sensitive

__all__ = [
    "DEFAULT_MAX_PROMPT_CHARS",
    "THRESHOLDS_FILE",
    "SemanticCache",
    "SemanticLookup",
    "calibrated_misspelt_threshold",
    "calibrated_threshold",
    "semantic_context",
]

#: a last user message longer than this (characters) is not cached by meaning
DEFAULT_MAX_PROMPT_CHARS = 2000
#: candidates at or above the threshold the guard reads, most similar first (bounds a
#: lookup's cost when a context holds many near-duplicates)
DEFAULT_MAX_CANDIDATES = 8
#: what one entry costs beyond its vector and packed answer (row bookkeeping, signature)
_ENTRY_OVERHEAD = 512

#: the thresholds calibrated per embedding model version, with their provenance (written by
#: ``python -m benchmarks.semantic_cache --write-threshold``)
THRESHOLDS_FILE = Path(__file__).with_name("semantic_cache_thresholds.json")

Vector = npt.NDArray[np.float32]


def calibrated_threshold(
    model_name: str, version: str, path: Path = THRESHOLDS_FILE
) -> float | None:
    """The threshold calibrated on this exact embedding model version, or None (no
    calibration for it: another version's cosines differ, so no semantic caching)."""
    return _calibrated(model_name, version, "threshold", path)


def calibrated_misspelt_threshold(
    model_name: str, version: str, path: Path = THRESHOLDS_FILE
) -> float | None:
    """The lower cosine at which a misspelt repeat (the same words, some misspelt: see
    :func:`agent.semantic_guard.misspelt_repeat`) may hit, calibrated on this exact
    embedding model version, or None (no such tier)."""
    return _calibrated(model_name, version, "misspelt_threshold", path)


def _calibrated(model_name: str, version: str, field: str, path: Path) -> float | None:
    """``field`` of the thresholds file's entry for this exact model version: a number in
    (0, 1], else None (no file, another version, or a value that is not one)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = table.get(model_name) if isinstance(table, dict) else None
    if not isinstance(entry, dict) or entry.get("version") != version:
        return None
    threshold = entry.get(field)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        return None
    return float(threshold) if 0.0 < threshold <= 1.0 else None


Outcome = Literal["hit", "miss", "refused", "ineligible"]


def semantic_context(
    *,
    api_key_id: str,
    model_id: str,
    model_version: str,
    endpoint: str,
    fields: Mapping[str, Any],
    earlier: Sequence[Any],
    embedder_version: str,
    moderation_version: str = "",
) -> bytes:
    """The digest that two requests must share for one to answer the other by meaning.

    ``fields``: every sampling parameter, the constraint or tools and anything else that
    changes the output (the exact cache's fields without the prompt); ``earlier``: the
    system prompt and every message before the last user message, as sent (JSON-able);
    ``api_key_id`` "": no key (auth off); ``moderation_version`` "": no moderation heads.
    """
    canonical = json.dumps(
        [
            "semantic/1",
            api_key_id,
            model_id,
            model_version,
            endpoint,
            fields,
            list(earlier),
            embedder_version,
            moderation_version,
        ],
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).digest()


@dataclass(frozen=True)
class SemanticLookup:
    """What a lookup found. ``outcome``: hit (``entry`` is the answer), miss (nothing close
    enough), refused (something close enough, but the guard named ``reason``), ineligible
    (the prompt is never cached by meaning: ``reason`` says why)."""

    outcome: Outcome
    entry: CachedGeneration | None = field(default=None, repr=False)
    similarity: float = 0.0  # the best candidate's cosine (0.0 when none)
    reason: str = ""


@dataclass(slots=True)
class _Entry:
    context: bytes
    row: int
    prompt: str = field(repr=False)
    signature: Signature = field(repr=False)
    packed: bytes = field(repr=False)
    expires_at: float
    size: int


class _Bucket:
    """One context's vectors (rows 0..n-1) and the entry of each row."""

    def __init__(self, dim: int) -> None:
        self.vectors: Vector = np.zeros((8, dim), dtype=np.float32)
        self.entries: list[_Entry] = []
        self.by_prompt: dict[str, _Entry] = {}

    def add(self, entry: _Entry, vector: Vector) -> None:
        n = len(self.entries)
        if n == len(self.vectors):
            grown = np.zeros((2 * n, self.vectors.shape[1]), dtype=np.float32)
            grown[:n] = self.vectors
            self.vectors = grown
        self.vectors[n] = vector
        entry.row = n
        self.entries.append(entry)
        self.by_prompt[entry.prompt] = entry

    def remove(self, entry: _Entry) -> None:
        del self.by_prompt[entry.prompt]
        last = self.entries.pop()
        if last is not entry:  # the last row moves into the freed one
            self.vectors[entry.row] = self.vectors[len(self.entries)]
            self.entries[entry.row] = last
            last.row = entry.row


class SemanticCache:
    def __init__(
        self,
        *,
        threshold: float,
        max_bytes: int,
        ttl_s: float,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.max_prompt_chars = max_prompt_chars
        self.max_candidates = max_candidates
        self._clock = clock
        self._buckets: dict[bytes, _Bucket] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._lru)

    def ineligible(self, prompt: str) -> str:
        """Why ``prompt`` is never cached by meaning ("" when it may be)."""
        if not prompt.strip():
            return "empty"
        if len(prompt) > self.max_prompt_chars:
            return "too_long"
        if time_sensitive(prompt):
            return "time_sensitive"
        return ""

    def lookup(
        self,
        context: bytes,
        prompt: str,
        vector: Vector,
        threshold: float | None = None,
        misspelt_threshold: float | None = None,
    ) -> SemanticLookup:
        """The cached answer for a prompt that means the same in the same context, if any.

        ``vector``: the prompt's normalized embedding (the same model as the entries');
        ``threshold``: this lookup's (the embedding model version's calibrated one; the
        context carries that version), else the cache's; ``misspelt_threshold``: a lower
        cosine at which only a misspelt repeat of an entry (its words in order, some
        misspelt) may hit, the guard still reading both (None: no such tier)."""
        threshold = self.threshold if threshold is None else threshold
        floor = threshold if misspelt_threshold is None else min(threshold, misspelt_threshold)
        why = self.ineligible(prompt)
        if why:
            return SemanticLookup("ineligible", reason=why)
        bucket = self._buckets.get(context)
        if bucket is None or not bucket.entries:
            return SemanticLookup("miss")
        n = len(bucket.entries)
        # numpy's own loop, one thread: BLAS's matrix-vector product splits 10,000 rows
        # over threads that wait for each other on busy cores (measured p50 0.14 ms but
        # p99 13 ms on a shared 2-core box, and 12 ms p50 beside ONNX Runtime's threads;
        # this: p99 under 1 ms)
        similarities = np.einsum(
            "ij,j->i", bucket.vectors[:n], np.asarray(vector, dtype=np.float32)
        )
        best = float(similarities.max())
        candidates = np.flatnonzero(similarities >= floor)
        if candidates.size == 0:
            return SemanticLookup("miss", similarity=best)
        now = self._clock()
        asked: Signature | None = None
        reason = ""
        # the most similar first; expired candidates are dropped as they are met
        if candidates.size > self.max_candidates:
            top = np.argpartition(-similarities[candidates], self.max_candidates - 1)
            candidates = candidates[top[: self.max_candidates]]
        ranked = candidates[np.argsort(-similarities[candidates], kind="stable")]
        entries = [bucket.entries[i] for i in ranked]
        for entry, row in zip(entries, ranked, strict=True):
            if entry.expires_at <= now:
                self._drop(entry)
                continue
            if asked is None:
                asked = signature(prompt)
            if similarities[row] < threshold and not misspelt_repeat(entry.signature, asked):
                continue  # below the threshold: only a misspelt repeat of it may hit
            why_not = refusal(entry.signature, asked)
            if why_not is not None:
                reason = reason or why_not
                continue
            self._lru.move_to_end(id(entry))
            return SemanticLookup(
                "hit", entry=_unpack(entry.packed), similarity=float(similarities[row])
            )
        if reason:
            return SemanticLookup("refused", similarity=best, reason=reason)
        return SemanticLookup("miss", similarity=best)

    def put(
        self, context: bytes, prompt: str, vector: Vector, generation: CachedGeneration
    ) -> bool:
        """Keep ``generation`` as the answer to ``prompt`` in ``context``; False when it is
        not kept (a content_filter result, an ineligible prompt, bigger than the budget)."""
        if generation.finish_reason == "content_filter" or self.ineligible(prompt):
            return False
        packed: bytes = msgpack.packb(
            [
                generation.text,
                list(generation.token_ids),
                generation.finish_reason,
                generation.prompt_tokens,
                generation.completion_tokens,
            ]
        )
        vector = np.asarray(vector, dtype=np.float32)
        size = len(packed) + len(prompt.encode()) + vector.nbytes + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            return False
        bucket = self._buckets.get(context)
        if bucket is None:
            bucket = self._buckets[context] = _Bucket(vector.shape[0])
        old = bucket.by_prompt.get(prompt)
        if old is not None:
            self._drop(old)  # the same prompt again: the newer answer replaces it
            bucket = self._buckets.setdefault(context, bucket)
        entry = _Entry(
            context=context,
            row=-1,
            prompt=prompt,
            signature=signature(prompt),
            packed=packed,
            expires_at=self._clock() + self.ttl_s,
            size=size,
        )
        bucket.add(entry, vector)
        self._lru[id(entry)] = entry
        self.bytes_used += size
        while self.bytes_used > self.max_bytes:
            _, oldest = self._lru.popitem(last=False)
            self._lru[id(oldest)] = oldest  # _drop removes it again
            self._drop(oldest)
        return True

    def _drop(self, entry: _Entry) -> None:
        if self._lru.pop(id(entry), None) is None:
            return
        self.bytes_used -= entry.size
        bucket = self._buckets[entry.context]
        bucket.remove(entry)
        if not bucket.entries:
            del self._buckets[entry.context]


def _unpack(packed: bytes) -> CachedGeneration:
    text, token_ids, finish, prompt_tokens, completion_tokens = msgpack.unpackb(packed)
    return CachedGeneration(text, tuple(token_ids), finish, prompt_tokens, completion_tokens)
