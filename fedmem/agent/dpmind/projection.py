"""Projection of DP-MIND's noisy embeddings back to tokens (Algorithm 3, line 5): the
:class:`Projector` protocol, :class:`ExactProjector` (blocked float32 matrix products),
:func:`naive_project` (the per-token baseline of the benchmark) and the torch helpers that
every projector shares. A projector reads only the noisy embeddings, so its output is
post-processing of the epsilon-d_chi private release (Theorem 3.3).
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import numpy as np

from fedmem import _validate as V
from fedmem.agent.dpmind.embeddings import TokenTable


def load_torch():
    """The ``torch`` module, imported on first use.

    Deferred on purpose: ``python -X importtime -c "import torch"`` measured 9.9 s cumulative
    on the shared 2-core development machine, against 1.3 s for all of
    ``fedmem.agent.dpmind.perturb`` without torch, and many users of the package never project.
    """
    import torch

    return torch


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run a block with ``n`` torch intra-op threads (restored afterwards); None leaves torch alone.

    On a shared, oversubscribed machine one thread is often much faster than two: the
    many small per-cell products of :class:`~fedmem.agent.dpmind.ivf.IVFProjector` pay a synchronisation cost per
    parallel region (measured in ``scripts/bench_dpmind.py``).
    """
    if n is None:
        yield
        return
    torch = load_torch()
    old = torch.get_num_threads()
    torch.set_num_threads(V.positive_int("threads", n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Projector(Protocol):
    name: str

    def project(self, points: np.ndarray) -> np.ndarray:  # pragma: no cover - protocol
        """Token ids (int64, shape (n,)) nearest to each row of ``points`` (n, d)."""
        ...


def as_points(table: TokenTable, points) -> np.ndarray:
    """``points`` as a C-contiguous float32 array of shape ``(n, table.dim)``; ValueError otherwise."""
    arr = np.asarray(points)
    if arr.ndim != 2 or arr.shape[1] != table.dim:
        raise ValueError(f"points must have shape (n, {table.dim}). Found shape {arr.shape}.")
    return np.ascontiguousarray(arr, dtype=np.float32)


class ExactProjector:
    """Exact nearest output token by blocked matrix products (Algorithm 3, line 5)."""

    name = "exact"

    def __init__(self, table: TokenTable, *, block: int = 1024, threads: int | None = None):
        torch = load_torch()
        self.table = table
        self.threads = None if threads is None else V.positive_int("threads", threads)
        self.block = V.positive_int("block", block)
        self._ids = torch.from_numpy(np.array(table.output_ids))
        self._mat = torch.from_numpy(np.array(table.matrix[table.output_ids]))  # (|W|, d) float32
        self._sq = torch.from_numpy(table.sqnorms[table.output_ids].astype(np.float32))

    def project(self, points) -> np.ndarray:
        torch = load_torch()
        x = torch.from_numpy(as_points(self.table, points))
        out = torch.empty(x.shape[0], dtype=torch.int64)
        with torch_threads(self.threads):
            self._exact(x, out)
        return out.numpy()

    def _exact(self, x, out) -> None:
        torch = load_torch()
        for s in range(0, x.shape[0], self.block):
            xb = x[s:s + self.block]
            # ||E_u - x||^2 - ||x||^2 = ||E_u||^2 - 2 <E_u, x>
            d = torch.addmm(self._sq, xb, self._mat.T, beta=1.0, alpha=-2.0)
            out[s:s + self.block] = self._ids[d.argmin(dim=1)]


def naive_project(table: TokenTable, points) -> np.ndarray:
    """Per-token ``argmin_u ||E_u - x||`` in numpy, one token at a time (benchmark baseline)."""
    pts = as_points(table, points)
    mat = table.matrix[table.output_ids]
    out = np.empty(pts.shape[0], dtype=np.int64)
    for i, x in enumerate(pts):
        out[i] = table.output_ids[int(np.argmin(((mat - x) ** 2).sum(axis=1)))]
    return out
