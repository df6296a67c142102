"""Noise samplers. Every sampler takes an injected RNG; none touches a global RNG.

``fast``: numpy / torch floating-point samplers. Fine for simulation, but a textbook
floating-point Laplace or Gaussian sampler leaks through the low-order bits of its
output (Mironov, CCS 2012): some floats are reachable from one input and not from its
neighbour, so an observer can distinguish them with certainty.

``secure``: exact discrete samplers after Canonne, Kamath and Steinke (NeurIPS 2020,
"The Discrete Gaussian for Differential Privacy", Algorithms 1-3). Randomness is drawn
as whole bits from the injected RNG and all arithmetic is exact on Python integers and
``fractions.Fraction``. A secure release works on a grid of granularity ``g = 2**k``
(by default ``k`` chosen so that ``g`` is about ``scale * 2**-20``; see "The grid must be
public" below for when the caller must pass ``grid=`` instead): the value is rounded to the
grid, integer noise in units of ``g`` (the *same* grid, whatever the inflated noise
scale) is added, and the result is ``integer * g``, which
is an exactly representable float, so every output is reachable from every input and
the low bits carry no information. Rounding to the grid can move a value by up to
``g/2`` per coordinate, so the secure release inflates the noise scale by
``(sensitivity + g*sqrt(d)) / sensitivity`` (L2) or ``(sensitivity + g*d) /
sensitivity`` (L1); the booked record's guarantee therefore still holds. The discrete
Gaussian with variance parameter sigma^2 satisfies the same rho = Delta^2 / (2 sigma^2)
zCDP as the continuous one (CKS20 Thm. 4), which is what the RDP accountant uses.

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

The secure samplers are pure Python on exact integers (random bytes fetched in blocks);
they are about two orders of magnitude slower than ``fast`` (roughly 2-3e4 versus 3e6
noise samples/s for a 128-d release on one core); ``scripts/bench_dp.py`` measures it.
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


def _discrete_ints(kind: str, units: Fraction, n: int, rng) -> np.ndarray:
    """``n`` exact discrete Gaussian (sigma = ``units``) or Laplace (scale = ``units``) integers."""
    bits = _Bits(rng)
    if kind == "gaussian":
        sigma2 = units ** 2
        ints = [_discrete_gaussian(sigma2, bits) for _ in range(n)]
    elif kind == "laplace":
        ints = [_discrete_laplace(units.denominator, units.numerator, bits) for _ in range(n)]
    else:
        raise ValueError(f"kind must be 'gaussian' or 'laplace'. Found {kind!r}.")
    return np.array(ints, dtype=np.float64)


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
                   grid: float | None = None) -> np.ndarray:
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
    # |round(x) - round(x')| <= |x - x'| + g per coordinate: L2 grows by <= g*sqrt(d), L1
    # by <= g*d. The inflated scale, in units of g, is computed exactly (never rounded down).
    fg, fsens = _to_fraction(g), _to_fraction(sensitivity)
    slack = fg * (_sqrt_up(d) if kind == "gaussian" else d)
    units = _to_fraction(scale) / fg * (fsens + slack) / fsens
    snapped = np.round(x / g) * g
    if np.any(np.abs(snapped) >= math.ldexp(g, 52)):
        raise ValueError(
            f"value is too large for exact secure release on the grid {g!r} (scale {scale!r}): "
            f"|value| must stay below {math.ldexp(g, 52)!r}. Found {float(np.max(np.abs(x)))!r}."
        )
    noise = _discrete_ints(kind, units, d, rng).reshape(x.shape) * g
    return snapped + noise
