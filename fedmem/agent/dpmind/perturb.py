"""DP-MIND Algorithm 3: token-level metric-DP perturbation of a long context.

For every token w_t of the context C = (w_1, ..., w_L) (Algorithm 3, lines 1-6)::

    phi_t     = phi(w_t)                                   (line 2, the embedding map)
    Z_t       ~ p_Z(z) proportional to exp(-epsilon ||z||_2) (line 3, fedmem.dp.MetricLaplace:
                radius ~ Gamma(d, 1/epsilon), direction uniform on the sphere; Sec. 3.1),
                or, with the labelled "l1" mode, proportional to exp(-epsilon ||z||_1)
                (per-coordinate Laplace(1/epsilon), ``mechanism.CoordinateLaplace``)
    phi_hat_t = phi_t + Z_t                                (line 4)
    w'_t      = argmin_{u in W} ||phi(u) - phi_hat_t||_2   (line 5, projection)

then C' = (w'_1, ..., w'_L) is split into chunks (line 7). Adding Z_t makes the release
of phi_hat_t epsilon-d_chi private with d_chi(w, w') = ||phi(w) - phi(w')||_2
(Definition 3.2, Eq. 1; with "l1" noise the metric is ||phi(w) - phi(w')||_1); the projection uses only phi_hat_t, so it is post-processing
(Theorem 3.3) and every projector below, exact or approximate, keeps the guarantee. A
context of L tokens is L independent uses of the mechanism: two contexts differing in
one position t are epsilon * d_chi(w_t, w~_t)-indistinguishable, and in general the
guarantee composes additively over the positions that differ.

The output set W excludes special tokens (see ``TokenTable``); inputs are never filtered.

Projectors (all functions of the noisy embeddings only):

* :class:`ExactProjector`: brute force ``argmin ||E_u||^2 - 2 <E_u, x>`` over the whole
  output set with blocked float32 matrix products (memory O(block x |W|)).
* :class:`IVFProjector`: inverted-file approximate nearest neighbour: k-means cells over
  the output set, probe the ``n_probe`` cells whose centroid is nearest, exact search
  inside them. Its recall@1 against exact is measured in tests and in
  ``scripts/bench_dpmind.py``; an approximate answer changes utility, never privacy.
* :class:`CascadeProjector` (the default): a cheap bfloat16 pass over the whole output
  set keeps a few candidates per token, which are re-ranked exactly in float64; a
  certified bound on the bfloat16 error proves the answer equal to the float64 exact
  argmin, and re-ranks every unexcluded token when the proof fails (``certify=True``).
* :func:`naive_project`: the per-token argmin loop, a baseline for the benchmark only.

:class:`TokenPerturber` streams: it consumes token ids block by block, so memory stays
O(block x (d + |W|)) for any context length; :func:`rechunk` splits the stream into
chunks of a fixed token count (the last one may be shorter, as in Appendix A.2).

Modules: :mod:`.projection` (the :class:`Projector` protocol, :class:`ExactProjector`,
:func:`naive_project`, torch helpers), :mod:`.ivf` (:class:`IVFProjector`), :mod:`.cascade`
(:class:`CascadeProjector`); this module keeps the projector factory and
:class:`TokenPerturber`, and re-exports the projectors' names.
"""

from __future__ import annotations

import functools
from typing import Iterable, Iterator

import numpy as np

from fedmem import _validate as V
from fedmem.agent.dpmind.cascade import MATMULS, CascadeProjector, native_bfloat16
from fedmem.agent.dpmind.embeddings import TokenTable
from fedmem.agent.dpmind.ivf import IVFProjector
from fedmem.agent.dpmind.mechanism import CoordinateLaplace
from fedmem.agent.dpmind.projection import ExactProjector, Projector, naive_project, torch_threads
from fedmem.dp import MetricLaplace

__all__ = [
    "DEFAULT_PROJECTION", "MATMULS", "PROJECTIONS", "CascadeProjector", "ExactProjector", "IVFProjector",
    "Projector", "TokenPerturber", "cached_projector", "make_projector", "naive_project", "native_bfloat16",
    "rechunk", "torch_threads",
]


@functools.lru_cache(maxsize=8)
def cached_projector(table: TokenTable, kind: str, **kwargs) -> Projector:
    """One projector per (table, kind, parameters) per process: an IVF index is built once."""
    return make_projector(table, kind, **kwargs)


PROJECTIONS = ("cascade", "exact", "ivf")
DEFAULT_PROJECTION = "cascade"


def make_projector(table: TokenTable, kind: str = DEFAULT_PROJECTION, **kwargs) -> Projector:
    """``kind`` is one of :data:`PROJECTIONS`; ``kwargs`` go to that projector's constructor."""
    if kind == "cascade":
        return CascadeProjector(table, **kwargs)
    if kind == "exact":
        return ExactProjector(table, **kwargs)
    if kind == "ivf":
        return IVFProjector(table, **kwargs)
    raise ValueError(f"projection must be one of {list(PROJECTIONS)}. Found {kind!r}.")


class TokenPerturber:
    """Algorithm 3 as a streaming sampler: a frozen noise record + table + projector.

    The mechanism record (what is released: epsilon-d_chi noise on phi) is separate from
    how the nearest token is found (the projector). The record is a
    :class:`MetricLaplace` (L2, the default) or a
    :class:`~fedmem.agent.dpmind.mechanism.CoordinateLaplace` (L1, per-coordinate
    Laplace); see ``fedmem.agent.dpmind.mechanism`` for each guarantee. The RNG is
    injected per call.
    """

    def __init__(self, mechanism: MetricLaplace | CoordinateLaplace, table: TokenTable,
                 projector: Projector | None = None, *, block: int = 8192):
        if not isinstance(mechanism, (MetricLaplace, CoordinateLaplace)):
            raise TypeError(f"mechanism must be a MetricLaplace or CoordinateLaplace record. "
                            f"Found {type(mechanism).__name__}.")
        if mechanism.dim != table.dim:
            raise ValueError(f"mechanism.dim must equal the table dimension {table.dim}. Found {mechanism.dim!r}.")
        self.mechanism = mechanism
        self.table = table
        self.projector = projector if projector is not None else CascadeProjector(table)
        self.block = V.positive_int("block", block)

    @property
    def epsilon(self) -> float:
        return self.mechanism.epsilon

    def _ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-d array of token ids. Found shape {arr.shape}, dtype {arr.dtype}.")
        if arr.size and (arr.min() < 0 or arr.max() >= self.table.vocab_size):
            bad = arr[(arr < 0) | (arr >= self.table.vocab_size)][0]
            raise ValueError(f"ids must be in [0, {self.table.vocab_size}). Found {int(bad)!r}.")
        return arr.astype(np.int64, copy=False)

    def noisy_embeddings(self, ids, rng) -> np.ndarray:
        """phi(w_t) + Z_t for each id (Algorithm 3, lines 2-4), float64 (n, d)."""
        arr = self._ids(ids)
        if arr.size == 0:
            return np.zeros((0, self.table.dim))
        return self.table.matrix[arr].astype(np.float64) + self.mechanism.sample(rng, arr.size)

    def perturb_ids(self, ids, rng) -> np.ndarray:
        """w'_t for every w_t (Algorithm 3, lines 1-6), processed in blocks of ``block`` tokens."""
        arr = self._ids(ids)
        V.rng_check("rng", rng)
        out = np.empty(arr.size, dtype=np.int64)
        for s in range(0, arr.size, self.block):
            out[s:s + self.block] = self.projector.project(self.noisy_embeddings(arr[s:s + self.block], rng))
        return out

    def stream(self, id_blocks: Iterable[np.ndarray], rng) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(clean_block, perturbed_block)`` pairs; memory is bounded by ``block``."""
        V.rng_check("rng", rng)
        for ids in id_blocks:
            arr = self._ids(ids)
            for s in range(0, arr.size, self.block):
                part = arr[s:s + self.block]
                yield part, self.perturb_ids(part, rng)


def rechunk(blocks: Iterable[np.ndarray], chunk_tokens: int) -> Iterator[np.ndarray]:
    """Re-split a stream of id blocks into consecutive chunks of ``chunk_tokens`` (last may be short)."""
    V.positive_int("chunk_tokens", chunk_tokens)
    buf: list[np.ndarray] = []
    have = 0
    for b in blocks:
        b = np.asarray(b)
        while b.size:
            take = min(chunk_tokens - have, b.size)
            buf.append(b[:take])
            have += take
            b = b[take:]
            if have == chunk_tokens:
                yield np.concatenate(buf)
                buf, have = [], 0
    if have:
        yield np.concatenate(buf)
