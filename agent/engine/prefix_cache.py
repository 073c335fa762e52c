"""Automatic prefix caching: reuse the keys and values of prompts that start the same way.

Chat requests repeat their system prompt and history; a new prompt that shares a prefix
with a recent one starts its prefill after that prefix, which is the slow part of time to
first token. As in vLLM, the cache holds full blocks of ``block_tokens`` tokens, each keyed
by a hash of every token up to its end (so a block is only ever reused after the same
prefix), and a prefix shared by many prompts is stored once.

Reuse is exact: with the fused-attention graph, running a prompt's last tokens against a
cached prefix gives bit-identical logits to running the whole prompt, as long as at least
two tokens run (a single token takes the kernels' matrix-vector path, whose rounding
differs). So a lookup leaves at least two tokens of the prompt to run.

Eviction is least-recently-used, by bytes; a prefix's blocks are touched deepest first, so
a block is always evicted before the blocks it extends.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int64]
Block = npt.NDArray[np.float32]  # [tensors, kv_heads, block_tokens, head_dim]
MIN_RUN = 2  # prompt tokens a lookup always leaves to run (see the module docstring)


class PrefixCache:
    def __init__(self, max_bytes: int, block_tokens: int = 16) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, prompt: Tokens, blocks: int) -> list[bytes]:
        keys: list[bytes] = []
        digest = b""
        size = self.block_tokens
        for i in range(blocks):
            h = hashlib.blake2b(digest, digest_size=16)
            h.update(np.ascontiguousarray(prompt[i * size : (i + 1) * size]).tobytes())
            digest = h.digest()
            keys.append(digest)
        return keys

    def _touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):
            self._blocks.move_to_end(key)

    def _cached_keys(self, prompt: Tokens) -> list[bytes]:
        """Keys of the cached blocks that start ``prompt``, leaving ``MIN_RUN`` tokens."""
        usable = max(0, (len(prompt) - MIN_RUN) // self.block_tokens)
        found: list[bytes] = []
        for key in self._keys(prompt, usable):
            if key not in self._blocks:
                break
            found.append(key)
        return found

    def cached_tokens(self, prompt: Tokens) -> int:
        """How many tokens :meth:`lookup` would return now (nothing is touched or copied)."""
        return len(self._cached_keys(prompt)) * self.block_tokens

    def lookup(self, prompt: Tokens) -> tuple[int, Block | None]:
        """The longest cached prefix of ``prompt`` in whole blocks (leaving at least
        ``MIN_RUN`` tokens), as one array [tensors, kv_heads, tokens, head_dim]."""
        found = self._cached_keys(prompt)
        if not found:
            return 0, None
        self._touch(found)
        arrays = [self._blocks[k] for k in found]
        return len(found) * self.block_tokens, np.concatenate(arrays, axis=2)

    def store(self, prompt: Tokens, read: Callable[[int, int], Block]) -> int:
        """Keep the whole blocks of ``prompt`` not cached yet; ``read(start, end)`` gives
        their keys/values [tensors, kv_heads, end - start, head_dim]. Returns blocks added."""
        keys = self._keys(prompt, len(prompt) // self.block_tokens)
        have = 0
        while have < len(keys) and keys[have] in self._blocks:
            have += 1
        if have < len(keys):
            size = self.block_tokens
            arrays = read(have * size, len(keys) * size)
            block_bytes = arrays.nbytes // (len(keys) - have)
            if block_bytes * (len(keys) - have) > self.max_bytes:
                self._touch(keys[:have])
                return 0
            for j, key in enumerate(keys[have:]):
                self._blocks[key] = arrays[:, :, j * size : (j + 1) * size].copy()
                self.bytes_used += block_bytes
        self._touch(keys)
        while self.bytes_used > self.max_bytes:
            _, evicted = self._blocks.popitem(last=False)
            self.bytes_used -= evicted.nbytes
        return len(keys) - have
