"""The key/value cache of a running batch: one tensor per layer and kind, rows aligned right.

Row ``i`` holds one sequence's keys and values in its last ``lengths[i]`` columns; the
columns before them are padding, masked out by ``mask``. All rows grow by one column per
decode step. A sequence joins by being left-padded to the batch width (or the batch is
left-padded to the newcomer's), and leaves by dropping its row; columns that are padding
in every row are trimmed once they are a good share of the width.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agent.engine.causal_lm import KV, kv_to_numpy

Array = npt.NDArray[np.float32]


class BatchKV:
    def __init__(self, num_tensors: int, num_kv_heads: int, head_dim: int, dtype: type) -> None:
        self._shape_tail = (num_kv_heads, head_dim)
        self._dtype = dtype
        self.tensors: list[KV] = [
            np.zeros((0, num_kv_heads, 0, head_dim), dtype=dtype) for _ in range(num_tensors)
        ]
        self.mask = np.zeros((0, 0), dtype=np.int64)  # [rows, width]: 1 where a token is

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def used_tokens(self) -> int:
        """Key/value slots allocated (padding included)."""
        return self.rows * self.width

    def _pad_left(
        self, tensors: list[Array], mask: npt.NDArray[np.int64], width: int
    ) -> tuple[list[Array], npt.NDArray[np.int64]]:
        extra = width - mask.shape[1]
        if extra <= 0:
            return tensors, mask
        padded = [np.pad(t, ((0, 0), (0, 0), (extra, 0), (0, 0))) for t in tensors]
        return padded, np.pad(mask, ((0, 0), (extra, 0)))

    def _arrays(self) -> list[Array]:
        return [kv_to_numpy(t) for t in self.tensors]

    def append(self, tensors: list[KV], mask: npt.NDArray[np.int64]) -> int:
        """Add rows (tensors [n, heads, len, dim], mask [n, len]); returns the first new row."""
        first = self.rows
        width = max(self.width, int(mask.shape[1]))
        mine, my_mask = self._pad_left(self._arrays(), self.mask, width)
        theirs, their_mask = self._pad_left([kv_to_numpy(t) for t in tensors], mask, width)
        self.tensors = [np.concatenate([a, b], axis=0) for a, b in zip(mine, theirs, strict=True)]
        self.mask = np.concatenate([my_mask, their_mask], axis=0)
        return first

    def remove(self, rows: list[int]) -> None:
        if not rows:
            return
        keep = np.setdiff1d(np.arange(self.rows), rows)
        self.tensors = [t[keep] for t in self._arrays()]
        self.mask = self.mask[keep]
        self._trim()

    def advance(self, presents: list[KV]) -> None:
        """Take the tensors a decode step returned (each row one column wider)."""
        self.tensors = presents
        self.mask = np.concatenate([self.mask, np.ones((self.rows, 1), dtype=np.int64)], axis=1)

    def _trim(self) -> None:
        if self.rows == 0:
            self.tensors = [t[:, :, :0] for t in self._arrays()]
            self.mask = self.mask[:, :0]
            return
        empty = int(np.argmax(self.mask.any(axis=0)))  # leading all-padding columns
        if empty and empty * 4 >= self.width:
            self.tensors = [np.ascontiguousarray(t[:, :, empty:]) for t in self._arrays()]
            self.mask = np.ascontiguousarray(self.mask[:, empty:])
