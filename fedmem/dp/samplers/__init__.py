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
generator take their noise from a per-generator pool drawn ahead (:class:`NoisePool`:
each draw used once, in order; a generator's replayed ``bit_generator.state`` therefore
does not replay pooled noise). ``scripts/bench_dp.py`` measures the speed
of ``fast``, the Python reference and the vectorised sampler side by side.

Modules: ``float_samplers`` (the ``fast`` float samplers, :func:`is_private`), ``grid``
(public grid, scale in grid units, rounding inflation), ``sources`` (uniform bytes / 64-bit
words and the exact Bernoulli and geometric draws built on them), ``exp_neg`` (certified
table of ``exp(-j)``), ``reference`` (the one-draw-at-a-time CKS20 samplers on Python
ints), ``proposals`` (vectorised CKS20 Algorithm 2 proposals), ``pool`` (noise drawn
ahead per generator). This module keeps the vectorised exact samplers and the secure
releases built on them (their int64 limits ``_GAUSS_VEC_MAX_T`` / ``_LAP_VEC_MAX_T`` live
here, where the tests set them).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fedmem import _validate as V

from .exp_neg import exp_neg_floor, exp_neg_table
from .float_samplers import SAMPLING_MODES, gaussian, is_private, laplace
from .grid import (check_grid, grid_granularity, inflated_units, release_ratio, resolve_grid, scale_ratio,
                   sqrt_up, to_fraction)
from .pool import POOL, NoisePool
from .proposals import dlap_proposals
from .reference import bernoulli_exp, bernoulli_exp_ratio, discrete_gaussian, discrete_laplace
from .sources import Bits, LazyUniform, Words

__all__ = [
    "SAMPLING_MODES", "is_private", "gaussian", "laplace",
    "secure_gaussian", "secure_laplace", "secure_release", "grid_granularity", "check_grid",
    "discrete_laplace_ints", "discrete_gaussian_ints",
]

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

_GAUSS_VEC_MAX_T = 1 << 24  # t beyond this (a very fine explicit grid): acceptance on Python ints
_LAP_VEC_MAX_T = 1 << 50


def discrete_laplace_ints(t: int, s: int, n: int, src: Words) -> np.ndarray:
    """``n`` exact draws with Pr[y] proportional to exp(-|y| s / t) (int64; object if t is huge)."""
    if not (1 <= t and 1 <= s):
        raise ValueError(f"t and s must be positive integers. Found t={t!r}, s={s!r}.")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if t > _LAP_VEC_MAX_T:
        bits = src.bits
        return np.array([discrete_laplace(s, t, bits) for _ in range(n)], dtype=object)
    out, got = [], 0
    while got < n:
        y, _ = dlap_proposals(t, s, int((n - got) * 1.7) + 16, src)
        out.append(y)
        got += y.size
    return np.concatenate(out)[:n]


def discrete_gaussian_ints(t: int, s: int, n: int, src: Words) -> np.ndarray:
    """``n`` exact draws with Pr[y] proportional to exp(-y**2 s**2 / (2 t**2)) (sigma = t/s)."""
    if not (1 <= t and 1 <= s):
        raise ValueError(f"t and s must be positive integers. Found t={t!r}, s={s!r}.")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if t > _LAP_VEC_MAX_T:
        bits = src.bits
        sigma2 = Fraction(t, s) ** 2
        return np.array([discrete_gaussian(sigma2, bits) for _ in range(n)], dtype=np.int64)
    den = 2 * t * t                      # < 2**49 when t <= _GAUSS_VEC_MAX_T
    out, got = [], 0
    while got < n:
        y, big = dlap_proposals(t, s, int((n - got) * 2.3) + 16, src)
        if t > _GAUSS_VEC_MAX_T:         # a very fine explicit grid: the acceptance on Python ints
            bits = src.bits
            acc = np.array([bernoulli_exp_ratio((abs(int(yi)) * s - t) ** 2, den, bits) for yi in y],
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
            acc[i] = bernoulli_exp_ratio((yi * s - t) ** 2, den, src.bits)
        got_y = y[acc]
        out.append(got_y)
        got += got_y.size
    return np.concatenate(out)[:n]


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
        bits = Bits(rng)
        if kind == "gaussian":
            sigma2 = units ** 2
            ints = [discrete_gaussian(sigma2, bits) for _ in range(n)]
        else:
            ints = [discrete_laplace(units.denominator, units.numerator, bits) for _ in range(n)]
        return np.array(ints, dtype=np.float64)
    if engine != "numpy":
        raise ValueError(f"engine must be 'numpy' or 'python'. Found {engine!r}.")
    return _pooled_ints(kind, *scale_ratio(units), n, rng)


def _pooled_ints(kind: str, t: int, s: int, n: int, rng) -> np.ndarray:
    """``n`` exact draws at scale ``t/s`` (grid units) from ``rng``'s pool, as float64."""
    draw = discrete_gaussian_ints if kind == "gaussian" else discrete_laplace_ints
    return POOL.take(rng, (kind, t, s), n, lambda m: draw(t, s, m, Words(rng))).astype(np.float64)


def _count(shape) -> int:
    return int(np.prod(shape)) if shape != () else 1


def secure_gaussian(sigma: float, shape, rng, *, grid: float | None = None) -> np.ndarray:
    """Discrete Gaussian noise (std ``sigma``) on the grid ``grid``, as floats.

    ``grid=None`` takes ``grid_granularity(sigma)``, which is only safe when ``sigma`` is
    public; pass a public power-of-two ``grid`` when ``sigma`` depends on private data.
    """
    V.positive("sigma", sigma)
    g = resolve_grid(sigma, grid)
    units = to_fraction(sigma) / to_fraction(g)
    return (_discrete_ints("gaussian", units, _count(shape), rng) * g).reshape(shape)


def secure_laplace(scale: float, shape, rng, *, grid: float | None = None) -> np.ndarray:
    """Discrete Laplace noise (scale ``scale``) on the grid ``grid``, as floats.

    ``grid=None`` takes ``grid_granularity(scale)`` (only safe for a public scale).
    """
    V.positive("scale", scale)
    g = resolve_grid(scale, grid)
    units = to_fraction(scale) / to_fraction(g)
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
    g = resolve_grid(scale, grid)
    snapped = np.round(x / g) * g
    if np.any(np.abs(snapped) >= math.ldexp(g, 52)):
        # the released value is private: the text names only the public grid, scale and limit (a
        # caller that let such a value reach here must fail closed; it never carries the value)
        raise ValueError(
            f"value is too large for exact secure release on the grid {g!r} (scale {scale!r}): "
            f"|value| must stay below {math.ldexp(g, 52)!r} (the value itself is not reported)."
        ) from None
    if engine == "numpy":    # (t, s) cached on float keys: no Fraction hashing per release
        ints = _pooled_ints(kind, *release_ratio(kind, float(scale), g, float(sensitivity), d), d, rng)
    else:
        ints = _discrete_ints(kind, inflated_units(kind, float(scale), g, float(sensitivity), d), d, rng,
                              engine=engine)
    return snapped + ints.reshape(x.shape) * g



# The names tests and callers knew before the split (private there; public in the submodules).
_Bits, _LazyUniform, _Words = Bits, LazyUniform, Words
_bernoulli_exp, _bernoulli_exp_ratio = bernoulli_exp, bernoulli_exp_ratio
_discrete_laplace, _discrete_gaussian = discrete_laplace, discrete_gaussian
_exp_neg_floor, _table = exp_neg_floor, exp_neg_table
_scale_ratio, _sqrt_up, _resolve_grid, _to_fraction = scale_ratio, sqrt_up, resolve_grid, to_fraction
_release_ratio, _inflated_units = release_ratio, inflated_units
_NoisePool, _POOL = NoisePool, POOL
