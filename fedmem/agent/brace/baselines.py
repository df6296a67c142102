"""Baselines of papers/001 Sec. 6.2, on the same noise as BRACE (paired comparisons).

* **noiseless DAM**: ``z_T`` (:func:`fedmem.agent.brace.lsr.clean_trajectory`); not private.
* **Naive DAM**: ``Y_t = Phi_D(Y_{t-1}) + xi_t`` with the direct count scale
  ``2r / max(1, m_t)``, ``m_t = |I(D, Y_{t-1})|`` (Sec. 3.2). This scale is *not* a valid
  DP calibration (it is data dependent and not smoothed); it is the boundary-unstable
  reference of Sec. 6.1.
* **global-noise DAM**: the same recursion with the global bound ``2r`` (valid DP).
* **clean endpoint + noise**: ``z_T`` plus one Gaussian perturbation calibrated to the
  bound ``2 T r`` on ``||z_T(D) - z_T(D')||`` (both lie in ``B(q, T r)``), std
  ``2 T r / sqrt(2 rho)`` (valid DP).

The iterative baselines use the noise std ``Delta_t sqrt(T / (2 rho))`` of Sec. 6.2 and
the same output projection ``Pi_{B(q, (t+1) r)}`` as BRACE (post-processing). The
clean-endpoint release is projected onto ``B(q, T r)``, the known support of ``z_T``
(post-processing; it can only help that baseline).
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.agent.brace.lsr import phi, project_ball
from fedmem.agent.brace.params import BraceParams

BASELINES = ("naive", "global", "clean_endpoint")


def iterative_baseline(X: np.ndarray, starts: np.ndarray, params: BraceParams, normals: np.ndarray,
                       scale: str) -> np.ndarray:
    """Naive (``scale="count"``) or global-noise (``scale="global"``) DAM; ``(B, T, d)``."""
    if scale not in ("count", "global"):
        raise ValueError(f"scale must be 'count' or 'global'. Found {scale!r}.")
    q = np.atleast_2d(starts)
    r, T = params.r, params.T
    Y = q.copy()
    out = []
    for t in range(1, T + 1):
        a, m, _ = phi(X, Y, r)
        delta = 2 * r / np.maximum(1, m) if scale == "count" else np.full(q.shape[0], 2 * r)
        Y = project_ball(a + normals[:, t - 1, :] * (delta * params.noise_multiplier)[:, None], q, (t + 1) * r)
        out.append(Y)
    return np.stack(out, axis=1)


def clean_endpoint_noise(z_T: np.ndarray, starts: np.ndarray, params: BraceParams,
                         normal: np.ndarray) -> np.ndarray:
    """``Pi_{B(q, T r)}(z_T + N(0, (2 T r)^2 / (2 rho) I))`` with the given standard normals."""
    sigma = 2 * params.T * params.r / math.sqrt(2 * params.rho)
    return project_ball(z_T + sigma * normal, np.atleast_2d(starts), params.T * params.r)
