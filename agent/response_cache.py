"""Exact-match response cache: finished generations keyed by API key, model version and
request.

Entries are per API key: the key id is part of the cache key, so a hit (and its
``X-Edgefleet-Cache: hit`` header) only ever answers the key that made the entry, and never
tells one key that another sent the same prompt. Without keys (auth off) the cache is
shared. Entries are msgpack-encoded and kept in least-recently-used order under a byte
budget. A hit never touches the engine.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgpack


@dataclass(frozen=True)
class CachedGeneration:
    text: str = field(repr=False)  # the whole completion
    token_ids: tuple[int, ...] = field(repr=False)
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


def cache_key(
    model_id: str, version: str, endpoint: str, request: dict[str, Any], api_key_id: str = ""
) -> bytes:
    """The same request to the same model version with the same API key gives the same key
    (field order aside); ``api_key_id`` "": no key (auth off)."""
    canonical = json.dumps(
        [api_key_id, model_id, version, endpoint, request], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).digest()


class ResponseCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CachedGeneration | None:
        packed = self._entries.get(key)
        if packed is None:
            return None
        self._entries.move_to_end(key)
        text, token_ids, finish, prompt_tokens, completion_tokens = msgpack.unpackb(packed)
        return CachedGeneration(text, tuple(token_ids), finish, prompt_tokens, completion_tokens)

    def put(self, key: bytes, entry: CachedGeneration) -> None:
        packed: bytes = msgpack.packb(
            [
                entry.text,
                list(entry.token_ids),
                entry.finish_reason,
                entry.prompt_tokens,
                entry.completion_tokens,
            ]
        )
        size = len(packed) + len(key)
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes_used -= len(old) + len(key)
        self._entries[key] = packed
        self.bytes_used += size
        while self.bytes_used > self.max_bytes:
            evicted_key, evicted = self._entries.popitem(last=False)
            self.bytes_used -= len(evicted) + len(evicted_key)
