"""Certified ``floor(exp(-j) 2**bits)`` and the table of ``floor(exp(-j) 2**64)``, j = 1..64.

The vectorised exact samplers compare a uniform real with ``exp(-j)`` digit by digit in
base 2**64; this module computes those digits exactly (certified interval arithmetic).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

_U64 = np.uint64


@functools.lru_cache(maxsize=64)
def _exp1_bounds(prec: int) -> tuple[int, int]:
    """Integers lo, hi with lo / 2**prec < exp(-1) < hi / 2**prec (certified).

    exp(-1) = sum_k (-1)**k / k! lies strictly between two consecutive partial sums (an
    alternating series with decreasing terms from k = 1 on); they are rounded outward.
    """
    terms = 8
    while math.factorial(terms + 1).bit_length() <= prec + 8:
        terms += 1
    s_n = sum(Fraction((-1) ** k, math.factorial(k)) for k in range(terms + 1))
    s_n1 = s_n + Fraction((-1) ** (terms + 1), math.factorial(terms + 1))
    lo_f, hi_f = min(s_n, s_n1), max(s_n, s_n1)
    lo = (lo_f.numerator << prec) // lo_f.denominator          # floor
    hi = -((-hi_f.numerator << prec) // hi_f.denominator)      # ceil
    return lo, hi


@functools.lru_cache(maxsize=4096)
def exp_neg_floor(j: int, bits: int) -> int:
    """floor(exp(-j) * 2**bits), exactly, for integers j >= 0, bits >= 0.

    exp(-j) * 2**bits lies in [lo**j, hi**j] / 2**(prec*j - bits) (``_exp1_bounds``); when
    both ends floor to the same integer, that is the floor of the value in between;
    otherwise the precision doubles (exp(-j) is irrational for j >= 1, so this ends).
    """
    if j == 0:
        return 1 << bits
    prec = bits + 2 * j.bit_length() + 64
    while True:
        lo, hi = _exp1_bounds(prec)
        shift = prec * j - bits           # >= 64
        a, b = lo ** j >> shift, hi ** j >> shift
        if a == b:
            return a
        prec *= 2


def _exp_table() -> np.ndarray:
    return np.array([exp_neg_floor(j, 64) for j in range(1, 65)], dtype=_U64)


_EXP_TABLE: np.ndarray | None = None   # floor(exp(-j) 2**64) for j = 1..64 (built on first use)


def exp_neg_table() -> np.ndarray:
    global _EXP_TABLE
    if _EXP_TABLE is None:
        _EXP_TABLE = _exp_table()
    return _EXP_TABLE


@functools.lru_cache(maxsize=1)
def exp_neg_table_padded() -> np.ndarray:
    """[0, C_1, ..., C_64, 0]: index j gives C_j, with 0 for j > 64 (exp(-j) 2**64 < 1)."""
    return np.concatenate([[_U64(0)], exp_neg_table(), [_U64(0)]]).astype(_U64)
