"""Giving freed memory back to the operating system, and what a model's key/value cache costs.

glibc's ``free`` keeps freed memory inside the process: small and mid-sized blocks (up to
its dynamic mmap threshold, which rises to 32 MiB after the first large free) stay in its
heaps for reuse. An ONNX Runtime session releases hundreds of such blocks when it is
dropped, and the engine's key/value buffers are such blocks too; measured on SmolLM2-135M,
up to 99 MiB stayed resident after ``del session`` until ``malloc_trim(0)`` returned it.
:func:`trim_heap` calls it where the C library is glibc and does nothing elsewhere (musl,
macOS), so callers need not check.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["kv_bytes_per_token", "trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # pragma: no cover - a glibc without malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap(reason: str = "") -> bool:
    """Return the C heap's free pages to the OS (``malloc_trim(0)``); True when it ran.

    Blocking (a few milliseconds on a large heap): call it off the event loop when it can
    run often; after a model is released it runs once.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    started = time.perf_counter()
    trim(0)
    log.debug("malloc_trim(0)%s in %.1f ms", f" ({reason})" if reason else "",
              (time.perf_counter() - started) * 1000)  # fmt: skip
    return True


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token takes in a model's key/value cache: a key and a value per layer."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes
