"""The public grid and the noise scale in grid units: default grid for a public scale, explicit
grid validation, the exact rational scale ``t/s`` (rounded up) and the inflation that
covers the rounding to the grid (see the :mod:`fedmem.dp.samplers` docstring).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from fedmem import _validate as V

_GRID_BITS = 20
_PBITS = 20                 # relative rounding of the scale in grid units: at most 2**-20, upward


@functools.lru_cache(maxsize=1024)
def scale_ratio(units: Fraction) -> tuple[int, int]:
    """(t, s): s a power of two, t/s >= units, t >= 2**_PBITS (relative rounding <= 2**-_PBITS)."""
    if units <= 0:
        raise ValueError(f"scale in grid units must be positive. Found {units!r}.")
    e = max(0, _PBITS + 1 - (units.numerator.bit_length() - units.denominator.bit_length()))
    s = 1 << e
    t = -((-units.numerator * s) // units.denominator)  # ceil(units * s)
    return t, s


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


def resolve_grid(scale: float, grid) -> float:
    return grid_granularity(scale) if grid is None else check_grid(grid)


def to_fraction(x: float) -> Fraction:
    """The exact rational value of a binary float (never rounded, so never below it)."""
    return Fraction(x)


def sqrt_up(d: int) -> Fraction:
    """A rational upper bound on sqrt(d) (exact when d is a perfect square)."""
    r = math.isqrt(d)
    if r * r == d:
        return Fraction(r)
    # math.sqrt is correctly rounded, so the next float up is strictly above sqrt(d).
    return Fraction(math.nextafter(math.sqrt(d), math.inf))


@functools.lru_cache(maxsize=1024)
def release_ratio(kind: str, scale: float, g: float, sensitivity: float, d: int) -> tuple[int, int]:
    return scale_ratio(inflated_units(kind, scale, g, sensitivity, d))


@functools.lru_cache(maxsize=1024)
def inflated_units(kind: str, scale: float, g: float, sensitivity: float, d: int) -> Fraction:
    """The noise scale in units of the grid ``g``, inflated for the rounding to the grid.

    |round(x) - round(x')| <= |x - x'| + g per coordinate: L2 grows by <= g*sqrt(d), L1
    by <= g*d. Computed exactly (never rounded down).
    """
    fg, fsens = to_fraction(g), to_fraction(sensitivity)
    slack = fg * (sqrt_up(d) if kind == "gaussian" else d)
    return to_fraction(scale) / fg * (fsens + slack) / fsens
