"""Reusing the key/value cache of prompts that start the same way.

Chat requests repeat their system prompt and history; a new prompt that shares a prefix
with a recent one starts its prefill after that prefix, which is the slow part of time to
first token. Keys and values at a position depend only on the tokens up to it, so any
prefix of a cached prompt's cache is valid for another prompt with the same tokens.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int64]
Arrays = list[npt.NDArray[np.float32]]


def common_prefix(a: Tokens, b: Tokens) -> int:
    n = min(len(a), len(b))
    same = a[:n] == b[:n]
    return n if bool(same.all()) else int(np.argmin(same))


class PrefixCache:
    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens  # shorter shared prefixes are not worth a lookup
        self._entries: OrderedDict[bytes, tuple[Tokens, Arrays]] = OrderedDict()
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Tokens) -> tuple[int, Arrays | None]:
        """The longest cached prefix of ``prompt`` (at most all but its last token)."""
        best, best_key = 0, b""
        for key, (tokens, _) in self._entries.items():
            n = common_prefix(tokens, prompt)
            if n > best:
                best, best_key = n, key
        best = min(best, len(prompt) - 1)  # the last token must run to give logits
        if best < self.min_tokens:
            return 0, None
        self._entries.move_to_end(best_key)
        _, arrays = self._entries[best_key]
        return best, [np.ascontiguousarray(a[:, :, :best]) for a in arrays]

    def store(self, prompt: Tokens, arrays: Arrays) -> None:
        """Keep ``arrays`` ([1, heads, len(prompt), dim] each) for later prompts."""
        if len(prompt) < self.min_tokens:
            return
        size = sum(a.nbytes for a in arrays) + prompt.nbytes
        if size > self.max_bytes:
            return
        key = prompt.tobytes()
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes_used -= sum(a.nbytes for a in old[1]) + old[0].nbytes
        self._entries[key] = (prompt.copy(), arrays)
        self.bytes_used += size
        while self.bytes_used > self.max_bytes:
            _, (tokens, evicted) = self._entries.popitem(last=False)
            self.bytes_used -= sum(a.nbytes for a in evicted) + tokens.nbytes
