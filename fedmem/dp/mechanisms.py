"""DP mechanisms as frozen parameter records, plus their samplers.

A record says *what* is released (its parameters and therefore its privacy cost); a
sampler says *how* noise is drawn and always takes an injected RNG. Accounting consumes
records (``record.event()``), never samplers. This mirrors ``dp_accounting.dp_event``:
records are immutable; to change a parameter, build a new record (``dataclasses.replace``
re-runs validation).

Every constructor validates its parameters and raises ``ValueError`` naming the
parameter and the value found; nothing is clamped.

``release`` / ``noise`` default to ``sampling="secure"`` (exact discrete noise on a public
grid, :mod:`fedmem.dp.samplers`); ``"fast"`` float samplers leak through the low-order bits
of their outputs and are only used when asked for explicitly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp import samplers

SamplingMode = Literal["fast", "secure"]
SAMPLING_MODES = samplers.SAMPLING_MODES
#: The sampling mode every release uses unless told otherwise: the exact discrete sampler on
#: a public grid. ``"fast"`` (float samplers, not DP as released) only as an explicit setting.
DEFAULT_SAMPLING: SamplingMode = "secure"


def _check_mode(mode: str, grid=None) -> str:
    if mode not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES}. Found {mode!r}.")
    if grid is not None:
        if mode != "secure":
            raise ValueError(f"grid applies only to sampling='secure'. Found sampling={mode!r}, grid={grid!r}.")
        samplers.check_grid(grid)
    return mode


@dataclass(frozen=True)
class PureDpEvent:
    """A pure epsilon-DP release (e.g. one exponential-mechanism selection).

    ``dp_accounting`` 0.6.0 has no exponential-mechanism event, so the accountant sums
    these epsilons exactly and adds them to the (epsilon, delta) of the rest by basic
    composition, which is valid for any mix of mechanisms.
    """

    epsilon: float
    mechanism: str = "pure"

    def __post_init__(self):
        V.positive("epsilon", self.epsilon)


@dataclass(frozen=True)
class ApproxDpEvent:
    """An (epsilon, delta)-DP release whose guarantee is not a standard dp-accounting event.

    Used for mechanisms certified directly in (epsilon, delta), e.g. BRACE's
    smooth-sensitivity Gaussian release. The accountant composes these by basic
    composition: epsilons add, deltas add (and are subtracted from the delta at which
    the rest is evaluated).
    """

    epsilon: float
    delta: float
    mechanism: str = "approx"

    def __post_init__(self):
        V.positive("epsilon", self.epsilon)
        V.open_unit("delta", self.delta)


@dataclass(frozen=True)
class GaussianMechanism:
    """Gaussian vector release ``x + N(0, sigma^2 I)`` for L2 sensitivity ``l2_sensitivity``.

    Build with :meth:`calibrate` (analytic Gaussian mechanism, Balle & Wang 2018, via
    ``dp_accounting.get_sigma_gaussian``) or :meth:`from_noise_multiplier`.
    """

    sigma: float
    l2_sensitivity: float = 1.0

    def __post_init__(self):
        V.positive("sigma", self.sigma)
        V.positive("l2_sensitivity", self.l2_sensitivity)

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, l2_sensitivity: float = 1.0) -> "GaussianMechanism":
        """Smallest sigma (to 1e-12 relative) whose analytic epsilon at ``delta`` is <= ``epsilon``.

        The root finder may land a hair below the true root, so the result is nudged up
        until :func:`dp_accounting.get_epsilon_gaussian` confirms it never exceeds the
        target (proved by a hypothesis test).
        """
        epsilon = V.positive("epsilon", epsilon)
        delta = V.open_unit("delta", delta)
        l2_sensitivity = V.positive("l2_sensitivity", l2_sensitivity)
        multiplier = float(dp_accounting.get_sigma_gaussian(epsilon, delta))
        while True:
            # Check the record actually built: sigma / l2_sensitivity (what event() books)
            # can round one ulp below the multiplier that was checked.
            record = cls(sigma=multiplier * l2_sensitivity, l2_sensitivity=l2_sensitivity)
            if dp_accounting.get_epsilon_gaussian(record.noise_multiplier, delta) <= epsilon:
                return record
            multiplier = math.nextafter(multiplier, math.inf) * (1 + 1e-12)

    @classmethod
    def from_noise_multiplier(cls, noise_multiplier: float, l2_sensitivity: float = 1.0) -> "GaussianMechanism":
        noise_multiplier = V.positive("noise_multiplier", noise_multiplier)
        l2_sensitivity = V.positive("l2_sensitivity", l2_sensitivity)
        return cls(sigma=noise_multiplier * l2_sensitivity, l2_sensitivity=l2_sensitivity)

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.l2_sensitivity

    def epsilon(self, delta: float) -> float:
        """Tight (analytic) epsilon of one release at ``delta``."""
        delta = V.open_unit("delta", delta)
        return float(dp_accounting.get_epsilon_gaussian(self.noise_multiplier, delta))

    def event(self) -> dp_accounting.GaussianDpEvent:
        return dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)

    def noise(self, shape, rng, sampling: SamplingMode = "secure", *, grid: float | None = None) -> np.ndarray:
        """Noise alone. ``grid`` (secure only): a public power-of-two grid; see :meth:`release`."""
        _check_mode(sampling, grid)
        V.rng_check("rng", rng)
        if sampling == "secure":
            return samplers.secure_gaussian(self.sigma, shape, rng, grid=grid)
        return samplers.gaussian(self.sigma, shape, rng)

    def release(self, value, rng, sampling: SamplingMode = "secure", *, grid: float | None = None) -> np.ndarray:
        """Return ``value`` plus noise. ``value`` must be finite; shape is preserved.

        In ``secure`` mode the value is first rounded to the sampler's grid and the noise
        is an exact discrete Gaussian on that grid (see :mod:`fedmem.dp.samplers`).
        The grid is visible in the outputs' low bits, so it must be public:
        ``grid=None`` derives it from ``sigma``, which is right when this record was
        fixed from public parameters (e.g. :meth:`calibrate`); when ``sigma`` or
        ``l2_sensitivity`` depends on private data (a smooth-sensitivity release such
        as BRACE's), pass a ``grid`` (power of two) computed from public parameters.
        """
        x = V.finite_array("value", value)
        if _check_mode(sampling, grid) == "secure":
            return samplers.secure_release(x, self.sigma, rng, kind="gaussian", sensitivity=self.l2_sensitivity,
                                           grid=grid)
        return x + self.noise(x.shape, rng, sampling)


@dataclass(frozen=True)
class LaplaceMechanism:
    """Laplace release ``x + Lap(scale)^d`` for L1 sensitivity; epsilon = l1 / scale."""

    scale: float
    l1_sensitivity: float = 1.0

    def __post_init__(self):
        V.positive("scale", self.scale)
        V.positive("l1_sensitivity", self.l1_sensitivity)

    @classmethod
    def calibrate(cls, epsilon: float, l1_sensitivity: float = 1.0) -> "LaplaceMechanism":
        epsilon = V.positive("epsilon", epsilon)
        l1_sensitivity = V.positive("l1_sensitivity", l1_sensitivity)
        return cls(scale=l1_sensitivity / epsilon, l1_sensitivity=l1_sensitivity)

    @property
    def epsilon(self) -> float:
        return self.l1_sensitivity / self.scale

    def event(self) -> dp_accounting.LaplaceDpEvent:
        return dp_accounting.LaplaceDpEvent(noise_multiplier=self.scale / self.l1_sensitivity)

    def noise(self, shape, rng, sampling: SamplingMode = "secure", *, grid: float | None = None) -> np.ndarray:
        """Noise alone. ``grid`` (secure only): a public power-of-two grid; see :meth:`release`."""
        _check_mode(sampling, grid)
        V.rng_check("rng", rng)
        if sampling == "secure":
            return samplers.secure_laplace(self.scale, shape, rng, grid=grid)
        return samplers.laplace(self.scale, shape, rng)

    def release(self, value, rng, sampling: SamplingMode = "secure", *, grid: float | None = None) -> np.ndarray:
        """Return ``value`` plus Laplace noise (shape preserved).

        ``secure`` mode: as :meth:`GaussianMechanism.release`; ``grid=None`` derives the
        grid from ``scale`` (right only when ``scale`` is public); a scale that depends
        on private data needs an explicit public ``grid`` (power of two).
        """
        x = V.finite_array("value", value)
        if _check_mode(sampling, grid) == "secure":
            return samplers.secure_release(x, self.scale, rng, kind="laplace", sensitivity=self.l1_sensitivity,
                                           grid=grid)
        return x + self.noise(x.shape, rng, sampling)


@dataclass(frozen=True)
class ExponentialMechanism:
    """Exponential mechanism over a finite candidate set (DP-MemView Eq. (7)).

    ``Pr[v] proportional to exp(epsilon * u(v) / (2 * sensitivity))`` where
    ``sensitivity`` bounds the sup-norm change of the utility vector between neighbours
    (Eq. (6)). The selection is epsilon-DP. Only the chosen index is returned.
    """

    epsilon: float
    sensitivity: float

    def __post_init__(self):
        V.positive("epsilon", self.epsilon)
        V.positive("sensitivity", self.sensitivity)

    def log_probabilities(self, utilities) -> np.ndarray:
        u = V.finite_array("utilities", utilities, ndim=1)
        with np.errstate(over="ignore"):
            logits = self.epsilon * u / (2.0 * self.sensitivity)
        if not np.all(np.isfinite(logits)):
            raise ValueError(   # the utilities are private scores: the text carries none of them
                "utilities are too large: epsilon * u / (2 * sensitivity) overflows "
                f"(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r}; the utilities are not reported)."
            ) from None
        # Stable log-softmax (max-shifted log-sum-exp); plain numpy, ~8x faster per call
        # than scipy.special.logsumexp on small candidate sets.
        shifted = logits - np.max(logits)
        return shifted - np.log(np.sum(np.exp(shifted)))

    def probabilities(self, utilities) -> np.ndarray:
        return np.exp(self.log_probabilities(utilities))

    def select(self, utilities, rng) -> int:
        """Sample one index. Numerically stable (log-sum-exp); inverse-CDF on one uniform."""
        V.rng_check("rng", rng)
        p = self.probabilities(utilities)
        if isinstance(rng, np.random.Generator):
            u = rng.random()
        else:
            import torch

            u = float(torch.rand((), generator=rng, dtype=torch.float64))
        cdf = np.cumsum(p)
        idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return min(idx, len(p) - 1)

    def event(self) -> PureDpEvent:
        return PureDpEvent(epsilon=self.epsilon, mechanism="exponential")


@dataclass(frozen=True)
class MetricLaplace:
    """Metric-DP multivariate Laplace in R^d: density proportional to exp(-epsilon * ||z||_2).

    Sampled as radius ~ Gamma(shape=d, scale=1/epsilon) times a direction uniform on the
    unit sphere (DP-MIND Sec. 3.1). Adding it to an embedding gives epsilon*d(x, x')
    metric DP: the output density ratio between inputs x and x' is at most
    exp(epsilon * ||x - x'||).
    """

    epsilon: float
    dim: int

    def __post_init__(self):
        V.positive("epsilon", self.epsilon)
        V.positive_int("dim", self.dim)

    def sample(self, rng, n: int | None = None) -> np.ndarray:
        """``n`` draws of shape (n, dim), or one of shape (dim,) when ``n`` is None."""
        V.rng_check("rng", rng)
        count = 1 if n is None else V.positive_int("n", n)
        if isinstance(rng, np.random.Generator):
            direction = rng.standard_normal((count, self.dim))
            radius = rng.gamma(shape=float(self.dim), scale=1.0 / self.epsilon, size=(count, 1))
        else:
            import torch

            direction = torch.randn((count, self.dim), generator=rng, dtype=torch.float64).numpy()
            # torch's Gamma sampler takes no generator: draw the radius by the inverse
            # CDF of uniforms taken from the injected generator.
            u = torch.rand((count, 1), generator=rng, dtype=torch.float64).numpy()
            from scipy.stats import gamma as _gamma_dist   # lazy: scipy.stats costs ~1 s of start-up

            radius = _gamma_dist.ppf(u, a=float(self.dim), scale=1.0 / self.epsilon)
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        out = radius * direction
        return out[0] if n is None else out


def replace(record, **changes):
    """``dataclasses.replace`` that re-validates (records are frozen)."""
    return dataclasses.replace(record, **changes)
