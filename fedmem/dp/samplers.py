"""Noise samplers. Every sampler takes an injected RNG; none touches a global RNG.

``secure`` (the default everywhere fedmem releases a float): exact discrete samplers
after Canonne, Kamath and Steinke (NeurIPS 2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1-3), vectorised in numpy batches with exact int64 arithmetic (see
"Vectorised and exact" below). A secure release works on a grid of granularity
``g = 2**k`` (by default ``k`` chosen so that ``g`` is about ``scale * 2**-20``; see "The
grid must be public" below for when the caller must pass ``grid=`` instead): the value is
rounded to the grid, integer noise in units of ``g`` (the *same* grid, whatever the
inflated noise scale) is added, and the result is ``integer * g``, which is an exactly
representable float, so every output is reachable from every input and the low bits
carry no information. Rounding to the grid can move a value by up to ``g/2`` per
coordinate, so the secure release inflates the noise scale by ``(sensitivity +
g*sqrt(d)) / sensitivity`` (L2) or ``(sensitivity + g*d) / sensitivity`` (L1); the
booked record's guarantee therefore still holds. The discrete Gaussian with variance
parameter sigma^2 satisfies the same rho = Delta^2 / (2 sigma^2) zCDP as the continuous
one (CKS20 Thm. 4), which is what the RDP accountant uses.

``fast``: numpy / torch floating-point samplers, only as an explicit setting. A textbook
floating-point Laplace or Gaussian sampler leaks through the low-order bits of its
output (Mironov, CCS 2012): some floats are reachable from one input and not from its
neighbour, so an observer can distinguish them with certainty (numpy's Laplace is an
inverse CDF on a 2**-53 grid, its normal a ziggurat on per-layer grids). A run with
``fast`` is not DP as released: :func:`is_private` says so and reports label it
"not DP (float sampler)".

**The grid must be public.** Which grid an output lies on is visible in its low bits
(``y / g`` is an integer; on the grid ``2g`` only half the time). So the grid may be
derived from the noise scale only when that scale is public (a fixed-sensitivity
release whose ``sigma`` is fixed before any data is seen: the default, ``grid=None``).
When the scale depends on private data (BRACE's ``sigma_t = Delta_bar_t * sqrt(T/(2 rho))``
comes from a smooth-sensitivity certificate of the bank), a scale of 0.9999 on one bank
and 1.0001 on its neighbour would put every output on the grid ``2**-21`` versus
``2**-20``: a distinguisher with delta about 1/2. Such callers pass ``grid=`` explicitly,
a power of two computed from public parameters only (BRACE: from its public lower bound
``sqrt(T/(2 rho)) * 2r/n`` on ``sigma_t``, see :meth:`BraceParams.secure_grid`). The
rounding inflation below works for any grid (it is in units of the grid actually used);
a grid much finer than the scale only costs speed, a grid much coarser only costs noise.

**Vectorised and exact.** The noise scale in grid units (after the inflation) is
represented as ``t / s``, ``s`` a power of two and ``t >= 2**20``, rounded UP (at most a
factor ``1 + 2**-20`` more noise than booked, never less). Discrete Laplace: CKS20
Algorithm 2 at scale ``t/s``. Discrete Gaussian: CKS20 Algorithm 3 with a Laplace
proposal of scale ``sigma = t/s`` itself (the algorithm is exact for any proposal scale),
so the acceptance exponent is the integer ratio ``(|y| s - t)**2 / (2 t**2)``, below
2**60 / 2**49 whenever ``t < 2**24``. Uniform integers come from raw 64-bit words
(rejection on bit fields: exactly uniform); Bernoulli(exp(-gamma)) is Algorithm 1, or, for
an integer gamma and for the geometric count, one comparison of a uniform real with
``exp(-j)`` digit by digit (a certified table of ``floor(exp(-j) 2**64)``; ties, with
probability 2**-64, read further digits). Every batch is drawn from the injected
generator (a ``torch.Generator`` seeds a numpy PCG64 from 128 of its bits). Whatever
would not fit in int64 (the Gaussian acceptance on a very fine explicit grid, ``t > 2**24``;
events of probability below 2**-64) continues on exact Python integers, so the output
law is exactly the discrete Laplace / Gaussian, never an approximation; the tests
compare it with the CKS pmf and with the original one-draw-at-a-time Python sampler
(``engine="python"``, kept as the reference). Repeated releases at one scale from one
generator take their noise from a per-generator pool drawn ahead (:class:`_NoisePool`:
each draw used once, in order; a generator's replayed ``bit_generator.state`` therefore
does not replay pooled noise). ``scripts/bench_dp.py`` measures the speed
of ``fast``, the Python reference and the vectorised sampler side by side.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import threading
from fractions import Fraction

import numpy as np

from fedmem import _validate as V

_GRID_BITS = 20


SAMPLING_MODES = ("fast", "secure")


def is_private(sampling) -> bool:
    """Whether a release drawn with ``sampling`` is DP as released (its floats leak nothing).

    ``"secure"`` -> True; ``"fast"`` -> False (float samplers leak through their low-order
    bits: reports label such runs "not DP (float sampler)"). Anything else raises.
    """
    if sampling == "secure":
        return True
    if sampling == "fast":
        return False
    raise ValueError(f"sampling must be one of {SAMPLING_MODES}. Found {sampling!r}.")


# ----------------------------------------------------------------------------- fast
def gaussian(sigma: float, shape, rng) -> np.ndarray:
    V.positive("sigma", sigma)
    if isinstance(rng, np.random.Generator):
        return rng.normal(0.0, sigma, size=shape)
    import torch

    return torch.normal(0.0, float(sigma), size=tuple(np.atleast_1d(shape)) if shape != () else (),
                        generator=rng, dtype=torch.float64).numpy()


def laplace(scale: float, shape, rng) -> np.ndarray:
    V.positive("scale", scale)
    if isinstance(rng, np.random.Generator):
        return rng.laplace(0.0, scale, size=shape)
    import torch

    size = tuple(np.atleast_1d(shape)) if shape != () else ()
    # |Lap| ~ Exp(1) = -log(1 - r) for r in [0, 1) (always finite), times a random sign.
    # (The one-uniform form -sign(u) log(1 - 2|u|) with u = r - 1/2 gives -inf at r = 0.)
    r = torch.rand((2, *size), generator=rng, dtype=torch.float64).numpy()
    return scale * np.where(r[1] < 0.5, -1.0, 1.0) * -np.log1p(-r[0])


# --------------------------------------------------------------------------- secure
class _Bits:
    """Exact uniform integers from an injected RNG, by rejection on whole bytes.

    Random bytes are fetched from the generator in blocks of ``_BLOCK`` and consumed in
    order (one call per block instead of one per draw: ~2x faster end to end). Every
    byte is uniform and independent, so the integers drawn are exactly uniform.
    """

    _BLOCK = 4096

    def __init__(self, rng):
        V.rng_check("rng", rng)
        self._rng = rng
        self._buf = b""
        self._pos = 0

    def _refill(self) -> None:
        if isinstance(self._rng, np.random.Generator):
            self._buf = self._rng.bytes(self._BLOCK)
        else:
            import torch

            self._buf = bytes(torch.randint(0, 256, (self._BLOCK,), generator=self._rng,
                                            dtype=torch.uint8).tolist())
        self._pos = 0

    def _raw(self, nbytes: int) -> int:
        if self._pos + nbytes > len(self._buf):
            rest = self._buf[self._pos:]
            self._refill()
            while len(rest) + len(self._buf) < nbytes:  # draws wider than one block
                rest += self._buf
                self._refill()
            take = nbytes - len(rest)
            chunk, self._pos = rest + self._buf[:take], take
        else:
            chunk = self._buf[self._pos:self._pos + nbytes]
            self._pos += nbytes
        return int.from_bytes(chunk, "little")

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        if n <= 1:
            return 0
        nbits = (n - 1).bit_length()
        nbytes = (nbits + 7) // 8
        mask = (1 << nbits) - 1
        while True:
            r = self._raw(nbytes) & mask
            if r < n:
                return r

    def bernoulli(self, p: Fraction) -> bool:
        return self.below(p.denominator) < p.numerator


def _bernoulli_exp(gamma: Fraction, bits: _Bits) -> bool:
    """Exact Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS20 Algorithm 1)."""
    return _bernoulli_exp_ratio(gamma.numerator, gamma.denominator, bits)


def _bernoulli_exp_ratio(num: int, den: int, bits: _Bits) -> bool:
    """Bernoulli(exp(-num/den)) on integers: exp(-g) = exp(-1)^floor(g) * exp(-(g - floor(g)))."""
    while num > den:
        if not _bernoulli_exp_small(1, 1, bits):
            return False
        num -= den
    return _bernoulli_exp_small(num, den, bits)


def _bernoulli_exp_small(num: int, den: int, bits: _Bits) -> bool:
    """Bernoulli(exp(-g)) for g = num/den in [0, 1]: K = first k with A_k ~ Bern(g/k) = 0; return K odd."""
    k = 1
    while bits.below(den * k) < num:  # Bernoulli(num / (den * k)), exactly
        k += 1
    return k % 2 == 1


def _discrete_laplace(s: int, t: int, bits: _Bits) -> int:
    """Pr[Y=y] proportional to exp(-|y| * s / t) on the integers (CKS20 Algorithm 2)."""
    while True:
        u = bits.below(t)
        if not _bernoulli_exp_ratio(u, t, bits):
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


def _discrete_gaussian(sigma2: Fraction, bits: _Bits) -> int:
    """Pr[Y=y] proportional to exp(-y^2 / (2 sigma2)) on the integers (CKS20 Algorithm 3).

    With sigma2 = a/b, the rejection step accepts with probability exp(-gamma),
    gamma = (|y| - sigma2/t)^2 / (2 sigma2) = (|y| b t - a)^2 / (2 a b t^2), kept as integers.
    """
    a, b = sigma2.numerator, sigma2.denominator
    t = math.isqrt(a // b) + 1  # floor(sigma) + 1 (any t >= 1 is exact; this one is efficient)
    den = 2 * a * b * t * t
    while True:
        y = _discrete_laplace(1, t, bits)
        if _bernoulli_exp_ratio((abs(y) * b * t - a) ** 2, den, bits):
            return y


# ------------------------------------------------------------- secure, vectorised
# Exact discrete Laplace / Gaussian in numpy batches (int64 arithmetic only).
#
# The scale in grid units is represented as t / s with s a power of two and
# t in [2**_PBITS, 2**(_PBITS + 2)), rounded UP (never less noise than booked). The
# discrete Laplace follows CKS20 Algorithm 2 with scale t/s; the discrete Gaussian follows
# CKS20 Algorithm 3 with the Laplace proposal of scale sigma itself (the algorithm is exact
# for any proposal scale > 0; with proposal scale sigma = t/s the acceptance exponent is
# the integer ratio (|y| s - t)**2 / (2 t**2)). Every Bernoulli is exact:
#   * Bernoulli(exp(-r/D)) for 0 <= r <= D: CKS20 Algorithm 1, A_k ~ Bernoulli(r/(D k)),
#     drawn column by column for the lanes still running (Python ints if D k nears 2**62);
#   * Bernoulli(exp(-j)) for integer j and the geometric count V (P[V >= v] = exp(-v)):
#     one uniform real U, compared with exp(-j) digit by digit in base 2**64 (the first
#     digit against a table of floor(exp(-j) 2**64), computed with certified interval
#     arithmetic; the rare ties, probability 2**-64 per draw, read further digits).
# Uniform integers below a constant n: b-bit fields of raw 64-bit words, rejected when
# >= n (every accepted value is exactly uniform, and they are assigned to lanes in order).
# Each stage only runs on the lanes still alive (accepted proposals, lanes with an
# exponent >= 1), so the work per output draw is a few dozen integer operations.

_PBITS = 20                 # relative rounding of the scale in grid units: at most 2**-20, upward
_GAUSS_VEC_MAX_T = 1 << 24  # t beyond this (a very fine explicit grid): acceptance on Python ints
_LAP_VEC_MAX_T = 1 << 50
_VMAX = 44                  # exp(-45) * 2**64 < 1: the table decides V <= 44 unless U's first digit is 0
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
def _exp_neg_floor(j: int, bits: int) -> int:
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
    return np.array([_exp_neg_floor(j, 64) for j in range(1, 65)], dtype=_U64)


_EXP_TABLE: np.ndarray | None = None   # floor(exp(-j) 2**64) for j = 1..64 (built on first use)


def _table() -> np.ndarray:
    global _EXP_TABLE
    if _EXP_TABLE is None:
        _EXP_TABLE = _exp_table()
    return _EXP_TABLE


@functools.lru_cache(maxsize=64)
def _field_shifts(b: int) -> np.ndarray:
    """Shifts 0, b, 2b, ... cutting a 64-bit word into 64 // b fields of b bits."""
    return (np.arange(64 // b, dtype=np.uint64) * _U64(b)).astype(_U64)


@functools.lru_cache(maxsize=1)
def _table_padded() -> np.ndarray:
    """[0, C_1, ..., C_64, 0]: index j gives C_j, with 0 for j > 64 (exp(-j) 2**64 < 1)."""
    return np.concatenate([[_U64(0)], _table(), [_U64(0)]]).astype(_U64)


class _LazyUniform:
    """A uniform real in [0, 1) whose base-2**64 digits are drawn on demand (the first given)."""

    def __init__(self, first: int, bits: "_Bits"):
        self._digits = [int(first)]
        self._bits = bits

    def below_exp_neg(self, j: int) -> bool:
        """Exactly: is U < exp(-j)?"""
        if j == 0:
            return True
        i = 0
        while True:
            if i == len(self._digits):
                self._digits.append(self._bits._raw(8))
            target = _exp_neg_floor(j, 64 * (i + 1)) & ((1 << 64) - 1)
            if self._digits[i] != target:
                return self._digits[i] < target
            i += 1


class _Words:
    """Uniform 64-bit words (and integers built from them) from an injected generator.

    numpy generators with a 64-bit bit generator (PCG64, PCG64DXSM, SFC64, Philox: the raw
    outputs are uniform 64-bit words) are read through ``random_raw``; any other numpy bit
    generator through ``Generator.bytes``. A ``torch.Generator`` seeds a numpy PCG64 with
    128 bits drawn from it (deterministic given the torch generator's state).
    """

    def __init__(self, rng):
        V.rng_check("rng", rng)
        if not isinstance(rng, np.random.Generator):
            import torch

            seed = [int(v) for v in torch.randint(0, 2 ** 32, (4,), generator=rng, dtype=torch.int64)]
            rng = np.random.Generator(np.random.PCG64(seed))
        self.rng = rng
        bg = rng.bit_generator
        if isinstance(bg, (np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox)):
            self.words = bg.random_raw
        else:
            self.words = lambda n: np.frombuffer(rng.bytes(8 * n), dtype="<u8").copy()
        self._bits: _Bits | None = None

    @property
    def bits(self) -> "_Bits":
        """Byte-wise source for the exact Python-int continuations (same generator)."""
        if self._bits is None:
            self._bits = _Bits(self.rng)
        return self._bits

    def below(self, n: int, size: int) -> np.ndarray:
        """``size`` exactly uniform integers in [0, n), as int64 (n <= 2**63).

        Each 64-bit word is cut into ``64 // b`` independent b-bit fields, b the bit length
        of n - 1; a field >= n is rejected (the accepted ones are exactly uniform, and
        they are used in order).
        """
        if n <= 1:
            return np.zeros(size, dtype=np.int64)
        b = (n - 1).bit_length()
        fields = 64 // b
        parts, got = [], 0
        while got < size:
            c = int((size - got) * (1 << b) / n * 1.1 / fields) + 4
            w = self.words(c)
            if fields == 1:
                v = w >> _U64(64 - b)
            else:
                v = ((w[:, None] >> _field_shifts(b)) & _U64((1 << b) - 1)).ravel()
            v = v[v < _U64(n)]
            parts.append(v)
            got += v.size
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out[:size].astype(np.int64)

    def bern_exp_frac(self, r: np.ndarray, den: int) -> np.ndarray:
        """Exact Bernoulli(exp(-r/den)) per lane, for int64 ``0 <= r <= den`` (CKS20 Alg. 1).

        K = first k >= 1 with A_k = 0, A_k ~ Bernoulli(r / (den k)); return K odd. Only the
        lanes still running draw the next A_k (on average e**(r/den) <= e draws per lane).
        """
        m = r.size
        out = np.zeros(m, dtype=bool)
        if m == 0:
            return out
        rest = np.arange(m)
        k = 1
        while rest.size:
            if den * k >= 1 << 62:                      # (never in practice) exact Python ints
                for i in rest:
                    kk, ri = k, int(r[i])
                    while self.bits.below(den * kk) < ri:
                        kk += 1
                    out[i] = kk % 2 == 1
                break
            go_on = self.below(den * k, rest.size) < r[rest]   # A_k ~ Bernoulli(r / (den k))
            if k % 2 == 1:
                out[rest[~go_on]] = True                # K = k odd (out is False otherwise)
            rest = rest[go_on]
            k += 1
        return out

    def bern_exp_int(self, j: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """Exact Bernoulli(exp(-j)) per lane, for int64 ``j >= 0`` (``w``: fresh words, if drawn)."""
        if w is None:
            w = self.words(j.size)
        c = _table_padded()[np.minimum(j, 65)]        # C_j; 0 for j = 0 (handled) and j > 64
        out = (w < c) | (j == 0)
        for i in np.flatnonzero((w == c) & (j != 0)):  # tie on the first digit: read on
            out[i] = _LazyUniform(int(w[i]), self.bits).below_exp_neg(int(j[i]))
        return out

    def geometric_e(self, w: np.ndarray) -> np.ndarray:
        """Exact draws of V with P[V >= v] = exp(-v), one per fresh word of ``w``:
        V = #{v >= 1: U < exp(-v)} for the uniform real U whose first base-2**64 digit is w."""
        asc = _table()[::-1]                            # ascending (non-decreasing)
        pos = np.searchsorted(asc, w, side="right")     # #{v <= 64: C_v <= w}
        v = (asc.size - pos).astype(np.int64)          # #{v <= 64: w < C_v}
        # a tie: w equals some C_v (pos >= 1 always, as C_64 = 0 <= w), e.g. w == 0.
        tie = np.flatnonzero(asc[pos - 1] == w)
        for i in tie:
            lu = _LazyUniform(int(w[i]), self.bits)
            vi = 0
            while lu.below_exp_neg(vi + 1):
                vi += 1
            v[i] = vi
        return v


@functools.lru_cache(maxsize=1024)
def _scale_ratio(units: Fraction) -> tuple[int, int]:
    """(t, s): s a power of two, t/s >= units, t >= 2**_PBITS (relative rounding <= 2**-_PBITS)."""
    if units <= 0:
        raise ValueError(f"scale in grid units must be positive. Found {units!r}.")
    e = max(0, _PBITS + 1 - (units.numerator.bit_length() - units.denominator.bit_length()))
    s = 1 << e
    t = -((-units.numerator * s) // units.denominator)  # ceil(units * s)
    return t, s


def _huge_lane(u: int, v: int, t: int, s: int) -> int:  # noqa: D401
    """|y| of a proposal whose V exceeded the table (probability < 2**-64 per proposal)."""
    y = (u + t * v) // s
    if y >= 1 << 62:   # needs V > 2**38: probability below exp(-2**38); fail closed
        raise OverflowError(f"discrete sample {y} does not fit in int64")
    return y


def _signs(src: _Words, k: int) -> np.ndarray:
    """``k`` fair coin flips (bool), 64 per word."""
    w = src.words((k + 63) // 64)
    return (((w[:, None] >> _field_shifts(1)) & _U64(1)).ravel()[:k]).astype(bool)


def _dlap_proposals(t: int, s: int, m: int, src: _Words):
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


def discrete_laplace_ints(t: int, s: int, n: int, src: _Words) -> np.ndarray:
    """``n`` exact draws with Pr[y] proportional to exp(-|y| s / t) (int64; object if t is huge)."""
    if not (1 <= t and 1 <= s):
        raise ValueError(f"t and s must be positive integers. Found t={t!r}, s={s!r}.")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if t > _LAP_VEC_MAX_T:
        bits = src.bits
        return np.array([_discrete_laplace(s, t, bits) for _ in range(n)], dtype=object)
    out, got = [], 0
    while got < n:
        y, _ = _dlap_proposals(t, s, int((n - got) * 1.7) + 16, src)
        out.append(y)
        got += y.size
    return np.concatenate(out)[:n]


def discrete_gaussian_ints(t: int, s: int, n: int, src: _Words) -> np.ndarray:
    """``n`` exact draws with Pr[y] proportional to exp(-y**2 s**2 / (2 t**2)) (sigma = t/s)."""
    if not (1 <= t and 1 <= s):
        raise ValueError(f"t and s must be positive integers. Found t={t!r}, s={s!r}.")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if t > _LAP_VEC_MAX_T:
        bits = src.bits
        sigma2 = Fraction(t, s) ** 2
        return np.array([_discrete_gaussian(sigma2, bits) for _ in range(n)], dtype=np.int64)
    den = 2 * t * t                      # < 2**49 when t <= _GAUSS_VEC_MAX_T
    out, got = [], 0
    while got < n:
        y, big = _dlap_proposals(t, s, int((n - got) * 2.3) + 16, src)
        if t > _GAUSS_VEC_MAX_T:         # a very fine explicit grid: the acceptance on Python ints
            bits = src.bits
            acc = np.array([_bernoulli_exp_ratio((abs(int(yi)) * s - t) ** 2, den, bits) for yi in y],
                           dtype=bool)
            got_y = y[acc]
            out.append(got_y)
            got += got_y.size
            continue
        ya = np.abs(y)
        if big is not None:
            ya[big] = 0                  # placeholders, decided on Python ints below
        a = ya * s - t                   # |a| <= t * (_VMAX + 1) < 2**30: a*a < 2**60
        num = a * a
        j, r = num // den, num % den
        acc = np.ones(y.size, dtype=bool)
        hi = np.flatnonzero(j > 0)                               # ~9% of lanes
        acc[hi] = src.bern_exp_int(j[hi])
        idx = np.flatnonzero(acc)
        acc[idx] = src.bern_exp_frac(r[idx], den)
        for i in (big if big is not None else ()):   # exact Python ints for the huge lanes
            yi = abs(int(y[i]))
            acc[i] = _bernoulli_exp_ratio((yi * s - t) ** 2, den, src.bits)
        got_y = y[acc]
        out.append(got_y)
        got += got_y.size
    return np.concatenate(out)[:n]


def grid_granularity(scale: float) -> float:
    """The power of two about ``scale * 2**-20``: the default secure grid for a PUBLIC scale.

    Only use it on a scale that does not depend on private data (or on a public bound on
    such a scale); the grid is visible in the outputs' low bits (module docstring).
    """
    V.positive("scale", scale)
    return math.ldexp(1.0, math.floor(math.log2(scale)) - _GRID_BITS)


def check_grid(grid) -> float:
    """Validate an explicit (public) grid: a positive finite power of two.

    A power of two keeps ``integer * grid`` and ``snapped + noise`` exact in binary
    floating point (any other step would round, and the rounding would depend on the
    value: a low-bit leak of its own).
    """
    g = V.positive("grid", grid)
    mant, _ = math.frexp(g)
    if mant != 0.5:
        raise ValueError(f"grid must be a power of two (exact in binary floating point). Found {grid!r}.")
    return g


def _resolve_grid(scale: float, grid) -> float:
    return grid_granularity(scale) if grid is None else check_grid(grid)


def _to_fraction(x: float) -> Fraction:
    """The exact rational value of a binary float (never rounded, so never below it)."""
    return Fraction(x)


def _discrete_ints(kind: str, units: Fraction, n: int, rng, *, engine: str = "numpy") -> np.ndarray:
    """``n`` exact discrete Gaussian (sigma = ``units``) or Laplace (scale = ``units``) integers.

    ``engine="numpy"`` (the default): the vectorised exact samplers, at the scale
    ``t/s >= units`` (rounded up by at most a factor ``1 + 2**-20``: a hair more noise than
    booked, never less). ``engine="python"``: the original one-draw-at-a-time CKS20 code on
    the exact rational ``units`` (the reference the tests compare against; ~30x slower).
    """
    if kind not in ("gaussian", "laplace"):
        raise ValueError(f"kind must be 'gaussian' or 'laplace'. Found {kind!r}.")
    if engine == "python":
        bits = _Bits(rng)
        if kind == "gaussian":
            sigma2 = units ** 2
            ints = [_discrete_gaussian(sigma2, bits) for _ in range(n)]
        else:
            ints = [_discrete_laplace(units.denominator, units.numerator, bits) for _ in range(n)]
        return np.array(ints, dtype=np.float64)
    if engine != "numpy":
        raise ValueError(f"engine must be 'numpy' or 'python'. Found {engine!r}.")
    return _pooled_ints(kind, *_scale_ratio(units), n, rng)


def _pooled_ints(kind: str, t: int, s: int, n: int, rng) -> np.ndarray:
    """``n`` exact draws at scale ``t/s`` (grid units) from ``rng``'s pool, as float64."""
    draw = discrete_gaussian_ints if kind == "gaussian" else discrete_laplace_ints
    return _POOL.take(rng, (kind, t, s), n, lambda m: draw(t, s, m, _Words(rng))).astype(np.float64)


class _NoisePool:
    """Exact noise drawn ahead, per generator and scale, for repeated releases.

    A vectorised batch costs about the same for 128 draws as for 2048 (numpy call
    overhead), so a generator that asks again for noise at the same scale ``(kind, t, s)``
    gets a batch drawn ahead: the k-th refill at one scale draws ``n * 2**(k-1)`` (at most
    ``max_draws``), so a one-off scale (BRACE's data-dependent ``sigma_t``) draws exactly
    what it uses and a fixed-scale engine amortises the overhead. Each pooled draw is used
    once, in order; all are i.i.d. from the exact law and independent of any data, so
    drawing them earlier changes nothing in the released distribution. Entries hold their
    generator (so its ``id`` is never reused while pooled); the pool is cleared in a forked
    child; ``max_draws = 0`` disables it.
    """

    def __init__(self, max_draws: int = 4096, max_generators: int = 64, max_scales: int = 16):
        self.max_draws, self.max_generators, self.max_scales = max_draws, max_generators, max_scales
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def take(self, rng, key, n: int, draw) -> np.ndarray:
        if self.max_draws <= 0:
            return draw(n)
        with self._lock:
            ent = self._entries.get(id(rng))
            if ent is None or ent[0] is not rng:
                ent = (rng, collections.OrderedDict())
                self._entries[id(rng)] = ent
                while len(self._entries) > self.max_generators:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(id(rng))
            scales = ent[1]
            buf = scales.get(key)
            if buf is None:
                buf = scales[key] = [np.empty(0, dtype=np.int64), 0, 0]   # draws, next index, refills
                while len(scales) > self.max_scales:
                    scales.popitem(last=False)
            scales.move_to_end(key)
            have = buf[0].size - buf[1]
            if have >= n:
                out = buf[0][buf[1]:buf[1] + n].copy()
                buf[1] += n
                return out
            buf[2] += 1
            want = n - have
            fresh = draw(max(want, min(self.max_draws, n << min(buf[2] - 1, 16))))
            out = np.concatenate([buf[0][buf[1]:], fresh[:want]])
            buf[0], buf[1] = fresh, want
            return out


_POOL = _NoisePool(max_draws=8192)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.clear)


def _sqrt_up(d: int) -> Fraction:
    """A rational upper bound on sqrt(d) (exact when d is a perfect square)."""
    r = math.isqrt(d)
    if r * r == d:
        return Fraction(r)
    # math.sqrt is correctly rounded, so the next float up is strictly above sqrt(d).
    return Fraction(math.nextafter(math.sqrt(d), math.inf))


def _count(shape) -> int:
    return int(np.prod(shape)) if shape != () else 1


def secure_gaussian(sigma: float, shape, rng, *, grid: float | None = None) -> np.ndarray:
    """Discrete Gaussian noise (std ``sigma``) on the grid ``grid``, as floats.

    ``grid=None`` takes ``grid_granularity(sigma)``, which is only safe when ``sigma`` is
    public; pass a public power-of-two ``grid`` when ``sigma`` depends on private data.
    """
    V.positive("sigma", sigma)
    g = _resolve_grid(sigma, grid)
    units = _to_fraction(sigma) / _to_fraction(g)
    return (_discrete_ints("gaussian", units, _count(shape), rng) * g).reshape(shape)


def secure_laplace(scale: float, shape, rng, *, grid: float | None = None) -> np.ndarray:
    """Discrete Laplace noise (scale ``scale``) on the grid ``grid``, as floats.

    ``grid=None`` takes ``grid_granularity(scale)`` (only safe for a public scale).
    """
    V.positive("scale", scale)
    g = _resolve_grid(scale, grid)
    units = _to_fraction(scale) / _to_fraction(g)
    return (_discrete_ints("laplace", units, _count(shape), rng) * g).reshape(shape)


def secure_release(x: np.ndarray, scale: float, rng, *, kind: str, sensitivity: float,
                   grid: float | None = None, engine: str = "numpy") -> np.ndarray:
    """Round ``x`` to the grid, add exact discrete noise, return grid points as floats.

    ``scale`` is sigma (kind="gaussian") or the Laplace scale (kind="laplace") of the
    booked record; it is inflated to cover the rounding (see the module docstring).
    Value and noise live on the *same* grid ``g``: the noise is an integer multiple of
    ``g`` drawn at scale ``inflated / g``. (Drawing it on the grid of the inflated
    scale, which is ``2g`` when the inflation crosses a power of two, would put
    neighbouring outputs on disjoint cosets: a certain distinguisher.)

    ``grid`` (a power of two) must be PUBLIC. ``None`` derives it from ``scale``
    (``grid_granularity(scale)``): correct for fixed-sensitivity releases whose scale is
    fixed in advance, wrong when ``scale`` (or ``sensitivity``) depends on private data,
    e.g. a smooth-sensitivity release; those callers pass a grid computed from public
    parameters (the grid is visible in the outputs' low bits).
    """
    V.positive("scale", scale)
    V.positive("sensitivity", sensitivity)
    if kind not in ("gaussian", "laplace"):
        raise ValueError(f"kind must be 'gaussian' or 'laplace'. Found {kind!r}.")
    d = x.size
    g = _resolve_grid(scale, grid)
    snapped = np.round(x / g) * g
    if np.any(np.abs(snapped) >= math.ldexp(g, 52)):
        raise ValueError(
            f"value is too large for exact secure release on the grid {g!r} (scale {scale!r}): "
            f"|value| must stay below {math.ldexp(g, 52)!r}. Found {float(np.max(np.abs(x)))!r}."
        )
    if engine == "numpy":    # (t, s) cached on float keys: no Fraction hashing per release
        ints = _pooled_ints(kind, *_release_ratio(kind, float(scale), g, float(sensitivity), d), d, rng)
    else:
        ints = _discrete_ints(kind, _inflated_units(kind, float(scale), g, float(sensitivity), d), d, rng,
                              engine=engine)
    return snapped + ints.reshape(x.shape) * g


@functools.lru_cache(maxsize=1024)
def _release_ratio(kind: str, scale: float, g: float, sensitivity: float, d: int) -> tuple[int, int]:
    return _scale_ratio(_inflated_units(kind, scale, g, sensitivity, d))


@functools.lru_cache(maxsize=1024)
def _inflated_units(kind: str, scale: float, g: float, sensitivity: float, d: int) -> Fraction:
    """The noise scale in units of the grid ``g``, inflated for the rounding to the grid.

    |round(x) - round(x')| <= |x - x'| + g per coordinate: L2 grows by <= g*sqrt(d), L1
    by <= g*d. Computed exactly (never rounded down).
    """
    fg, fsens = _to_fraction(g), _to_fraction(sensitivity)
    slack = fg * (_sqrt_up(d) if kind == "gaussian" else d)
    return _to_fraction(scale) / fg * (fsens + slack) / fsens
