"""Tests of fedmem.attacks.audit: exact values, coverage, and both sides of each bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, norm
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from fedmem.attacks.audit import (
    auc_ci,
    clopper_pearson,
    dp_roc_ceiling,
    epsilon_lower_bound,
    histogram_epsilon_lower_bound,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)


# ------------------------------------------------------------------ Clopper-Pearson
def test_clopper_pearson_reference_values():
    # R: binom.test(5, 10)$conf.int -> 0.1870860 0.8129140
    lo, hi = clopper_pearson(5, 10)
    assert lo == pytest.approx(0.1870860, abs=1e-6)
    assert hi == pytest.approx(0.8129140, abs=1e-6)
    # k = 0 and k = n have closed forms: 1 - (alpha/2)^(1/n) and (alpha/2)^(1/n).
    assert clopper_pearson(0, 10) == (0.0, pytest.approx(1 - 0.025 ** 0.1))
    assert clopper_pearson(10, 10) == (pytest.approx(0.025 ** 0.1), 1.0)


@pytest.mark.parametrize("p", [0.01, 0.2, 0.5, 0.93])
def test_clopper_pearson_exact_coverage(p):
    """Coverage computed exactly over the binomial law (no sampling): >= 1 - alpha."""
    n, alpha = 60, 0.05
    covered = 0.0
    for k in range(n + 1):
        lo, hi = clopper_pearson(k, n, alpha)
        if lo <= p <= hi:
            covered += binom.pmf(k, n, p)
    assert covered >= 1 - alpha


@pytest.mark.parametrize("args, name", [((-1, 5), "k"), ((6, 5), "k"), ((1, 0), "n"), ((1, 5, 0.0), "alpha"),
                                        ((1, 5, 1.5), "alpha")])
def test_clopper_pearson_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        clopper_pearson(*args)


def test_clopper_pearson_rejects_non_integer():
    with pytest.raises(TypeError, match="k"):
        clopper_pearson(1.5, 5)


# -------------------------------------------------------------- epsilon lower bound
def test_epsilon_lower_bound_randomized_response():
    """Randomized response with eps=1: the bound is close to, and below, the truth."""
    eps = 1.0
    p = math.exp(eps) / (1 + math.exp(eps))
    n = 200_000
    rng = np.random.default_rng(1)
    tp = int(rng.binomial(n, p))
    fp = int(rng.binomial(n, 1 - p))
    lb = epsilon_lower_bound(tp, n, fp, n)
    assert 0.95 * eps < lb <= eps


def test_epsilon_lower_bound_flags_larger_epsilon():
    """Counts from an eps=2 mechanism give a bound above 1.5, refuting a claim of eps=1."""
    p = math.exp(2.0) / (1 + math.exp(2.0))
    n = 50_000
    lb = epsilon_lower_bound(round(n * p), n, round(n * (1 - p)), n)
    assert lb > 1.5


def test_epsilon_lower_bound_uses_both_tails_and_delta():
    # Complement test: high TNR, low FNR carries the evidence.
    lb_compl = epsilon_lower_bound(990, 1000, 500, 1000)
    assert lb_compl == pytest.approx(math.log((1 - clopper_pearson(500, 1000)[1]) / (1 - clopper_pearson(990, 1000)[0])))
    assert lb_compl > 3.0
    # A larger delta can only lower the bound.
    assert epsilon_lower_bound(900, 1000, 50, 1000, delta=0.1) < epsilon_lower_bound(900, 1000, 50, 1000)
    # A useless test (TPR = FPR) proves nothing.
    assert epsilon_lower_bound(500, 1000, 500, 1000) == 0.0


def test_epsilon_lower_bound_rejects_bad_input():
    with pytest.raises(ValueError, match="tp"):
        epsilon_lower_bound(11, 10, 0, 10)
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(5, 10, 0, 10, delta=1.0)
    with pytest.raises(ValueError, match="n_neg"):
        epsilon_lower_bound(5, 10, 0, 0)


# ----------------------------------------------------------------------------- ROC
def _normal_scores(seed=3, n=800, mu=1.0):
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1, n), rng.normal(0, 1, n)


def test_roc_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(2)
    pos = rng.integers(0, 5, 300).astype(float)
    neg = rng.integers(0, 4, 200).astype(float)
    ref = roc_auc_score(np.r_[np.ones(300), np.zeros(200)], np.r_[pos, neg])
    assert roc_auc(pos, neg) == pytest.approx(ref, abs=1e-12)
    big_p, big_n = rng.integers(0, 50, 1200).astype(float), rng.normal(20, 9, 1000).round()   # > 10^6 pairs: ranks
    ref = roc_auc_score(np.r_[np.ones(1200), np.zeros(1000)], np.r_[big_p, big_n])
    assert roc_auc(big_p, big_n) == pytest.approx(ref, abs=1e-12)
    assert roc_auc([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert roc_auc([0.0], [1.0]) == 0.0
    assert roc_auc([1.0, 1.0], [1.0]) == 0.5


def test_roc_curve_matches_sklearn():
    pos, neg = _normal_scores()
    pos = np.round(pos, 1)  # create ties
    neg = np.round(neg, 1)
    f, t = roc_curve(pos, neg)
    rf, rt, _ = sk_roc_curve(np.r_[np.ones(pos.size), np.zeros(neg.size)], np.r_[pos, neg],
                             drop_intermediate=False)
    np.testing.assert_allclose(f, rf)
    np.testing.assert_allclose(t, rt)
    assert f[0] == t[0] == 0.0 and f[-1] == t[-1] == 1.0
    # Trapezoid area under our curve equals the Mann-Whitney AUC.
    assert np.trapezoid(t, f) == pytest.approx(roc_auc(pos, neg), abs=1e-12)


def test_auc_ci_covers_true_auc_and_is_reproducible():
    pos, neg = _normal_scores()
    true_auc = norm.cdf(1.0 / math.sqrt(2))
    lo, hi = auc_ci(pos, neg, rng=np.random.default_rng(5), n_boot=300)
    assert lo < roc_auc(pos, neg) < hi
    assert lo < true_auc < hi
    assert hi - lo < 0.08
    assert auc_ci(pos, neg, n_boot=50) == auc_ci(pos, neg, n_boot=50)
    with pytest.raises(TypeError, match="rng"):
        auc_ci(pos, neg, rng=42)


def test_tpr_at_fpr_small_example():
    pos = [0.9, 0.8, 0.7, 0.3]
    neg = [0.85, 0.2, 0.1, 0.05]
    assert tpr_at_fpr(pos, neg, 0.0) == 0.25     # only "score >= 0.9"
    assert tpr_at_fpr(pos, neg, 0.24) == 0.25
    assert tpr_at_fpr(pos, neg, 0.25) == 1.0     # "score >= 0.3" has FPR 1/4
    assert tpr_at_fpr(pos, neg, 0.5) == 1.0
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr(pos, neg, 1.5)


def test_tpr_at_fpr_near_analytic_value():
    pos, neg = _normal_scores(n=20_000)
    analytic = 1 - norm.cdf(norm.ppf(0.95) - 1.0)
    assert tpr_at_fpr(pos, neg, 0.05) == pytest.approx(analytic, abs=0.02)


def test_scores_must_be_finite_1d():
    with pytest.raises(ValueError, match="pos"):
        roc_auc([1.0, math.nan], [0.0])
    with pytest.raises(ValueError, match="neg_scores"):
        roc_auc([1.0], [[0.0]])


# -------------------------------------------------------------------- ROC ceiling
def test_dp_roc_ceiling_values():
    assert dp_roc_ceiling(0.3, 0.0) == pytest.approx(0.3)
    assert dp_roc_ceiling(0.05, 1.0) == pytest.approx(math.e * 0.05)
    assert dp_roc_ceiling(0.9, 1.0) == pytest.approx(1 - math.exp(-1) * 0.1)
    assert dp_roc_ceiling(0.0, 1.0, 0.01) == pytest.approx(0.01)
    np.testing.assert_allclose(dp_roc_ceiling(np.array([0.0, 1.0]), 3.0, 0.2), [0.2, 1.0])


def test_laplace_mechanism_roc_lies_under_ceiling():
    """The exact ROC of Lap(1/eps) shifted by 1 touches but never crosses the eps ceiling."""
    eps = 0.7
    t = np.linspace(-5, 6, 400)
    from scipy.stats import laplace

    fpr = laplace.sf(t, loc=0, scale=1 / eps)
    tpr = laplace.sf(t, loc=1, scale=1 / eps)
    ceil = dp_roc_ceiling(fpr, eps)
    assert np.all(tpr <= ceil + 1e-12)
    assert np.max(ceil - tpr) > 0 and np.min(ceil - tpr) < 1e-9
    # ...and a ceiling at a smaller epsilon is crossed: the tool can fail.
    assert np.any(tpr > dp_roc_ceiling(fpr, 0.5 * eps) + 1e-3)


def test_dp_roc_ceiling_rejects_bad_input():
    with pytest.raises(ValueError, match="fpr"):
        dp_roc_ceiling(1.2, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        dp_roc_ceiling(0.1, -1.0)


# -------------------------------------------------------------- histogram tester
EDGES = np.linspace(-5, 6, 45)


@pytest.fixture(scope="module")
def laplace_samples():
    rng = np.random.default_rng(11)
    n = 100_000
    return {
        "a": rng.laplace(0, 1.0, n), "b": rng.laplace(1, 1.0, n),
        "a_half": rng.laplace(0, 0.5, n), "b_half": rng.laplace(1, 0.5, n),
    }


def test_histogram_bound_correct_laplace_stays_below_epsilon(laplace_samples):
    s = laplace_samples
    for x, y in (("a", "b"), ("b", "a")):
        lb = histogram_epsilon_lower_bound(s[x], s[y], EDGES)
        assert 0.8 < lb <= 1.0


def test_histogram_bound_flags_halved_noise(laplace_samples):
    s = laplace_samples
    assert histogram_epsilon_lower_bound(s["a_half"], s["b_half"], EDGES) > 1.6


def test_histogram_bound_identical_distributions_prove_nothing():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=20_000), rng.normal(size=20_000)
    assert histogram_epsilon_lower_bound(a, b, np.linspace(-3, 3, 31)) < 0.1


def test_histogram_bound_delta_lowers_bound(laplace_samples):
    s = laplace_samples
    assert (histogram_epsilon_lower_bound(s["a_half"], s["b_half"], EDGES, delta=0.05)
            < histogram_epsilon_lower_bound(s["a_half"], s["b_half"], EDGES))


def test_histogram_bound_rejects_bad_edges():
    with pytest.raises(ValueError, match="edges"):
        histogram_epsilon_lower_bound([0.0], [1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="alpha"):
        histogram_epsilon_lower_bound([0.0], [1.0], [0.0, 1.0], alpha=0.0)


# ------------------------------------- library replacements agree with the old formulas
# The hand-written implementations these functions had before they moved to scipy /
# scikit-learn, kept verbatim as references.
def _old_clopper_pearson(k, n, alpha=0.05):
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _old_roc_curve(p, n):
    scores = np.concatenate([p, n])
    labels = np.concatenate([np.ones(p.size), np.zeros(n.size)])
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    last_of_block = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
    tps = np.cumsum(y)[last_of_block]
    fps = (last_of_block + 1) - tps
    return np.r_[0.0, fps / n.size], np.r_[0.0, tps / p.size]


def _old_roc_auc(p, n):
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([p, n]))
    r_pos = float(np.sum(ranks[: p.size]))
    return (r_pos - p.size * (p.size + 1) / 2.0) / (p.size * n.size)


def _old_auc_ci(p, n, alpha, rng, n_boot):
    stats = np.empty(n_boot)
    for b in range(n_boot):
        stats[b] = _old_roc_auc(p[rng.integers(0, p.size, p.size)], n[rng.integers(0, n.size, n.size)])
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _old_histogram_bound(a, b, e, delta=0.0, alpha=1e-3):
    from scipy.stats import beta

    def event_counts(x):
        below = np.searchsorted(np.sort(x), e, side="left")
        return np.concatenate([np.diff(below), below, x.size - below])

    ka, kb = event_counts(a), event_counts(b)
    level = alpha / ka.size
    lo_a = np.where(ka == 0, 0.0, beta.ppf(level / 2, np.maximum(ka, 1), a.size - ka + 1))
    hi_b = np.where(kb == b.size, 1.0, beta.ppf(1 - level / 2, kb + 1, np.maximum(b.size - kb, 1)))
    top = lo_a - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.where(top > 0, np.log(np.maximum(top, 1e-300) / hi_b), -np.inf)
    return max(0.0, float(np.max(bounds)))


def _random_scores(rng):
    """Continuous, heavily tied (rounded) or tiny samples, with a random shift."""
    n_pos, n_neg = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    p, n = rng.normal(rng.uniform(0, 2), 1, n_pos), rng.normal(0, 1, n_neg)
    if rng.random() < 0.5:
        p, n = np.round(p * 2) / 2, np.round(n * 2) / 2
    return p, n


def test_library_replacements_agree_with_old_formulas():
    rng = np.random.default_rng(20260311)
    for _ in range(200):
        n = int(rng.integers(1, 100_000))
        k = int(rng.choice([0, n, rng.integers(0, n + 1)]))
        alpha = float(10 ** rng.uniform(-9, -0.5))
        np.testing.assert_allclose(clopper_pearson(k, n, alpha), _old_clopper_pearson(k, n, alpha),
                                   rtol=1e-12, atol=0)
    for _ in range(100):
        p, n = _random_scores(rng)
        f_new, t_new = roc_curve(p, n)
        f_old, t_old = _old_roc_curve(p, n)
        assert f_new.shape == f_old.shape
        np.testing.assert_allclose(f_new, f_old, rtol=0, atol=1e-12)
        np.testing.assert_allclose(t_new, t_old, rtol=0, atol=1e-12)
        assert abs(roc_auc(p, n) - _old_roc_auc(p, n)) <= 1e-12
        for target in (0.0, 0.01, 0.05, 0.5):
            ok = f_old <= target + 1e-12
            assert tpr_at_fpr(p, n, target) == float(np.max(t_old[ok]))
        edges = np.linspace(-3, 3, int(rng.integers(2, 40)))
        delta = float(rng.choice([0.0, 1e-4]))
        assert abs(histogram_epsilon_lower_bound(p, n, edges, delta) - _old_histogram_bound(p, n, edges, delta)) \
            <= 1e-12
    for _ in range(5):
        p, n = _random_scores(rng)
        seed = int(rng.integers(1 << 31))
        new = auc_ci(p, n, alpha=0.1, rng=np.random.default_rng(seed), n_boot=200)
        old = _old_auc_ci(p, n, 0.1, np.random.default_rng(seed), 200)
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-12)
