"""Float low-bit reachability attack (Mironov, CCS 2012; Jin et al., IEEE S&P 2022).

A released coordinate of fedmem's value channel (realized calibration, the default) is::

    v = fl( fl(S + Z) / D )          (fedmem.federation.aggregator: mech.release(total, rng) / denom)

with ``S`` the exact (clipped, fixed-point decoded) sum, ``D`` the public denominator and
``Z`` one float noise draw. A float sampler does not reach every float: numpy's
``Generator.laplace`` is an inverse CDF on ``U = k 2^-53`` and ``Generator.normal`` is a
ziggurat whose outputs are ``+/- fl(m w_i)`` for 52-bit integers ``m`` on 256 per-layer
grids (plus a tail beyond ``r = 3.654``). Which ``v`` can come out therefore depends on
``S``: an adversary who knows both neighbouring sums ``S_in`` and ``S_out`` (as in every DP
game) checks, per coordinate, whether ``v`` is reachable from each. The true sum is always
consistent; the other one is not on a fraction of the coordinates, so the worlds separate
with certainty.

For each model the map from the sampler's integer input (``k`` for Laplace, ``m`` per
layer and sign for the ziggurat) to ``v`` is monotone, so a binary search over the 52/53-bit
input (vectorised in numpy over coordinates, layers and signs) finds the smallest input
reaching ``>= v`` and checks equality: exact enumeration, no sampling.

Models (:func:`model_for`):

* ``"laplace"``: numpy ``Generator.laplace(0, b)`` (``random_laplace``: ``U = next_double``;
  ``U >= 1/2``: ``-b log(2 - U - U)``; else ``b log(U + U)``).
* ``"gaussian"``: numpy ``Generator.normal(0, sigma)`` = ``0 + sigma * standard_normal``
  (``random_standard_normal``: ``idx = r & 0xff; r >>= 8; sign = r & 1;
  rabs = (r >> 1) & (2^52 - 1); x = rabs * wi[idx]``), tables shipped in
  :mod:`fedmem.attacks._ziggurat_tables` (BSD, numpy). Tail draws (``|x| >= r``) are
  counted as consistent (conservative: never a false "inconsistent").
* ``"grid"``: fedmem's secure samplers (integer noise on a public grid, output
  ``integer * g``): every output is reachable from every input, the attack reads nothing.

The score of one release is ``#coords inconsistent with S_out - #coords inconsistent with
S_in`` (higher: the target is in). :func:`fedmem.attacks.verdict.judge` turns the scores
of both worlds into the verdict.

Nothing here draws randomness; :func:`replay_standard_normal` and
:func:`replay_laplace` replay an injected bit generator's stream for the bit-exactness test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.attacks import _ziggurat_tables as _Z

__all__ = ["FloatModel", "model_for", "consistent", "release_score", "release_scores", "reachable_noise",
           "replay_standard_normal", "replay_laplace", "MODELS"]

MODELS = ("laplace", "gaussian", "grid")
_WI = np.array(_Z.WI_DOUBLE, dtype=np.float64)
_KI0 = int(_Z.KI_DOUBLE[0])
_R = _Z.ZIGGURAT_NOR_R
_TWO52 = 1 << 52
_TWO53 = 1 << 53
_INV53 = 2.0 ** -53


@dataclass(frozen=True)
class FloatModel:
    """The sampler an adversary replays: ``kind`` in :data:`MODELS` and its public scale
    (Laplace ``b``, Gaussian ``sigma``)."""

    kind: str
    scale: float

    def __post_init__(self):
        if self.kind not in MODELS:
            raise ValueError(f"kind must be one of {MODELS}. Found {self.kind!r}.")
        V.positive("scale", self.scale)


def model_for(noise: str, sampling: str, scale: float) -> FloatModel:
    """The model of a fedmem mechanism: ``noise`` ``"gaussian"``/``"laplace"`` with
    ``sampling`` ``"fast"`` (numpy float samplers) or anything else (the secure grid)."""
    if noise not in ("gaussian", "laplace"):
        raise ValueError(f"noise must be 'gaussian' or 'laplace'. Found {noise!r}.")
    return FloatModel(noise if sampling == "fast" else "grid", float(scale))


# ------------------------------------------------------------------ the release map
def _release(a: np.ndarray, z: np.ndarray, d: float) -> np.ndarray:
    """fl(fl(a + z) / d), exactly as the aggregator computes it (IEEE double, numpy)."""
    return (a + z) / d


def _libm_log(x: np.ndarray) -> np.ndarray:
    """The C library's ``log`` of every element (``math.log`` calls it; 0 gives ``-inf``).

    numpy's sampler calls libm's ``log`` (``npy_log``) once per draw, but the ``np.log``
    ufunc dispatches to numpy's own SIMD code on CPUs with AVX-512F, whose result differs
    from libm's in the last bit for about 0.3% of inputs (measured on an AMD EPYC with
    AVX-512: 0.33% of 200,000 uniform doubles). A replay that used ``np.log`` there would
    call reachable floats unreachable (a false "inconsistent"), so the model calls libm
    element by element (~0.1 us each)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
    out = np.fromiter((math.log(t) if t > 0.0 else -math.inf for t in flat.tolist()),
                      dtype=np.float64, count=flat.size)
    return out.reshape(np.shape(x))


def _laplace_noise(k: np.ndarray, scale: float) -> np.ndarray:
    """numpy ``random_laplace(loc=0, scale)`` for ``U = k 2^-53`` (k in [1, 2^53)): ``U >= 1/2``
    gives ``0 - scale * log((2 - U) - U)``, else ``0 + scale * log(U + U)`` (libm's log)."""
    u = k.astype(np.float64) * _INV53
    high = u >= 0.5
    out = np.empty_like(u)
    out[high] = 0.0 - scale * _libm_log((2.0 - u[high]) - u[high])
    out[~high] = 0.0 + scale * _libm_log(u[~high] + u[~high])
    return out


def _search(f, lo: np.ndarray, hi: np.ndarray, target: np.ndarray, increasing: np.ndarray) -> np.ndarray:
    """Smallest integer x in [lo, hi) with f(x) >= target (increasing) or f(x) <= target
    (decreasing), per element; ``hi`` where none. ``f`` is monotone in the given direction."""
    lo, hi = lo.copy(), hi.copy()
    end = hi.copy()
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = lo + (hi - lo) // 2
        val = f(np.minimum(mid, end - 1))
        ok = np.where(increasing, val >= target, val <= target)
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)
    return lo


def consistent(v, offset, denom, model: FloatModel) -> np.ndarray:
    """Per coordinate: is ``v`` reachable as ``fl(fl(offset + Z) / denom)`` for some draw
    ``Z`` of ``model``? (Boolean array; the grid model reads nothing: all True.)

    ``offset`` is the hypothesised sum ``S`` (realized calibration) or the hypothesised
    mean ``fl(S / D)`` with ``denom = 1.0`` (global calibration adds the noise to the mean).
    ``denom`` is a scalar or one denominator per coordinate (batches of releases).
    """
    v = V.finite_array("v", v, ndim=1)
    a = V.finite_array("offset", offset, ndim=1, dim=v.size)
    d = np.asarray(denom, dtype=np.float64)
    if d.ndim == 0:
        d = float(V.positive("denom", float(d)))
    elif d.shape != v.shape or not np.all(np.isfinite(d) & (d > 0)):
        raise ValueError(f"denom must be a positive scalar or a positive array shaped like v {v.shape}. "
                         f"Found shape {d.shape}.")
    if model.kind == "grid":
        return np.ones(v.size, dtype=bool)
    s = model.scale
    if model.kind == "laplace":
        # two monotone increasing branches: k in [1, 2^52) (U < 1/2) and [2^52, 2^53)
        los = np.array([1, _TWO52], dtype=np.int64)
        his = np.array([_TWO52, _TWO53], dtype=np.int64)
        A = np.repeat(a[:, None], 2, axis=1)
        T = np.repeat(v[:, None], 2, axis=1)
        lo = np.broadcast_to(los, A.shape).copy()
        hi = np.broadcast_to(his, A.shape).copy()

        def f(k):
            return _release(A, _laplace_noise(k, s), d)

        k = _search(f, lo, hi, T, np.ones(A.shape, dtype=bool))
        hit = (k < hi) & (f(np.minimum(k, hi - 1)) == T)
        return hit.any(axis=1)
    # gaussian ziggurat: N = sign * fl(m * wi[idx]); Z = 0 + fl(sigma * N).
    # 1) the floats Z with fl(fl(a + Z)/d) == v, 2) the floats N with fl(sigma N) in that set
    # (both intervals: the maps are monotone), 3) per layer and sign, the smallest m with
    # fl(m wi) >= the interval's low end is within a few units of low/wi: check those.
    zlo, zhi = _preimage(lambda z: _release(a, z, d), v)
    nlo, nhi = _preimage(lambda x: s * x, zlo, zhi)
    empty = ~(nlo <= nhi)
    hit = np.zeros(v.size, dtype=bool)
    W = _WI[None, :, None]
    cap = np.full(_WI.size, _TWO52, dtype=np.int64)
    cap[0] = _KI0                                   # layer 0 beyond ki[0] goes to the tail
    cap = cap[None, :, None]
    for lo_t, hi_t in ((nlo, nhi), (-nhi, -nlo)):   # sign +: fl(m w) in [nlo, nhi]; sign -: in [-nhi, -nlo]
        L = np.maximum(lo_t, 0.0)[:, None, None]
        H = hi_t[:, None, None]
        with np.errstate(invalid="ignore"):
            base = np.nan_to_num(np.minimum(np.floor(L / W), float(_TWO52)), nan=0.0, posinf=float(_TWO52))
        base = base.astype(np.int64)
        m = base + np.arange(-2, 4, dtype=np.int64)[None, None, :]
        m = np.clip(m, 0, cap - 1)
        x = m.astype(np.float64) * W
        hit |= ((x >= L) & (x <= H)).any(axis=(1, 2))
    hit &= ~empty
    # tail (|N| >= r): not enumerated, counted consistent when the implied draw is near or past r
    implied = np.abs(v * d - a) / s
    slack = (np.abs(a) + np.abs(v * d)) * 1e-12 / s + 1e-9
    return hit | (implied >= _R * (1 - 1e-9) - slack)


_SIGN = np.int64(-(1 << 63))
_MAXKEY = np.int64(0x7FEFFFFFFFFFFFFF)   # key of the largest finite double


def _key_to_float(k: np.ndarray) -> np.ndarray:
    """Inverse of the order-preserving map double -> int64 (non-negative: bits; negative: -(|bits|))."""
    bits = np.where(k >= 0, k, (-k) | _SIGN)
    return bits.astype(np.int64).view(np.float64)


def _first(f, target: np.ndarray, strict: bool) -> np.ndarray:
    """Per element, the smallest finite double x (as a key) with f(x) >= target (> if strict);
    f is monotone non-decreasing. Returns _MAXKEY + 1 where none."""
    lo = np.full(target.shape, -_MAXKEY, dtype=np.int64)
    hi = np.full(target.shape, _MAXKEY + 1, dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo >> 1) + (hi >> 1) + (((lo & 1) + (hi & 1)) >> 1)    # floor((lo + hi) / 2), no overflow
        val = f(_key_to_float(mid))
        ok = (val > target) if strict else (val >= target)
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)


def _preimage(f, lo_t: np.ndarray, hi_t: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float interval {x : lo_t <= f(x) <= hi_t} of a monotone non-decreasing f (hi_t = lo_t
    when None), as (low, high) doubles; low > high (or nan) when empty."""
    hi_t = lo_t if hi_t is None else hi_t
    a = _first(f, lo_t, strict=False)
    b = _first(f, hi_t, strict=True) - 1
    with np.errstate(invalid="ignore"):
        low = np.where(a <= _MAXKEY, _key_to_float(np.minimum(a, _MAXKEY)), np.inf)
        high = np.where(b >= -_MAXKEY, _key_to_float(np.maximum(b, -_MAXKEY)), -np.inf)
    return low, high


def reachable_noise(z, model: FloatModel) -> np.ndarray:
    """Is each float ``z`` an output of ``model``'s noise sampler? (offset 0, denominator 1)."""
    z = V.finite_array("z", z, ndim=1)
    return consistent(z, np.zeros_like(z), 1.0, model)


def release_scores(values, offset_in, offset_out, denom, model: FloatModel, denom_out=None) -> np.ndarray:
    """:func:`release_score` of many releases at once (rows of ``values``; offsets broadcast;
    ``denom`` a scalar or one per row; ``denom_out`` the other world's, when it differs)."""
    vals = V.finite_array("values", values, ndim=2)
    a_in = np.broadcast_to(np.asarray(offset_in, dtype=np.float64), vals.shape)
    a_out = np.broadcast_to(np.asarray(offset_out, dtype=np.float64), vals.shape)

    def per_coord(d):
        d = np.asarray(d, dtype=np.float64)
        return d if d.ndim == 0 else np.broadcast_to(d.reshape(-1, 1), vals.shape).ravel()

    d_in = per_coord(denom)
    d_out = d_in if denom_out is None else per_coord(denom_out)
    bad_out = ~consistent(vals.ravel(), a_out.ravel(), d_out, model).reshape(vals.shape)
    bad_in = ~consistent(vals.ravel(), a_in.ravel(), d_in, model).reshape(vals.shape)
    return (bad_out.sum(axis=1) - bad_in.sum(axis=1)).astype(np.float64)


def release_score(v, offset_in, offset_out, denom: float, model: FloatModel) -> float:
    """Score of one release: ``#coords inconsistent with the world without the target -
    #coords inconsistent with the world with it`` (higher: the target is in)."""
    out_bad = int(np.sum(~consistent(v, offset_out, denom, model)))
    in_bad = int(np.sum(~consistent(v, offset_in, denom, model)))
    return float(out_bad - in_bad)


# ------------------------------------------------------------------ replays (for the tests)
def replay_standard_normal(bit_generator, n: int) -> np.ndarray:
    """numpy's ``random_standard_normal`` replayed in Python on ``bit_generator``'s uint64
    stream (``random_raw``), rejection and tail included."""
    out = np.empty(n)
    raw = bit_generator.random_raw

    def next_double():
        return (int(raw()) >> 11) * _INV53

    for i in range(n):
        while True:
            r = int(raw())
            idx = r & 0xFF
            r >>= 8
            sgn = r & 1
            rabs = (r >> 1) & 0x000FFFFFFFFFFFFF
            x = float(rabs) * _Z.WI_DOUBLE[idx]
            if sgn:
                x = -x
            if rabs < _Z.KI_DOUBLE[idx]:
                break
            if idx == 0:
                while True:
                    xx = -_Z.ZIGGURAT_NOR_INV_R * math.log1p(-next_double())
                    yy = -math.log1p(-next_double())
                    if yy + yy > xx * xx:
                        break
                x = -(_R + xx) if (rabs >> 8) & 1 else _R + xx
                break
            if (_Z.FI_DOUBLE[idx - 1] - _Z.FI_DOUBLE[idx]) * next_double() + _Z.FI_DOUBLE[idx] < math.exp(-0.5 * x * x):
                break
        out[i] = x
    return out


def replay_laplace(bit_generator, n: int, scale: float) -> np.ndarray:
    """numpy's ``random_laplace(0, scale)`` replayed (vectorised) on ``bit_generator``'s stream
    (a draw with ``U = 0`` is rejected and redrawn, as numpy does; probability 2^-53)."""
    k = (bit_generator.random_raw(n).astype(np.uint64) >> np.uint64(11)).astype(np.int64)
    if np.any(k == 0):
        raise ValueError("U == 0 drawn: numpy redraws; replay does not handle it. Found a zero draw.")
    return _laplace_noise(k, float(scale))
