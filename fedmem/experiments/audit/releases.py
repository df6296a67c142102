"""Release primitives shared by the audits: ``n`` releases of a noise mechanism drawn at once
(the same computation as one deployed release, row by row) and the likelihood-ratio score
of a neighbour pair.
"""

from __future__ import annotations

import math

import numpy as np


def lr_scores(values: np.ndarray, a: np.ndarray, b: np.ndarray, noise: str) -> np.ndarray:
    """Log-likelihood-ratio statistic (up to a positive factor) of "centre a" vs "centre b"."""
    if noise == "gaussian":
        v = a - b
        return (values - (a + b) / 2) @ v
    return np.sum(np.abs(values - b) - np.abs(values - a), axis=1)


def batched_release(mech, x: np.ndarray, n: int, rng, sampling: str, grid) -> np.ndarray:
    """``n`` releases of ``mech.release(x, rng, sampling, grid=grid)`` at once, row by row the same
    computation: the value rounded to the public grid, noise from the same exact sampler on the
    same grid at the same inflated scale (fedmem.dp.samplers, module docstring), or the fast
    float sampler added to ``x``."""
    x = np.asarray(x, dtype=np.float64)
    d = x.size
    if sampling != "secure":
        return x[None, :] + mech.noise((n, d), rng, "fast")
    from fedmem.dp import samplers  # lazy: loads dp_accounting (~190 ms)

    gauss = hasattr(mech, "sigma")
    scale = mech.sigma if gauss else mech.scale
    sens = mech.l2_sensitivity if gauss else mech.l1_sensitivity
    g = samplers.grid_granularity(scale) if grid is None else grid
    infl = scale * (sens + g * (math.sqrt(d) if gauss else d)) / sens
    snapped = np.round(x / g) * g
    draw = samplers.secure_gaussian if gauss else samplers.secure_laplace
    return snapped[None, :] + draw(infl, (n, d), rng, grid=g)
