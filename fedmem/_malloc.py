"""Keep freed heap memory in fedmem's own worker processes (shard hosts, compute parties).

glibc serves an allocation above its mmap threshold (128 KiB at start, raised on the fly
up to 32 MiB after such a block is freed) with fresh pages from ``mmap`` and returns them
on ``free``; it also returns a freed heap top above its trim threshold to the kernel. A
batch of queries allocates the same large arrays again and again (a shard host: 10 MB of
value shares per batch of 100; a CrypTen party: the protocol's tensors), so each batch
pays the kernel for zeroed pages on first touch, page by page. Fixing both thresholds keeps
what a process used in its heap for the next batch: its resident memory stays at its peak
working set instead of dropping between batches, and no fresh pages are mapped per batch.

Measured (``scripts/bench_engine.py``, this code against the code before it, alternated):
docs/federation-engine.md. Called only in processes fedmem starts (its Ray actors), never in
a user's driver. A no-op off glibc (``mallopt`` is glibc's).
"""

from __future__ import annotations

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""Allocations below this come from the heap (32 MiB: glibc's largest dynamic threshold, valid everywhere)."""
TRIM_THRESHOLD = 256 << 20
"""Freed memory kept at the heap top before any is returned to the kernel."""


KEPT: bool | None = None
"""What the last :func:`keep_freed_memory` call in this process returned (``None``: never called)."""


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process; ``True`` if both were set."""
    global KEPT
    KEPT = _set(mmap_threshold, trim_threshold)
    return KEPT


def _set(mmap_threshold, trim_threshold) -> bool:
    import ctypes
    import platform

    for name, v in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 40:
            raise ValueError(f"{name} must be a positive number of bytes. Found {v!r}.")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold)))
    except (OSError, AttributeError):
        return False
