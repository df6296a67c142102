"""Brute-force audit of BRACE's certificate: the query ``Q_t(B; y_<t)`` for stacks of tiny
banks and the local sensitivity of ``Q_t`` over single-record replacements on a grid
(a lower bound that the certificate tests compare ``Delta_bar`` and ``A^(0)`` with)."""

from __future__ import annotations

import numpy as np

from fedmem.agent.brace.params import BraceParams


def _phi_banks(X: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
    """``Phi_{X[b]}(c[b])`` for a stack of banks ``(M, n, d)`` and centres ``(M, d)``."""
    diff = X - c[:, None, :]
    mask = np.sum(diff * diff, axis=2) <= r * r
    cnt = mask.sum(1)
    s = np.einsum("mn,mnd->md", mask.astype(np.float64), X)
    return np.where(cnt[:, None] > 0, s / np.maximum(cnt, 1)[:, None], c)


def query_point(X: np.ndarray, q: np.ndarray, ys: np.ndarray, params: BraceParams) -> np.ndarray:
    """``Q_t(B; y_<t)`` (Steps 1-4) for a stack of banks ``X`` of shape ``(M, n, d)``.

    ``ys`` is the released history ``(y_0 = q, ..., y_{t-1})`` of shape ``(t, d)``. Used by
    the brute-force local-sensitivity audit (tiny banks).
    """
    r = params.r
    M, _, d = X.shape
    t = ys.shape[0]
    z = np.repeat(np.asarray(q, dtype=np.float64)[None, :], M, axis=0)
    for _ in range(t):
        z = _phi_banks(X, z, r)
    y = np.repeat(ys[-1][None, :], M, axis=0)
    a = _phi_banks(X, y, r)
    R = z - a
    H = (np.sum(R * R, axis=1) > params.threshold ** 2)[:, None]
    target = a + H * R
    diff = target - y
    norm = np.linalg.norm(diff, axis=1, keepdims=True)
    return y + diff * np.where(norm > r, r / np.where(norm > 0, norm, 1.0), 1.0)


def brute_force_local_sensitivity(X: np.ndarray, q: np.ndarray, ys: np.ndarray, params: BraceParams,
                                  grid: np.ndarray) -> float:
    """``max_{j, x in grid} ||Q_t(X) - Q_t(X^{j <- x})||``: a lower bound on the local
    sensitivity of ``Q_t`` (exact as the grid refines, by the localisation of App. B.3)."""
    n = X.shape[0]
    base = query_point(X[None], q, ys, params)[0]
    banks = np.repeat(X[None], n * len(grid), axis=0)
    for j in range(n):
        banks[j * len(grid):(j + 1) * len(grid), j] = grid
    qs = query_point(banks, q, ys, params)
    return float(np.max(np.linalg.norm(qs - base, axis=1)))
