"""Eq. (7) envelope helpers of BRACE's certificate (papers/001 Step 5): the horizon ``K``,
the count branch's closed-form envelope and the ``max_k e^{-gamma k} A^(k)`` envelope
(see :mod:`fedmem.agent.brace.certificate` for the derivation)."""

from __future__ import annotations

import math

import numpy as np

from fedmem.agent.brace.params import BraceParams


def activation_impossible(params: BraceParams) -> bool:
    """True when ``(2T + 1) r <= tau``: no bank can activate the correction at any step."""
    return (2 * params.T + 1) * params.r <= params.threshold


def horizon(n: int, gamma: float) -> int:
    """Largest distance ``K`` whose envelope term can exceed the floor ``2r/n``."""
    return int(min(n, math.ceil(math.log(max(n, 1)) / gamma)))


def count_envelope(m: np.ndarray, r: float, gamma: float) -> np.ndarray:
    """``max_{k>=0} e^{-gamma k} 2r / max(1, m - k)`` in closed form (count branch only)."""
    m = np.asarray(m, dtype=np.float64)
    ms = np.maximum(m, 1.0)
    return np.where(m >= 1, 2 * r * np.maximum(1.0 / ms, np.exp(-gamma * (ms - 1))), 2 * r)


def smooth_envelope(A: np.ndarray, gamma: float) -> np.ndarray:
    """``max_k e^{-gamma k} A[..., k]`` (Eq. (7) with the inner suprema ``A``)."""
    k = np.arange(A.shape[-1])
    return np.max(A * np.exp(-gamma * k), axis=-1)
