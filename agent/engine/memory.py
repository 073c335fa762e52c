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
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["heap_in_use", "kv_bytes_per_token", "release_mapped_weights", "trim_heap"]

MADV_DONTNEED = 4  # unmap these pages (file pages stay in the page cache)
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (clean file pages: dropped)


@functools.cache
def _glibc_function(name: str) -> Any | None:
    """``name`` from glibc (None elsewhere, or where this glibc lacks it)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    trim = _glibc_function("malloc_trim")
    if trim is None:  # pragma: no cover - a glibc without malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


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


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    mallinfo2 = _glibc_function("mallinfo2")  # glibc 2.33 and later
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes = []
    mallinfo2.restype = _MallInfo2
    return mallinfo2  # type: ignore[no-any-return]


def heap_in_use() -> int | None:
    """Bytes the C heap has handed out and not had back (glibc's ``mallinfo2``: blocks in
    use in every arena plus blocks it mapped on their own); None where the C library is not
    glibc 2.33 or later.

    Unlike the resident set it does not move when :func:`trim_heap` runs or when a new
    allocation reuses pages an earlier free left in the heap, so a model's footprint is its
    change across the load whether or not the heap was trimmed first (SmolLM2-135M int4:
    123 MiB in each of eight loads, where the resident set grew 58-62 MiB when the load
    reused a freed model's pages and 146-147 MiB from a trimmed heap).

    Not cheap: glibc walks every free block of every arena, 0.1 ms in a new process and
    12-14 ms in an agent that has loaded and freed two models; call it off the event loop.
    """
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)


def limit_malloc_arenas(arenas: int) -> bool:
    """Let this process's threads share at most ``arenas`` glibc malloc arenas (0: leave
    glibc's default of 8 per core); call it before the threads start. Returns whether it
    was set (False elsewhere than glibc).

    Why: each thread that allocates gets an arena of its own until there are 8 per core,
    and a model's load runs on a new thread. Swapping two models under a budget then
    spread their sessions over new arenas: the arenas' address space grew 428 -> 785 MiB
    in six swaps, and SmolLM2's resident set after a load varied by 34 MiB (320-354) where
    the bytes in use did not move; in the swap benchmark the agent's resident set after 20
    swaps was 21-28 MiB above its figure after 2, and its peak 5-7 MiB over the budget's
    10% (2 of 3 runs). With one arena SmolLM2's resident set was 306 MiB after each of six
    loads; with two (the agent's default), the benchmark's drift was -3, -3 and 19 MiB in
    three runs and its peak 16 MiB under the line in one, 3 and 8 over in the others (the
    peak is Qwen2.5-Coder's load: see the memory-budget guide). One arena slowed
    SmolLM2's loads (p95 0.44 s against 0.37 with two: the event loop's and the loader's
    allocations queue on one lock). Later, with the loads' other costs gone, two arenas
    (and four) made SmolLM2's load 40-60 ms slower than glibc's default, whose drift was
    16 and 6 MiB: the agent leaves glibc's default unless told (``engine.malloc_arenas``)."""
    if arenas <= 0:
        return False
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token takes in a model's key/value cache: a key and a value per layer."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def release_mapped_weights(model_path: Path, *, keep_cached: bool = True) -> int:
    """Let go of the resident pages of ``model_path``'s external-data files
    (``model.onnx.data``) that this process maps; returns the bytes of mappings advised.

    ONNX Runtime memory-maps external weights. MatMulNBits copies its weights into prepacked
    buffers while the session loads and unmaps them, but keeps its scales and zero points
    mapped: pages read once at load that stayed resident (19 MiB of SmolLM2-135M int4's
    141 MB file). Serving reads the 8-bit token embedding row by row, and the kernel maps
    16 neighbouring pages on each fault: after a few hundred requests two thirds of
    SmolLM2's 27 MiB table was mapped again. Both are let go after a load and when the
    engine is idle.

    ``keep_cached=True`` (the default) unmaps the pages with ``MADV_DONTNEED`` and leaves
    them in the page cache, which the kernel reclaims when it needs to: the next request,
    or the next load of the model (a swap under a memory budget), maps them back with minor
    faults and reads nothing from disk. ``MADV_PAGEOUT`` (``keep_cached=False``, and any
    mapping holding a private, written page, which it keeps where ``MADV_DONTNEED`` would
    drop the write) also drops clean pages from the page cache, but leaves dirty ones (a
    file just written, as model sync writes one) mapped. Linux only; elsewhere, or on a
    kernel without these, nothing happens.
    """
    madvise = _madvise()
    if madvise is None:
        return 0
    prefix = model_path.name + "."
    names: set[str] = set()
    for path in model_path.parent.iterdir():
        if path.name.startswith(prefix) and path.is_file():
            names.update({str(path.absolute()), str(path.resolve())})
    advised = 0
    for start, end, written in _mappings_of(names):
        advice = MADV_DONTNEED if keep_cached and not written else MADV_PAGEOUT
        if madvise(start, end - start, advice) == 0:
            advised += end - start
    log.debug("released %d MiB of mapped weights of %s", advised >> 20, model_path)
    return advised


# a line of /proc/PID/maps: addresses, perms, offset, device, inode, path
_MAPS_ENTRY = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+ +([^\n]*)$", re.M)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# /proc/PID/pagemap: one 64-bit entry a page; bit 63 present, 62 swapped, 61 a file page
_PRESENT, _SWAPPED, _FILE_PAGE = 1 << 63, 1 << 62, 1 << 61


def _mappings_of(names: set[str]) -> list[tuple[int, int, bool]]:
    """This process's mappings of these files: start, end, and whether any of its pages is
    private (written since it was mapped). From ``/proc/self/maps`` and, for a private
    writable mapping only, the pagemap entries of its own pages: 1-2 ms where reading
    ``/proc/self/smaps`` (every page of every mapping of the process walked) took 12-25 ms
    of each load and each idle release with Qwen2.5-Coder loaded. Falls back to smaps
    where the pagemap cannot be read."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            text = maps.read()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return _mappings_from_smaps(names)
    found: list[tuple[int, int, bool]] = []
    checked: list[int] = []  # indexes in found of the mappings that could hold a write
    for entry in _MAPS_ENTRY.finditer(text):
        if entry[4] not in names:
            continue
        start, end, perms = int(entry[1], 16), int(entry[2], 16), entry[3]
        if perms[1] == "w" and perms[3] == "p":  # only these can hold a written page
            checked.append(len(found))
        found.append((start, end, False))
    try:
        written = _private_pages(pagemap, [found[i][:2] for i in checked])
    finally:
        os.close(pagemap)
    if written is None:
        return _mappings_from_smaps(names)
    for i, has in zip(checked, written, strict=True):
        found[i] = (found[i][0], found[i][1], has)
    return found


# mappings closer than this are read from the pagemap in one piece (the entries between
# them, 8 bytes a page, cost less than another read)
_PAGEMAP_GAP = 4 << 20


def _private_pages(pagemap: int, ranges: list[tuple[int, int]]) -> list[bool] | None:
    """For each ``[start, end)`` (in address order, as ``/proc/self/maps`` lists them):
    whether one of its pages is present or swapped and not a file page, a private copy made
    by a write. One read of the pagemap for each cluster of nearby ranges: a session maps
    each of its weights' scales on its own (SmolLM2-135M: 427 mappings), and a read and a
    check for each took 15 ms of every load. None when the pagemap cannot be read."""
    result: list[bool] = []
    i = 0
    while i < len(ranges):
        low, high = ranges[i]
        j = i + 1
        while j < len(ranges) and ranges[j][0] - high <= _PAGEMAP_GAP:
            high = max(high, ranges[j][1])
            j += 1
        pages = (high - low) // _PAGE
        try:
            raw = os.pread(pagemap, pages * 8, low // _PAGE * 8)
        except OSError:
            return None
        if len(raw) != pages * 8:
            return None
        flags = np.frombuffer(raw, dtype=np.uint64)
        private = ((flags & np.uint64(_PRESENT | _SWAPPED)) != 0) & (
            (flags & np.uint64(_FILE_PAGE)) == 0
        )
        counts = np.concatenate(([0], np.cumsum(private, dtype=np.int64)))
        for start, end in ranges[i:j]:
            first, last = (start - low) // _PAGE, (end - low) // _PAGE
            result.append(bool(counts[last] > counts[first]))
        i = j
    return result


# a mapping's first line in /proc/PID/smaps (addresses, perms, offset, device, inode, path)
# and the field lines after it, up to the next mapping
_SMAPS_ENTRY = re.compile(
    r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+ +([^\n]*)\n((?:[A-Za-z_]+:[^\n]*\n)*)", re.M
)
_ANONYMOUS = re.compile(r"^Anonymous: +([0-9]+)", re.M)


def _mappings_from_smaps(names: set[str]) -> list[tuple[int, int, bool]]:
    """:func:`_mappings_of` from ``/proc/self/smaps`` (its ``Anonymous`` field): one read
    and one regular expression over the whole file."""
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            text = smaps.read()
    except OSError:  # pragma: no cover - no procfs
        return []
    found: list[tuple[int, int, bool]] = []
    for entry in _SMAPS_ENTRY.finditer(text):
        if entry[3] not in names:
            continue
        anonymous = _ANONYMOUS.search(entry[4])
        written = anonymous is not None and int(anonymous[1]) > 0
        found.append((int(entry[1], 16), int(entry[2], 16), written))
    return found
