"""LSR dense associative memory: gates, the update Phi_B and projections (papers/001 Sec. 3.1).

All functions are batched: ``centers`` has shape ``(B, d)`` and the bank ``X`` shape
``(n, d)``. The gate of a center ``z`` is ``I(B, z) = {i : ||X_i - z|| <= r}`` and::

    Phi_B(z) = mean of the gate        if the gate is non-empty,
             = z                       otherwise.

Squared distances are computed as ``sum((X_i - z)^2)`` (``scipy.spatial.distance.cdist``)
for ``d <= 16`` and by the Gram expansion for larger ``d``; the same routine is used by the
mechanism, the certificate and the brute-force checks, so they agree on every gate.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist


def sq_dists(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """``(B, n)`` squared Euclidean distances between ``centers`` and the bank rows."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(centers, dtype=np.float64)
    if X.shape[1] <= 16:
        return cdist(C, X, "sqeuclidean")
    out = (C * C).sum(1)[:, None] + (X * X).sum(1)[None, :] - 2.0 * C @ X.T
    return np.maximum(out, 0.0)


def phi(X: np.ndarray, centers: np.ndarray, r: float, sq: np.ndarray | None = None):
    """One LSR update ``Phi_B(centers)``. Returns ``(new_centers, gate_counts, sq)``."""
    if sq is None:
        sq = sq_dists(X, centers)
    mask = sq <= r * r
    counts = mask.sum(1)
    sums = mask.astype(np.float64) @ X
    new = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centers)
    return new, counts, sq


def clean_trajectory(X: np.ndarray, q: np.ndarray, r: float, T: int) -> np.ndarray:
    """Noiseless DAM ``z_0 = q, z_t = Phi_D(z_{t-1})``; shape ``(T + 1, B, d)``."""
    z = np.atleast_2d(np.asarray(q, dtype=np.float64))
    out = [z]
    for _ in range(T):
        z, _, _ = phi(X, z, r)
        out.append(z)
    return np.stack(out)


def project_ball(x: np.ndarray, center: np.ndarray, radius) -> np.ndarray:
    """Euclidean projection of each row of ``x`` onto the closed ball ``B(center, radius)``.

    Rows already inside are returned bit for bit (not as ``center + (x - center)``, which
    can round), so a secure release that needs no projection stays an exact grid point.
    """
    diff = x - center
    norm = np.linalg.norm(diff, axis=-1, keepdims=True)
    radius = np.asarray(radius, dtype=np.float64)
    if radius.ndim == 1:
        radius = radius[:, None]
    outside = norm > radius
    scale = np.where(outside, radius / np.where(norm > 0, norm, 1.0), 1.0)
    return np.where(outside, center + diff * scale, x)
