"""The annulus bound of BRACE's certificate (the ``bound="annulus"`` term; papers/001 App. B).

``g_j`` bounds the clean-vs-released gate discrepancy using only *public* centres. Let
``W_s(j) >= sup ||z_s(B) - y_s||`` over banks within ``j`` (``W_0 = 0``). For a centre
``c`` with ``||c - y|| <= w`` the gate at ``c`` differs from the gate at ``y`` only by
records in the annuli ``r - w < ||x - y|| <= r`` (leaving, at distance <= 2r from the
old mean) and ``r < ||x - y|| <= r + w`` (entering, <= 2r + w from it), so with ``u``
leaving and ``v`` entering::

    ||Phi_B(c) - Phi_B(y)|| <= (v (2r + w) + 2r u) / (m - u + v)   (<= 2r + w always)

Over banks within ``j`` the gate count is at least ``m - j`` and each annulus holds at
most ``j`` more records; the supremum of the ratio over that set is ``G(j, w)`` (if the
gate can be emptied, ``G = 2r + w``). Then ``g_j = G_t(j, W_{t-1}(j))`` and::

    W_s(j) = min{ s r + ||q - y_s||,
                  G_s(j, W_{s-1}(j)) + min{ r + ||y_{s-1} - y_s||,
                                            ||a_s(D) - y_s|| + sum_{i<j} 2r / max(1, m_s - i) } }

Every term is non-decreasing in ``j``, in ``w`` and in the annulus counts and
non-increasing in ``m``; a neighbour changes each count by at most one and ``a_s`` by at
most ``2r / max(1, m_s(D'))``, which is what (b) of the
certificate's smoothness argument (:mod:`fedmem.agent.brace.certificate`) needs.

:class:`AnnulusBound` is the part of :class:`~fedmem.agent.brace.certificate.Certifier`
that evaluates ``W_{t-1}(j)``; it reads the certifier's ``p``, ``q``, ``_stats`` and ``_ys``.
"""

from __future__ import annotations

import math

import numpy as np


class SortedRows:
    """Each row's distances sorted and laid end to end with offsets ``b * BIG`` so that
    :meth:`count_le` is one vectorised ``searchsorted`` for all rows."""

    def __init__(self, dists: np.ndarray):
        self.rows = np.sort(dists, axis=1)
        B, self.n = self.rows.shape
        self.big = 2.0 ** math.ceil(math.log2(float(self.rows[:, -1].max()) + 4.0))
        self.offs = (np.arange(B, dtype=np.float64) * self.big)[:, None]
        self.flat = (self.rows + self.offs).ravel()
        self.eta = 8 * np.spacing(B * self.big)

    def count_le(self, thresholds: np.ndarray, widen: int) -> np.ndarray:
        """``#{x in row b : x <= thresholds[b, i] + widen * eta}``.

        Adding the offsets rounds, so the threshold is moved by ``eta`` (a few ulps of
        the largest offset) in the direction ``widen`` (+1: count at least the exact
        number, -1: at most), which keeps every count on the conservative side of the
        certificate. It is still a count of the row below a fixed threshold, so one
        replaced record changes it by at most one.
        """
        thr = np.clip(thresholds + widen * self.eta, -1.0, self.big - 2.0)
        idx = np.searchsorted(self.flat, (thr + self.offs).ravel(), side="right").reshape(thresholds.shape)
        return idx - (np.arange(self.rows.shape[0]) * self.n)[:, None]


def gate_shift_bound(sorted_d: SortedRows, m: np.ndarray, w: np.ndarray, r: float,
                     j: np.ndarray | None = None) -> np.ndarray:
    """``G(j, w_j)``: sup of ``||Phi_B(c) - Phi_B(y)||`` over ``||c - y|| <= w_j`` and banks
    within ``j`` replacements of D; ``sorted_d`` are D's sorted distances to ``y``.

    ``w`` has shape ``(B, L)``; column ``i`` belongs to the distance ``j[i]``
    (default ``j = 0..L-1``).
    """
    B, L = w.shape
    j = (np.arange(L) if j is None else np.asarray(j))[None, :].astype(np.float64)
    tol = 1e-9 * max(r, 1.0)
    le_lo = sorted_d.count_le(r - w - tol, -1)
    le_hi = sorted_d.count_le(r + w + tol, +1)
    mm = m[:, None].astype(np.float64)
    n_in = np.maximum(mm - le_lo, 0) + j
    n_out = np.maximum(le_hi - mm, 0) + j
    mh = mm - j
    cap = 2 * r + w
    ok = mh > n_in
    f0 = 2 * r * n_in / np.where(ok, mh - n_in, 1.0)
    f1 = (n_out * (2 * r + w) + 2 * r * n_in) / np.where(ok, mh - n_in + n_out, 1.0)
    G = np.where(ok, np.minimum(cap, np.maximum(f0, f1)), cap)
    return np.where(w > 0, G, 0.0)


class AnnulusBound:
    """``W_{t-1}(j)`` of the annulus bound, a base of
    :class:`~fedmem.agent.brace.certificate.Certifier` (uses its ``p``, ``q``, ``_stats``, ``_ys``)."""

    def _w(self, j: np.ndarray) -> np.ndarray:
        """``W_{t-1}(j)`` for the distances ``j`` (recursion over the stored steps)."""
        r = self.p.r
        B = self.q.shape[0]
        W = np.zeros((B, j.size))
        for s, ((sorted_d, m, a, y_prev), y_s) in enumerate(zip(self._stats, self._ys), start=1):
            G = gate_shift_bound(sorted_d, m, W, r, j)
            i = np.arange(int(j.max()))[None, :]
            csum = np.concatenate([np.zeros((B, 1)), np.cumsum(2 * r / np.maximum(1.0, m[:, None] - i), axis=1)],
                                  axis=1)
            shift = csum[:, j]
            a_hat = np.minimum((r + np.linalg.norm(y_prev - y_s, axis=1))[:, None],
                               np.linalg.norm(a - y_s, axis=1)[:, None] + shift)
            trivial = (s * r + np.linalg.norm(self.q - y_s, axis=1))[:, None]
            W = np.minimum(trivial, G + a_hat)
        return W
