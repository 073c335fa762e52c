"""The per-request vault (placeholder <-> original) and the streamed restorer."""

from __future__ import annotations

import re
import threading

from agent.redaction.detectors import ENTITY_TYPES

_TYPES = "|".join(sorted(ENTITY_TYPES, key=len, reverse=True))
PLACEHOLDER = re.compile(rf"<({_TYPES})_(\d{{1,9}})>")
# The longest placeholder: "<" + the longest type + "_" + 9 digits + ">".
_MAX_PLACEHOLDER = 1 + max(len(t) for t in ENTITY_TYPES) + 1 + 9 + 1
_PREFIXES = frozenset(f"<{t}_"[:k] for t in ENTITY_TYPES for k in range(1, len(t) + 3))


def placeholder(type_: str, n: int) -> str:
    return f"<{type_}_{n}>"


class Vault:
    """One request's placeholders: the same value always gets the same placeholder.

    Holds the original values in memory only, for the request's lifetime; ``counts`` says
    how many values of each type were replaced (each occurrence; never the values).
    """

    def __init__(self) -> None:
        self._by_value: dict[tuple[str, str], str] = {}
        self._by_placeholder: dict[str, str] = {}
        self._next: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def placeholder_for(self, type_: str, value: str) -> str:
        with self._lock:
            key = (type_, value)
            self._counts[type_] = self._counts.get(type_, 0) + 1
            found = self._by_value.get(key)
            if found is not None:
                return found
            n = self._next.get(type_, 0) + 1
            self._next[type_] = n
            ph = placeholder(type_, n)
            self._by_value[key] = ph
            self._by_placeholder[ph] = value
            return ph

    def reserve(self, text: str) -> None:
        """Placeholder-shaped strings already in the input are never reused for a value."""
        with self._lock:
            for m in PLACEHOLDER.finditer(text):
                type_, n = m.group(1), int(m.group(2))
                if m.group() not in self._by_placeholder:
                    self._next[type_] = max(self._next.get(type_, 0), n)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __len__(self) -> int:
        return len(self._by_placeholder)

    def restore(self, text: str) -> str:
        """Placeholders of this vault back to their originals; others are left as they are."""
        if "<" not in text or not self._by_placeholder:
            return text
        table = self._by_placeholder
        return PLACEHOLDER.sub(lambda m: table.get(m.group(), m.group()), text)

    def stream_restorer(self) -> StreamRestorer:
        return StreamRestorer(self)


def _partial_start(text: str) -> int:
    """Where a possible unfinished placeholder starts at the end of ``text`` (or len)."""
    start = text.rfind("<", max(0, len(text) - _MAX_PLACEHOLDER))
    if start < 0:
        return len(text)
    tail = text[start:]
    if ">" in tail:
        return len(text)
    if tail in _PREFIXES:
        return start
    # "<TYPE_" then digits
    under = tail.rfind("_")
    if under > 0 and tail[: under + 1] in _PREFIXES and len(tail) - under - 1 <= 9:
        digits = tail[under + 1 :]
        if digits.isdigit() and f"<{tail[1:under]}" in {f"<{t}" for t in ENTITY_TYPES}:
            return start
    return len(text)


class StreamRestorer:
    """Restores one streamed choice; holds back only what could be a partial placeholder."""

    def __init__(self, vault: Vault) -> None:
        self._vault = vault
        self._held = ""

    def feed(self, chunk: str) -> str:
        text = self._held + chunk
        cut = _partial_start(text)
        self._held = text[cut:]
        return self._vault.restore(text[:cut])

    def flush(self) -> str:
        text, self._held = self._held, ""
        return self._vault.restore(text)
