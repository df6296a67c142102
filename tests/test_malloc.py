"""fedmem._malloc: glibc's heap thresholds in fedmem's own worker processes."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from fedmem import _malloc


def test_keep_freed_memory_sets_the_thresholds_on_glibc_and_names_bad_values():
    """On glibc the call succeeds (and is recorded in KEPT); elsewhere it is a no-op returning False.
    In a fresh process, a batch's working set (five 10 MB arrays at once) freed and allocated again
    is served from the heap afterwards: no new pages are faulted in (minor faults counted), whereas
    by default glibc returns the freed heap top to the kernel and faults it in again every batch
    (the companion half of the same check)."""
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    with pytest.raises(ValueError, match="mmap_threshold must be a positive number of bytes. Found 0"):
        _malloc.keep_freed_memory(0)
    with pytest.raises(ValueError, match="trim_threshold"):
        _malloc.keep_freed_memory(trim_threshold=True)
    if not glibc:
        assert _malloc.keep_freed_memory() is False
        return
    prog = """
import resource, sys, numpy as np
from fedmem import _malloc
if sys.argv[1] == "keep":
    assert _malloc.keep_freed_memory() and _malloc.KEPT is True
def batch():                            # a batch's working set: five 10 MB arrays alive at once, then freed
    arrays = [np.ones(10 << 17) for _ in range(5)]
    del arrays
batch()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
    faults = {how: int(subprocess.run([sys.executable, "-c", prog, how], capture_output=True, text=True,
                                      check=True).stdout) for how in ("keep", "default")}
    # 4 batches x 50 MB = 51,200 pages of 4 KiB: kept, next to none is faulted in again (0 measured here);
    # by default the freed heap top is faulted in again every batch (8,676-10,209 pages measured here)
    assert faults["keep"] < 1000 and faults["default"] > 4000, faults
