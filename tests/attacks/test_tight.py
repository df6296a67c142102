"""Power tests of the tight-audit estimators (fedmem.attacks.tight).

Each estimator is run on a mechanism whose epsilon is known exactly (a Gaussian or
Laplace release with known noise, sampled with a fixed seed). The SAME test function is
run on the correct mechanism and on a broken variant (half the noise, booked as the
correct one): for the correct one the lower bound must stay below the true epsilon AND
reach a stated tightness; for the broken one it must exceed what is booked. A test of
an estimator that could not fail on the broken variant would be a defect.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from fedmem.attacks import tight as T
from fedmem.dp import GaussianMechanism

DELTA = 1e-6


def _gaussian_sigma(eps: float) -> float:
    return GaussianMechanism.calibrate(eps, DELTA).noise_multiplier


# ------------------------------------------------------------------ GDP algebra
def test_gdp_dual_is_the_analytic_gaussian():
    for sigma in (0.5, 1.0, 1.1935, 3.0):
        g = GaussianMechanism.from_noise_multiplier(sigma)
        assert T.gdp_epsilon(1.0 / sigma, DELTA) == pytest.approx(g.epsilon(DELTA), rel=1e-7)
    assert T.gdp_mu(4.0, DELTA) == pytest.approx(1.0 / _gaussian_sigma(4.0), rel=1e-7)
    assert T.gdp_epsilon(0.0, DELTA) == 0.0


def test_gdp_tradeoff_and_delta_shapes():
    a = np.linspace(0, 1, 11)
    f = T.gdp_tradeoff(a, 1.0)
    assert np.all(np.diff(f) <= 0) and f[0] == pytest.approx(1.0) and f[-1] == pytest.approx(0.0)
    assert T.gdp_tradeoff(a, 0.0) == pytest.approx(1 - a)
    ds = [T.gdp_delta(e, 1.0) for e in (0.0, 0.5, 1.0, 2.0)]
    assert all(x > y for x, y in zip(ds, ds[1:]))


def test_invalid_parameters_name_the_parameter():
    with pytest.raises(ValueError, match="mu"):
        T.gdp_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="delta"):
        T.gdp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError, match="v <= r <= m"):
        T.one_run_p_value(10, 5, 6, 1.0, 0.0)
    with pytest.raises(TypeError, match="rng"):
        T.gdp_audit(np.zeros(10), np.ones(10), delta=DELTA, rng=None)
    with pytest.raises(ValueError, match="included"):
        T.one_run_audit(np.zeros(10), np.zeros(10), delta=DELTA)


def test_one_run_p_value_is_the_binomial_tail_at_delta_zero():
    q = 1 / (1 + math.exp(-1.5))
    assert T.one_run_p_value(1000, 100, 80, 1.5, 0.0) == pytest.approx(binom.sf(79, 100, q), rel=1e-12)
    # delta only adds: the p-value grows with delta and m
    assert T.one_run_p_value(1000, 100, 80, 1.5, 1e-4) > T.one_run_p_value(1000, 100, 80, 1.5, 0.0)
    # the bound is the largest eps with p-value < alpha
    e = T.one_run_epsilon_lower_bound(1000, 100, 95, delta=1e-6, alpha=0.05)
    assert T.one_run_p_value(1000, 100, 95, e, 1e-6) < 0.05 <= T.one_run_p_value(1000, 100, 95, e + 1e-3, 1e-6)


# ------------------------------------------------------------------ power: one test, correct and broken
def _gaussian_worlds(sigma, n, rng):
    """Likelihood-ratio scores of a sensitivity-1 Gaussian release: the released value itself."""
    return rng.normal(1.0, sigma, n), rng.normal(0.0, sigma, n)


def _laplace_worlds(scale, n, rng):
    return rng.laplace(1.0, scale, n), rng.laplace(0.0, scale, n)


CASES = {
    # name: (booked eps, world sampler(noise factor), estimator, trials per world, tightness required)
    "gdp_gaussian": (4.0, lambda f, rng: _gaussian_worlds(_gaussian_sigma(4.0) * f, 200_000, rng),
                     lambda p, n, rng: T.gdp_audit(p, n, delta=DELTA, rng=rng), 0.8),
    "cp_laplace": (4.0, lambda f, rng: _laplace_worlds(0.25 * f, 50_000, rng),
                   lambda p, n, rng: T.preregistered_threshold_bound(p, n, delta=0.0, rng=rng), 0.9),
    "cp_gaussian": (4.0, lambda f, rng: _gaussian_worlds(_gaussian_sigma(4.0) * f, 200_000, rng),
                    lambda p, n, rng: T.preregistered_threshold_bound(p, n, delta=DELTA, rng=rng), 0.5),
}


@pytest.mark.parametrize("broken", [False, True], ids=["correct", "half_noise"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_estimator_recovers_known_epsilon_and_catches_half_noise(case, broken):
    booked, worlds, estimate, level = CASES[case]
    rng = np.random.default_rng(20)
    pos, neg = worlds(0.5 if broken else 1.0, rng)
    est = estimate(pos, neg, rng)
    caught = est.eps_lower > booked
    assert caught == broken, (case, broken, est)
    if not broken:   # valid (below the truth) and tight
        assert est.eps_lower <= booked
        assert T.tightness(est.eps_lower, booked) >= level, est


@pytest.mark.parametrize("broken", [False, True], ids=["correct", "half_noise"])
def test_one_run_audit_recovers_known_epsilon_and_catches_half_noise(broken):
    booked = 2.0
    sigma = _gaussian_sigma(booked) * (0.5 if broken else 1.0)
    rng = np.random.default_rng(21)
    m = 100_000
    inc = rng.random(m) < 0.5
    scores = inc * 1.0 + rng.normal(0.0, sigma, m)
    est = T.one_run_audit(scores, inc, delta=DELTA, guesses=((100, 100), (300, 300), (1000, 1000), (3000, 3000)))
    assert (est.eps_lower > booked) == broken, est
    if not broken:
        assert est.eps_lower <= booked and T.tightness(est.eps_lower, booked) >= 0.45, est


def test_gdp_lower_bound_has_its_coverage():
    """At a small sample the bound is noisy; it must still stay below the true epsilon in
    about 1 - alpha of independent repeats (alpha = 0.05; allow 10 of 100)."""
    rng = np.random.default_rng(22)
    sigma = _gaussian_sigma(2.0)
    above = 0
    for _ in range(100):
        pos, neg = _gaussian_worlds(sigma, 2000, rng)
        above += T.gdp_audit(pos, neg, delta=DELTA, rng=rng).eps_lower > 2.0
    assert above <= 10


def test_preregistered_bound_has_its_coverage():
    rng = np.random.default_rng(23)
    above = 0
    for _ in range(100):
        pos, neg = _laplace_worlds(0.5, 2000, rng)
        above += T.preregistered_threshold_bound(pos, neg, rng=rng).eps_lower > 2.0
    assert above <= 10


def test_tightness():
    assert T.tightness(2.0, 4.0) == 0.5
    assert T.tightness(0.0, 0.0) == 0.0
    assert T.tightness(1.0, 0.0) == math.inf
