"""The exact CKS20 samplers one draw at a time on Python integers (Algorithms 1-3).

The reference the vectorised samplers are tested against (``engine="python"``), and the
continuation they fall back on for scales too fine for int64.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .sources import Bits


def bernoulli_exp(gamma: Fraction, bits: Bits) -> bool:
    """Exact Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS20 Algorithm 1)."""
    return bernoulli_exp_ratio(gamma.numerator, gamma.denominator, bits)


def bernoulli_exp_ratio(num: int, den: int, bits: Bits) -> bool:
    """Bernoulli(exp(-num/den)) on integers: exp(-g) = exp(-1)^floor(g) * exp(-(g - floor(g)))."""
    while num > den:
        if not _bernoulli_exp_small(1, 1, bits):
            return False
        num -= den
    return _bernoulli_exp_small(num, den, bits)


def _bernoulli_exp_small(num: int, den: int, bits: Bits) -> bool:
    """Bernoulli(exp(-g)) for g = num/den in [0, 1]: K = first k with A_k ~ Bern(g/k) = 0; return K odd."""
    k = 1
    while bits.below(den * k) < num:  # Bernoulli(num / (den * k)), exactly
        k += 1
    return k % 2 == 1


def discrete_laplace(s: int, t: int, bits: Bits) -> int:
    """Pr[Y=y] proportional to exp(-|y| * s / t) on the integers (CKS20 Algorithm 2)."""
    while True:
        u = bits.below(t)
        if not bernoulli_exp_ratio(u, t, bits):
            continue
        v = 0
        while _bernoulli_exp_small(1, 1, bits):
            v += 1
        x = u + t * v
        y = x // s
        negative = bits.below(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(sigma2: Fraction, bits: Bits) -> int:
    """Pr[Y=y] proportional to exp(-y^2 / (2 sigma2)) on the integers (CKS20 Algorithm 3).

    With sigma2 = a/b, the rejection step accepts with probability exp(-gamma),
    gamma = (|y| - sigma2/t)^2 / (2 sigma2) = (|y| b t - a)^2 / (2 a b t^2), kept as integers.
    """
    a, b = sigma2.numerator, sigma2.denominator
    t = math.isqrt(a // b) + 1  # floor(sigma) + 1 (any t >= 1 is exact; this one is efficient)
    den = 2 * a * b * t * t
    while True:
        y = discrete_laplace(1, t, bits)
        if bernoulli_exp_ratio((abs(y) * b * t - a) ** 2, den, bits):
            return y
