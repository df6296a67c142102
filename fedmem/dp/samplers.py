"""Noise samplers. Every sampler takes an injected RNG; none touches a global RNG.

``fast``: numpy / torch floating-point samplers. Fine for simulation, but a textbook
floating-point Laplace or Gaussian sampler leaks through the low-order bits of its
output (Mironov, CCS 2012): some floats are reachable from one input and not from its
neighbour, so an observer can distinguish them with certainty.

``secure``: exact discrete samplers after Canonne, Kamath and Steinke (NeurIPS 2020,
"The Discrete Gaussian for Differential Privacy", Algorithms 1-3). Randomness is drawn
as whole bits from the injected RNG and all arithmetic is exact on Python integers and
``fractions.Fraction``. A secure release works on a grid of granularity ``g = 2**k``
(``k`` chosen so that ``g`` is about ``scale * 2**-20``): the value is rounded to the
grid, integer noise in units of ``g`` is added, and the result is ``integer * g``, which
is an exactly representable float, so every output is reachable from every input and
the low bits carry no information. Rounding to the grid can move a value by up to
``g/2`` per coordinate, so the secure release inflates the noise scale by
``(sensitivity + g*sqrt(d)) / sensitivity`` (L2) or ``(sensitivity + g*d) /
sensitivity`` (L1); the booked record's guarantee therefore still holds. The discrete
Gaussian with variance parameter sigma^2 satisfies the same rho = Delta^2 / (2 sigma^2)
zCDP as the continuous one (CKS20 Thm. 4), which is what the RDP accountant uses.

The secure samplers are pure Python and roughly three orders of magnitude slower than
``fast``; ``scripts/bench_dp.py`` measures the cost.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fedmem import _validate as V

_GRID_BITS = 20


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
    u = torch.rand(size, generator=rng, dtype=torch.float64).numpy() - 0.5
    return -scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))


# --------------------------------------------------------------------------- secure
class _Bits:
    """Exact uniform integers from an injected RNG, by rejection on whole bytes."""

    def __init__(self, rng):
        V.rng_check("rng", rng)
        self._rng = rng

    def _raw(self, nbytes: int) -> int:
        if isinstance(self._rng, np.random.Generator):
            return int.from_bytes(self._rng.bytes(nbytes), "little")
        import torch

        b = torch.randint(0, 256, (nbytes,), generator=self._rng, dtype=torch.int64)
        return int.from_bytes(bytes(b.tolist()), "little")

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
    while gamma > 1:
        if not _bernoulli_exp_small(Fraction(1), bits):
            return False
        gamma -= 1
    return _bernoulli_exp_small(gamma, bits)


def _bernoulli_exp_small(gamma: Fraction, bits: _Bits) -> bool:
    k = 1
    while bits.bernoulli(gamma / k):
        k += 1
    return k % 2 == 1


def _discrete_laplace(s: int, t: int, bits: _Bits) -> int:
    """Pr[Y=y] proportional to exp(-|y| * s / t) on the integers (CKS20 Algorithm 2)."""
    while True:
        u = bits.below(t)
        if not _bernoulli_exp(Fraction(u, t), bits):
            continue
        v = 0
        while _bernoulli_exp(Fraction(1), bits):
            v += 1
        x = u + t * v
        y = x // s
        negative = bits.below(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def _discrete_gaussian(sigma2: Fraction, bits: _Bits) -> int:
    """Pr[Y=y] proportional to exp(-y^2 / (2 sigma2)) on the integers (CKS20 Algorithm 3)."""
    t = math.floor(math.sqrt(sigma2)) + 1
    while True:
        y = _discrete_laplace(1, t, bits)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if _bernoulli_exp(gamma, bits):
            return y


def grid_granularity(scale: float) -> float:
    """The power of two about ``scale * 2**-20`` used as the secure sampler's grid."""
    V.positive("scale", scale)
    return math.ldexp(1.0, math.floor(math.log2(scale)) - _GRID_BITS)


def _to_fraction(x: float) -> Fraction:
    return Fraction(x).limit_denominator(1 << 40)


def secure_gaussian(sigma: float, shape, rng) -> np.ndarray:
    """Discrete Gaussian noise on the grid ``grid_granularity(sigma)``, as floats."""
    V.positive("sigma", sigma)
    g = grid_granularity(sigma)
    sigma2 = _to_fraction(sigma / g) ** 2
    bits = _Bits(rng)
    n = int(np.prod(shape)) if shape != () else 1
    ints = [_discrete_gaussian(sigma2, bits) for _ in range(n)]
    return (np.array(ints, dtype=np.float64) * g).reshape(shape)


def secure_laplace(scale: float, shape, rng) -> np.ndarray:
    """Discrete Laplace noise on the grid ``grid_granularity(scale)``, as floats."""
    V.positive("scale", scale)
    g = grid_granularity(scale)
    b = _to_fraction(scale / g)
    bits = _Bits(rng)
    n = int(np.prod(shape)) if shape != () else 1
    ints = [_discrete_laplace(b.denominator, b.numerator, bits) for _ in range(n)]
    return (np.array(ints, dtype=np.float64) * g).reshape(shape)


def secure_release(x: np.ndarray, scale: float, rng, *, kind: str, sensitivity: float) -> np.ndarray:
    """Round ``x`` to the grid, add exact discrete noise, return grid points as floats.

    ``scale`` is sigma (kind="gaussian") or the Laplace scale (kind="laplace") of the
    booked record; it is inflated to cover the rounding (see the module docstring).
    """
    V.positive("scale", scale)
    V.positive("sensitivity", sensitivity)
    d = x.size
    g = grid_granularity(scale)
    if kind == "gaussian":
        inflated = scale * (sensitivity + g * math.sqrt(d)) / sensitivity
        noise = secure_gaussian(inflated, x.shape, rng)
    elif kind == "laplace":
        inflated = scale * (sensitivity + g * d) / sensitivity
        noise = secure_laplace(inflated, x.shape, rng)
    else:
        raise ValueError(f"kind must be 'gaussian' or 'laplace'. Found {kind!r}.")
    gn = grid_granularity(inflated)
    # Both grids are powers of two; snap the value to the finer one so that the sum is
    # an exact grid point.
    step = min(g, gn)
    snapped = np.round(x / step) * step
    if np.any(np.abs(snapped) >= math.ldexp(step, 52)):
        raise ValueError(
            f"value is too large for exact secure release at scale {scale!r}: "
            f"|value| must stay below {math.ldexp(step, 52)!r}. Found {float(np.max(np.abs(x)))!r}."
        )
    return snapped + noise
