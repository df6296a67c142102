"""The one verdict rule (fedmem.attacks.verdict): power, exact channels, known-eps mechanisms."""

import math

import numpy as np
import pytest

from fedmem.attacks import verdict as VD
from fedmem.attacks.verdict import judge, judge_counts, separation_pvalue


def _rr(eps, n, rng):
    """Randomized response with known eps: scores of both worlds."""
    p = math.exp(eps) / (1 + math.exp(eps))
    return (rng.random(n) < p).astype(float), (rng.random(n) < 1 - p).astype(float)


def test_known_eps_mechanism_within_booked_and_underbooked_variant_caught():
    rng = np.random.default_rng(3)
    pos, neg = _rr(1.0, 6000, rng)
    v = judge(pos, neg, 1.0)
    assert v.label == "within booked" and v.power >= 1.0 and 0.6 < v.eps_lower <= 1.0, v
    assert v.text.startswith("within booked")
    # broken variant: the same mechanism booked at half its epsilon -> the SAME test flags it
    bad = judge(pos, neg, 0.5)
    assert bad.label == "LEAK" and bad.eps_lower > 0.5, bad


def test_exact_channel_small_n_is_leak():
    rng = np.random.default_rng(0)
    pos, neg = 1.0 + rng.random(20), rng.random(20)       # AUC 1.0, n = 20
    assert judge(pos, neg, 0.0).label == "LEAK"
    v = judge(pos, neg, 2.0)                              # CP alone proves < 1 with 10 held-out trials
    assert v.eps_lower < 2.0 and v.ceiling_crossed and v.label == "LEAK", v
    # 800 trials per world: CP proves at most ~4.7, the ceiling test says LEAK at 4.25 and 6
    pos, neg = 1.0 + rng.random(800), rng.random(800)
    for booked in (4.25, 6.0):
        v = judge(pos, neg, booked)
        assert v.label == "LEAK" and v.ceiling_crossed, v


def test_no_power_says_so():
    rng = np.random.default_rng(1)
    pos, neg = rng.random(20), rng.random(20)
    v = judge(pos, neg, 4.25)
    assert v.label == "no leak seen" and v.power < 4.25
    assert v.text == f"no leak seen (power {v.power:.2f} < 4.25 booked)"
    v = judge(pos, neg, math.inf)
    assert v.label == "no leak seen" and not v.ceiling_crossed and "nothing claimed" in v.text


def test_separation_pvalue_matches_permutation_and_is_monotone():
    assert separation_pvalue(20, 20, 0.0) == pytest.approx(1 / math.comb(40, 20), rel=1e-3)
    ps = [separation_pvalue(100, 100, e) for e in (0.5, 1, 2, 4, 8)]
    assert all(a <= b for a, b in zip(ps, ps[1:]))
    # the bound is valid: randomized response at eps (the extreme mechanism) separates with prob p^(n+m)
    e = 3.0
    p = math.exp(e) / (1 + math.exp(e))
    assert separation_pvalue(30, 30, e) >= p ** 60


def test_separation_test_holds_its_level_on_a_dp_mechanism():
    # Laplace(1/eps) on a sensitivity-1 query: a true eps-DP mechanism is never LEAK (seeded)
    rng = np.random.default_rng(5)
    eps = 2.0
    leaks = 0
    for _ in range(40):
        pos, neg = 1 + rng.laplace(0, 1 / eps, 30), rng.laplace(0, 1 / eps, 30)
        leaks += judge(pos, neg, eps).label == "LEAK"
    assert leaks <= 6


def test_counts_and_dict():
    v = judge_counts(600, 600, 0, 600, 4.25)
    assert v.label == "LEAK" and round(v.eps_lower, 2) == 5.09
    d = v.as_dict()
    assert set(d) >= {"label", "eps_lower", "eps_booked", "delta_booked", "power", "ceiling_crossed", "text"}
    assert VD.worst([v, judge_counts(1, 10, 1, 10, 9.0)]) == "LEAK"
    with pytest.raises(ValueError, match="eps_booked"):
        judge_counts(1, 2, 1, 2, -1.0)


def test_sampler_label():
    assert VD.sampler_label("fast") == "not DP (float sampler)"
    assert VD.sampler_label("secure") is None
