"""CKS20 Algorithm 2 proposals in numpy batches: the shared first stage of the vectorised
exact discrete Laplace and Gaussian samplers (see the comment above
:func:`fedmem.dp.samplers.discrete_laplace_ints`)."""

from __future__ import annotations

import numpy as np

from .sources import Words, field_shifts

_VMAX = 44                  # exp(-45) * 2**64 < 1: the table decides V <= 44 unless U's first digit is 0
_U64 = np.uint64


def _huge_lane(u: int, v: int, t: int, s: int) -> int:  # noqa: D401
    """|y| of a proposal whose V exceeded the table (probability < 2**-64 per proposal)."""
    y = (u + t * v) // s
    if y >= 1 << 62:   # needs V > 2**38: probability below exp(-2**38); fail closed
        raise OverflowError("a discrete noise sample does not fit in int64 (the sample is secret: not reported)")
    return y


def _signs(src: Words, k: int) -> np.ndarray:
    """``k`` fair coin flips (bool), 64 per word."""
    w = src.words((k + 63) // 64)
    return (((w[:, None] >> field_shifts(1)) & _U64(1)).ravel()[:k]).astype(bool)


def dlap_proposals(t: int, s: int, m: int, src: Words):
    """CKS20 Algorithm 2 (scale t/s) on ``m`` proposals; returns the accepted draws ``y``
    (int64, about 0.63 m of them) and the indices of those that were finished on Python
    ints (V beyond the table: probability below 2**-64 per proposal), or None."""
    u = src.below(t, m)
    u = u[src.bern_exp_frac(u, t)]              # D ~ Bernoulli(exp(-U/t))
    k = u.size
    v = src.geometric_e(src.words(k))
    neg = _signs(src, k)
    big = np.flatnonzero(v > _VMAX)
    y = (u + t * np.minimum(v, _VMAX)) // s
    for i in big:                                # exact Python ints for the (never seen) huge lanes
        y[i] = _huge_lane(int(u[i]), int(v[i]), t, s)
    keep = ~(neg & (y == 0))                     # reject (negative, 0)
    y = np.where(neg, -y, y)
    if big.size:
        flag = np.zeros(k, dtype=bool)
        flag[big] = True
        return y[keep], np.flatnonzero(flag[keep])
    return y[keep], None
