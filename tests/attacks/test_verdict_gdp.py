"""fedmem.attacks.verdict with a Gaussian-only booking: the whole-ROC GDP test (mu_booked).

The mechanism is the deployed secure Gaussian sampler on neighbouring inputs (0 and the
sensitivity 1), booked as its exact GDP mu (fedmem.dp.events.gaussian_mu of its event). The same
test runs the honest release and a broken one (half the noise, booked as if it had the full
noise): the honest one must come out "within booked" in every seed, the broken one LEAK in every
seed. Power at these sizes (800 trials per world, 3 seeds): the broken release's true mu is
1.67 vs 0.83 booked, and gdp_audit's mu_lower for it had median 1.13 over 20 seeds of a
normal-shift check (LEAK in 20 of 20, where Clopper-Pearson alone said "within booked" in 20 of
20); a false LEAK of the honest release needs mu_lower > mu_booked, probability <= alpha = 0.05
per seed. Fixed seeds: deterministic.
"""

import dp_accounting
import numpy as np
import pytest

from fedmem.attacks.tight import gdp_audit, gdp_power
from fedmem.attacks.verdict import LEAK, WITHIN, judge
from fedmem.dp.events import gaussian_mu
from fedmem.dp.samplers import secure_gaussian

SIGMA = 1.2           # papers/003's setting: books eps 4.25 per release at delta 1e-6 (RDP)
N = 800


def _worlds(sigma: float, seed: int):
    rng = np.random.default_rng(seed)
    pos = 1.0 + secure_gaussian(sigma, N, rng)        # the neighbour with the record: sum shifted by 1
    neg = 0.0 + secure_gaussian(sigma, N, rng)
    return pos, neg


@pytest.mark.parametrize("noise_factor, want", [(1.0, WITHIN), (0.5, LEAK)], ids=["honest", "half-noise"])
def test_gdp_verdict_within_for_the_booked_gaussian_and_catches_half_noise(noise_factor, want):
    mu_booked = gaussian_mu(dp_accounting.GaussianDpEvent(SIGMA))
    assert mu_booked == pytest.approx(1 / SIGMA)
    for seed in range(3):
        pos, neg = _worlds(SIGMA * noise_factor, seed)
        v = judge(pos, neg, 4.25, 1e-6, rng=np.random.default_rng(1000 + seed), mu_booked=mu_booked)
        assert v.label == want, (seed, v.text)
        assert v.mu_booked == pytest.approx(mu_booked) and v.mu_power == pytest.approx(gdp_power(N, N))
        if want == WITHIN:
            assert v.mu_lower <= mu_booked
        else:
            assert v.mu_lower > mu_booked and "GDP" in v.text


def test_gdp_adds_power_where_clopper_pearson_has_none():
    """The same half-noise release judged without mu_booked: Clopper-Pearson's best held-out bound
    stays under the booked eps 4.25, so it would have reported the broken release within booked."""
    pos, neg = _worlds(SIGMA / 2, 0)
    cp_only = judge(pos, neg, 4.25, 1e-6, rng=np.random.default_rng(1000))
    both = judge(pos, neg, 4.25, 1e-6, rng=np.random.default_rng(1000), mu_booked=1 / SIGMA)
    assert cp_only.label != LEAK and both.label == LEAK
    # the GDP test draws from a child generator: the Clopper-Pearson numbers are the same with it
    assert (cp_only.eps_lower, cp_only.power, cp_only.ceiling_crossed) == \
        (both.eps_lower, both.power, both.ceiling_crossed)


def test_gdp_power_is_what_a_perfect_attack_reaches():
    pos, neg = np.arange(100.0, 200.0), np.arange(0.0, 100.0)
    est = gdp_audit(pos, neg, delta=1e-6, rng=np.random.default_rng(0))
    assert est.details["mu_lower"] == pytest.approx(gdp_power(100, 100))


def test_mu_booked_is_checked():
    pos, neg = _worlds(SIGMA, 0)
    with pytest.raises(ValueError, match="mu_booked"):
        judge(pos, neg, 4.25, 1e-6, mu_booked=-1.0)
