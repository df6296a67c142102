"""Sampler distribution tests (KS / chi-square at alpha = 1e-6, fixed seeds).

After OpenDP's ``rust/src/traits/samplers/test.rs``: each sampler is drawn many times
from an injected generator and compared with its exact law; a wrong law fails by many
orders of magnitude, a correct one passes except with probability 1e-6. Both numpy and
torch generators are exercised.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from fedmem.dp import ExponentialMechanism, GaussianMechanism, LaplaceMechanism, MetricLaplace
from fedmem.dp import samplers

ALPHA = 1e-6


def np_rng(seed=0):
    return np.random.default_rng(seed)


def torch_rng(seed=0):
    return torch.Generator().manual_seed(seed)


RNGS = {"numpy": np_rng, "torch": torch_rng}


def chi2_pvalue(counts: dict, pmf: dict) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    n = sum(counts.values())
    keys = sorted(pmf)
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for k in keys:
        e = n * pmf[k]
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            pool_o += counts.get(k, 0)
            pool_e += e
    pool_o += sum(c for k, c in counts.items() if k not in pmf)
    pool_e += n * max(0.0, 1.0 - sum(pmf.values()))
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp = np.array(exp) * (sum(obs) / sum(exp))
    return float(stats.chisquare(obs, exp).pvalue)


def tally(values) -> dict:
    vals, cnt = np.unique(np.asarray(values), return_counts=True)
    return {int(v): int(c) for v, c in zip(vals, cnt)}


# ------------------------------------------------------------------- fast samplers
@pytest.mark.parametrize("which", RNGS)
def test_fast_gaussian_matches_normal(which):
    x = GaussianMechanism(sigma=2.5).noise((4000, 5), RNGS[which](1), sampling="fast")
    assert x.shape == (4000, 5)
    assert stats.kstest(x.ravel(), stats.norm(0, 2.5).cdf).pvalue > ALPHA


@pytest.mark.parametrize("which", RNGS)
def test_fast_laplace_matches_laplace(which):
    x = LaplaceMechanism(scale=0.7).noise(20_000, RNGS[which](2), sampling="fast")
    assert stats.kstest(x, stats.laplace(0, 0.7).cdf).pvalue > ALPHA


def test_fast_sampler_detects_wrong_scale():
    """The same KS check rejects a sampler at 10% too little noise (the test has power)."""
    x = GaussianMechanism(sigma=2.25).noise(20_000, np_rng(3), sampling="fast")
    assert stats.kstest(x, stats.norm(0, 2.5).cdf).pvalue < ALPHA


# ------------------------------------------------------------ exact discrete cores
def _dlap_pmf(scale: float, lim: int) -> dict:
    p = math.exp(-1.0 / scale)
    return {y: (1 - p) / (1 + p) * p ** abs(y) for y in range(-lim, lim + 1)}


def _dgauss_pmf(sigma2: float, lim: int) -> dict:
    w = {y: math.exp(-y * y / (2 * sigma2)) for y in range(-lim, lim + 1)}
    z = sum(w.values())
    return {y: v / z for y, v in w.items()}


@pytest.mark.parametrize("which", RNGS)
@pytest.mark.parametrize("gamma", [Fraction(3, 10), Fraction(1), Fraction(27, 10)])
def test_bernoulli_exp(which, gamma):
    bits = samplers._Bits(RNGS[which](4))
    n = 6000 if which == "numpy" else 2000
    k = sum(samplers._bernoulli_exp(gamma, bits) for _ in range(n))
    assert stats.binomtest(k, n, math.exp(-float(gamma))).pvalue > ALPHA


def test_uniform_bits_below_non_power_of_two():
    bits = samplers._Bits(np_rng(5))
    counts = tally([bits.below(7) for _ in range(7000)])
    assert set(counts) == set(range(7))
    assert chi2_pvalue(counts, {i: 1 / 7 for i in range(7)}) > ALPHA


@pytest.mark.parametrize("which", RNGS)
def test_discrete_laplace_pmf(which):
    bits = samplers._Bits(RNGS[which](6))
    n = 8000 if which == "numpy" else 3000
    draws = [samplers._discrete_laplace(2, 3, bits) for _ in range(n)]  # scale t/s = 1.5
    assert chi2_pvalue(tally(draws), _dlap_pmf(1.5, 30)) > ALPHA


@pytest.mark.parametrize("which", RNGS)
def test_discrete_gaussian_pmf(which):
    bits = samplers._Bits(RNGS[which](7))
    n = 8000 if which == "numpy" else 3000
    draws = [samplers._discrete_gaussian(Fraction(5, 2), bits) for _ in range(n)]
    assert chi2_pvalue(tally(draws), _dgauss_pmf(2.5, 20)) > ALPHA


def test_discrete_gaussian_chi2_has_power():
    """sigma^2 = 2 draws fail against the sigma^2 = 2.5 law: the chi-square check can fail."""
    bits = samplers._Bits(np_rng(8))
    draws = [samplers._discrete_gaussian(Fraction(2), bits) for _ in range(8000)]
    assert chi2_pvalue(tally(draws), _dgauss_pmf(2.5, 20)) < ALPHA


# ------------------------------------------------------------ secure, full scale
@pytest.mark.parametrize("which", RNGS)
def test_secure_gaussian_matches_normal(which):
    x = GaussianMechanism(sigma=3.0).noise(3000, RNGS[which](9), sampling="secure")
    # The grid step is 3 * 2**-21 < 1e-6: indistinguishable from N(0, 9) by KS at this n.
    assert stats.kstest(x, stats.norm(0, 3.0).cdf).pvalue > ALPHA


@pytest.mark.parametrize("which", RNGS)
def test_secure_laplace_matches_laplace(which):
    x = LaplaceMechanism(scale=0.3).noise(3000, RNGS[which](10), sampling="secure")
    assert stats.kstest(x, stats.laplace(0, 0.3).cdf).pvalue > ALPHA


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_secure_release_outputs_are_exact_grid_points(kind):
    mech = GaussianMechanism(sigma=1.3) if kind == "gaussian" else LaplaceMechanism(scale=1.3)
    x = np_rng(11).normal(size=64) * 100
    out = mech.release(x, np_rng(12), sampling="secure")
    g = samplers.grid_granularity(1.3)
    units = out / g
    assert np.all(units == np.round(units))          # exact integers: no low-order float bits
    assert np.all(np.abs(units) < 2 ** 53)
    assert out.shape == x.shape
    assert np.max(np.abs(out - x)) < 20 * 1.3            # noise of the right size, not garbage


@pytest.mark.parametrize("kind,scale", [("gaussian", 3.0), ("laplace", 0.3)])
@pytest.mark.parametrize("grid_bits", [-30, -6])
def test_secure_noise_on_an_explicit_public_grid_keeps_its_law(kind, scale, grid_bits):
    """With an explicit (public) grid, much finer or much coarser-than-default, the secure
    noise is still the right law (same KS check as above, which rejects a 10% wrong scale)
    and every draw is an exact point of that grid."""
    g = 2.0 ** grid_bits
    if kind == "gaussian":
        x = GaussianMechanism(sigma=scale).noise(3000, np_rng(20), sampling="secure", grid=g)
        law = stats.norm(0, scale)
    else:
        x = LaplaceMechanism(scale=scale).noise(3000, np_rng(21), sampling="secure", grid=g)
        law = stats.laplace(0, scale)
    assert np.all(x / g == np.round(x / g))
    # At g = 2**-6 the lattice is visible to KS only at ~g/scale; 3000 draws cannot see it.
    assert stats.kstest(x, law.cdf).pvalue > ALPHA


def test_secure_release_grid_argument_overrides_scale_grid():
    g = 2.0 ** -12
    out = GaussianMechanism(sigma=1.3).release(np_rng(22).normal(size=64), np_rng(23), sampling="secure", grid=g)
    assert np.all(out / g == np.round(out / g))
    assert not np.all(out / (2 * g) == np.round(out / (2 * g)))   # not confined to a coarser grid
    with pytest.raises(ValueError, match=r"grid must be a power of two.*Found 0.3"):
        samplers.secure_release(np.zeros(2), 1.0, np_rng(), kind="gaussian", sensitivity=1.0, grid=0.3)


def test_secure_release_rejects_values_beyond_exact_range():
    with pytest.raises(ValueError, match="value is too large"):
        GaussianMechanism(sigma=1.0).release([1e12], np_rng(13), sampling="secure")


def test_sampling_mode_is_validated():
    with pytest.raises(ValueError, match="sampling"):
        GaussianMechanism(sigma=1.0).release([0.0], np_rng(), sampling="exact")


@pytest.mark.parametrize("which", RNGS)
def test_samplers_are_deterministic_given_the_generator(which):
    mech = LaplaceMechanism(scale=1.0)
    for mode in ("fast", "secure"):
        a = mech.release(np.zeros(16), RNGS[which](14), sampling=mode)
        b = mech.release(np.zeros(16), RNGS[which](14), sampling=mode)
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------ exponential mechanism
# EM_DRAWS by power: against the 1.2x-epsilon variant of test_em_chi2_has_power the
# chi-square statistic (5 df) has noncentrality n * sum((p' - p)^2 / p) = 106.7 at n = 5000; its
# critical value at ALPHA = 1e-6 is 35.9, so the power is 1 - 2e-6 (was 20,000: 4x the time).
EM_DRAWS = 5000


@pytest.mark.parametrize("which", RNGS)
def test_em_frequencies_match_softmax(which):
    u = np.array([0.0, 1.0, 2.5, -1.0, 0.3, 2.0])
    em = ExponentialMechanism(epsilon=1.7, sensitivity=0.8)
    p = np.exp(1.7 * u / 1.6)
    p /= p.sum()
    np.testing.assert_allclose(em.probabilities(u), p, rtol=1e-12)
    rng = RNGS[which](15)
    counts = tally([em.select(u, rng) for _ in range(EM_DRAWS)])
    assert chi2_pvalue(counts, dict(enumerate(p))) > ALPHA


def test_em_chi2_has_power():
    u = np.array([0.0, 1.0, 2.5, -1.0, 0.3, 2.0])
    wrong = ExponentialMechanism(epsilon=1.7 * 1.2, sensitivity=0.8)
    rng = np_rng(16)
    counts = tally([wrong.select(u, rng) for _ in range(EM_DRAWS)])
    p = ExponentialMechanism(epsilon=1.7, sensitivity=0.8).probabilities(u)
    assert chi2_pvalue(counts, dict(enumerate(p))) < ALPHA


def test_em_is_stable_for_huge_utilities():
    em = ExponentialMechanism(epsilon=1.0, sensitivity=1.0)
    p = em.probabilities([1e300, 1e300 - 1e290, 0.0])
    assert np.all(np.isfinite(p)) and p[0] == pytest.approx(1.0)
    assert em.select([1e6, 0.0], np_rng()) == 0
    with pytest.raises(ValueError, match="utilities are too large"):
        ExponentialMechanism(epsilon=8.0, sensitivity=1.0).probabilities([1e308, 0.0])


# --------------------------------------------------------------- metric-DP Laplace
@pytest.mark.parametrize("which", RNGS)
@pytest.mark.parametrize("dim", [1, 3, 16])
def test_metric_laplace_radius_is_gamma(which, dim):
    eps = 0.8
    z = MetricLaplace(eps, dim).sample(RNGS[which](17), 5000)
    assert z.shape == (5000, dim)
    r = np.linalg.norm(z, axis=1)
    assert stats.kstest(r, stats.gamma(a=dim, scale=1 / eps).cdf).pvalue > ALPHA
    # Power: the radius law of dimension dim - 1 or dim + 1 is rejected.
    assert stats.kstest(r, stats.gamma(a=dim + 1, scale=1 / eps).cdf).pvalue < ALPHA


@pytest.mark.parametrize("which", RNGS)
@pytest.mark.parametrize("dim", [2, 3, 10])
def test_metric_laplace_direction_is_uniform(which, dim):
    """Projection of a uniform unit vector on a fixed axis: (t + 1)/2 ~ Beta((d-1)/2, (d-1)/2)."""
    z = MetricLaplace(1.0, dim).sample(RNGS[which](18), 5000)
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    axis = np.ones(dim) / math.sqrt(dim)
    for t in (u[:, 0], u @ axis):
        law = stats.beta((dim - 1) / 2, (dim - 1) / 2)
        assert stats.kstest((t + 1) / 2, law.cdf).pvalue > ALPHA


def test_metric_laplace_single_draw_shape():
    z = MetricLaplace(1.0, 4).sample(np_rng(19))
    assert z.shape == (4,)


def test_rounding_slack_is_an_upper_bound():
    """The secure release's inflation uses a rational sqrt(d) that is never below sqrt(d)."""
    for d in [1, 2, 3, 4, 5, 127, 128, 10**6, 10**6 + 1, 2**53 - 1]:
        r = samplers._sqrt_up(d)
        assert r * r >= d
        if math.isqrt(d) ** 2 == d:
            assert r * r == d


# ------------------------------------------------- vectorised exact samplers (numpy)
def _dgauss_pmf_ts(t: int, s: int, lim: int) -> dict:
    return _dgauss_pmf((t / s) ** 2, lim)


def _dlap_pmf_ts(t: int, s: int, lim: int) -> dict:
    return _dlap_pmf(t / s, lim)


# (t, s): scale t/s in grid units. Small ones exercise every branch of the integer code
# (y = X // s rounding, the rejected (negative, 0), acceptance exponents >= 1); the last is
# the size the default grid gives (t ~ 2**20, via _scale_ratio).
VEC_RATIOS = [(1, 1), (3, 2), (7, 3), (1, 4), (20, 1)]


@pytest.mark.parametrize("which", RNGS)
@pytest.mark.parametrize("t,s", VEC_RATIOS)
def test_vectorised_discrete_gaussian_is_the_cks_pmf(which, t, s):
    src = samplers._Words(RNGS[which](30))
    y = samplers.discrete_gaussian_ints(t, s, 60_000, src)
    assert y.dtype == np.int64 and y.shape == (60_000,)
    assert chi2_pvalue(tally(y), _dgauss_pmf_ts(t, s, 300)) > ALPHA


@pytest.mark.parametrize("which", RNGS)
@pytest.mark.parametrize("t,s", VEC_RATIOS)
def test_vectorised_discrete_laplace_is_the_cks_pmf(which, t, s):
    src = samplers._Words(RNGS[which](31))
    y = samplers.discrete_laplace_ints(t, s, 60_000, src)
    assert chi2_pvalue(tally(y), _dlap_pmf_ts(t, s, 600)) > ALPHA


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_vectorised_pmf_check_has_power(kind):
    """The same chi-square check rejects a 5% wrong scale (3.15 drawn, 3 claimed)."""
    src = samplers._Words(np_rng(32))
    if kind == "gaussian":
        y = samplers.discrete_gaussian_ints(63, 20, 60_000, src)
        assert chi2_pvalue(tally(y), _dgauss_pmf_ts(3, 1, 300)) < ALPHA
    else:
        y = samplers.discrete_laplace_ints(63, 20, 60_000, src)
        assert chi2_pvalue(tally(y), _dlap_pmf_ts(3, 1, 600)) < ALPHA


def _two_sample_pvalue(a, b) -> float:
    """Chi-square test of homogeneity; cells with fewer than 10 pooled counts are merged."""
    ca, cb = tally(a), tally(b)
    keys = sorted(set(ca) | set(cb))
    rows, pool = [], [0, 0]
    for k in keys:
        x, y = ca.get(k, 0), cb.get(k, 0)
        if x + y >= 10:
            rows.append([x, y])
        else:
            pool[0] += x
            pool[1] += y
    if sum(pool):
        rows.append(pool)
    return float(stats.chi2_contingency(np.array(rows).T)[1])


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_vectorised_matches_the_python_reference(kind):
    """Same law as the original one-draw-at-a-time sampler (engine="python") at the same
    scale: a homogeneity test on 20k draws each."""
    units = Fraction(5, 2)
    a = samplers._discrete_ints(kind, units, 20_000, np_rng(33), engine="python")
    b = samplers._discrete_ints(kind, units, 20_000, np_rng(34))
    assert _two_sample_pvalue(a, b) > ALPHA
    c = samplers._discrete_ints(kind, Fraction(2), 20_000, np_rng(35))   # power: 20% less noise
    assert _two_sample_pvalue(a, c) < ALPHA


def test_exp_table_is_certified():
    """floor(exp(-j) 2**L) agrees with an independent 300-digit decimal computation."""
    import decimal

    ctx = decimal.Context(prec=300)
    for j in [1, 2, 3, 10, 44, 45, 64, 100]:
        for bits in [64, 128, 192]:
            scaled = ctx.multiply(ctx.exp(decimal.Decimal(-j)), decimal.Decimal(2 ** bits))
            ref = int(scaled.to_integral_value(rounding=decimal.ROUND_FLOOR))
            assert samplers._exp_neg_floor(j, bits) == ref, (j, bits)
    assert samplers._exp_neg_floor(0, 64) == 2 ** 64
    table = samplers._table()
    assert table.dtype == np.uint64 and table.size == 64 and int(table[44]) == 0 and int(table[43]) == 1


@pytest.mark.parametrize("j", [1, 3])
def test_tie_on_the_first_digit_reads_further_digits(j):
    """A uniform real whose first base-2**64 digit equals floor(exp(-j) 2**64) is below
    exp(-j) with probability frac(exp(-j) 2**64): the tie path is exact (binomial test)."""
    bits = samplers._Bits(np_rng(36))
    c = samplers._exp_neg_floor(j, 64)
    frac = samplers._exp_neg_floor(j, 128) - (c << 64)      # frac * 2**64
    p = frac / 2 ** 64
    n = 4000
    k = sum(samplers._LazyUniform(c, bits).below_exp_neg(j) for _ in range(n))
    assert stats.binomtest(k, n, p).pvalue > ALPHA


def test_geometric_tie_paths():
    """Words equal to a table entry (or 0) go through the exact digit-by-digit path:
    w = C_1 gives V in {0, 1}; w = 0 (U < 2**-64) gives V >= 44 with P[V >= 45] = exp(-45) 2**64."""
    src = samplers._Words(np_rng(37))
    c1 = samplers._table()[0]
    v = src.geometric_e(np.full(3000, c1, dtype=np.uint64))
    assert set(np.unique(v)) <= {0, 1}
    p1 = (samplers._exp_neg_floor(1, 128) - (int(c1) << 64)) / 2 ** 64
    assert stats.binomtest(int(v.sum()), v.size, p1).pvalue > ALPHA
    v0 = src.geometric_e(np.zeros(2000, dtype=np.uint64))
    assert v0.min() >= 44
    assert stats.binomtest(int((v0 >= 45).sum()), v0.size, math.exp(-45) * 2 ** 64).pvalue > ALPHA
    # and the table path: P[V >= v] = exp(-v)
    w = src.words(200_000)
    vv = src.geometric_e(w)
    for k in (1, 2, 4):
        assert stats.binomtest(int((vv >= k).sum()), vv.size, math.exp(-k)).pvalue > ALPHA


def test_bernoulli_exp_integer_and_fraction():
    src = samplers._Words(np_rng(38))
    n = 100_000
    for j in (0, 1, 2):
        k = int(src.bern_exp_int(np.full(n, j, dtype=np.int64)).sum())
        assert stats.binomtest(k, n, math.exp(-j)).pvalue > ALPHA
    for r, den in ((0, 7), (3, 10), (10, 10), (5, 2 ** 45 + 3)):
        k = int(src.bern_exp_frac(np.full(n, r, dtype=np.int64), den).sum())
        assert stats.binomtest(k, n, math.exp(-r / den)).pvalue > ALPHA


def test_uniform_below_on_bit_fields():
    src = samplers._Words(np_rng(39))
    for n in (2, 3, 6, 7, 1000, 2 ** 40 + 1):
        u = src.below(n, 30_000)
        assert u.min() >= 0 and u.max() < n and u.dtype == np.int64
        if n <= 1000:
            assert chi2_pvalue(tally(u), {i: 1 / n for i in range(n)}) > ALPHA
        else:   # top and bottom half equally likely
            assert stats.binomtest(int((u < n // 2).sum()), u.size, (n // 2) / n).pvalue > ALPHA


def test_python_int_fallbacks_keep_the_law(monkeypatch):
    """Forced onto the exact Python-int paths (a tiny vectorisation limit), the law is unchanged:
    first the Gaussian acceptance alone on Python ints (very fine explicit grids), then
    the whole one-draw-at-a-time reference."""
    monkeypatch.setattr(samplers, "_GAUSS_VEC_MAX_T", 2)
    y = samplers.discrete_gaussian_ints(3, 2, 8000, samplers._Words(np_rng(45)))
    assert chi2_pvalue(tally(y), _dgauss_pmf_ts(3, 2, 60)) > ALPHA
    monkeypatch.setattr(samplers, "_LAP_VEC_MAX_T", 2)
    src = samplers._Words(np_rng(40))
    y = samplers.discrete_gaussian_ints(3, 2, 8000, src)
    assert chi2_pvalue(tally(y), _dgauss_pmf_ts(3, 2, 60)) > ALPHA
    y = samplers.discrete_laplace_ints(3, 2, 8000, src)
    assert chi2_pvalue(tally(y), _dlap_pmf_ts(3, 2, 60)) > ALPHA


def test_scale_is_rounded_up_by_at_most_2_pow_minus_20():
    for units in [Fraction(1, 3), Fraction(3, 2), Fraction(2 ** 20 + 1, 7), Fraction(10 ** 9, 3),
                  Fraction(math.pi), Fraction(2 ** 21)]:
        t, s = samplers._scale_ratio(units)
        assert s & (s - 1) == 0 and t >= 2 ** 20
        assert units <= Fraction(t, s) <= units * (1 + Fraction(1, 2 ** 20))


def test_torch_generator_drives_the_vectorised_sampler():
    a = GaussianMechanism(sigma=1.0).release(np.zeros(50), torch_rng(41))
    b = GaussianMechanism(sigma=1.0).release(np.zeros(50), torch_rng(41))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, GaussianMechanism(sigma=1.0).release(np.zeros(50), torch_rng(42)))


def test_release_default_is_secure_and_is_private_labels_fast():
    g = samplers.grid_granularity(1.0)
    out = LaplaceMechanism(scale=1.0).release(np.zeros(64) + 0.1, np_rng(43))   # no sampling= given
    assert np.all(out / g == np.round(out / g))
    assert samplers.is_private("secure") is True
    assert samplers.is_private("fast") is False
    with pytest.raises(ValueError, match=r"sampling must be one of \('fast', 'secure'\). Found 'exact'"):
        samplers.is_private("exact")
    with pytest.raises(ValueError, match="engine must be 'numpy' or 'python'. Found 'gpu'"):
        samplers._discrete_ints("gaussian", Fraction(2), 3, np_rng(), engine="gpu")


def test_other_bit_generators_are_read_as_bytes():
    """MT19937's raw outputs are 32-bit: it is read through Generator.bytes, still exact."""
    rng = np.random.Generator(np.random.MT19937(44))
    src = samplers._Words(rng)
    w = src.words(20_000)
    assert w.dtype == np.uint64
    assert stats.binomtest(int((w >> np.uint64(63)).sum()), w.size, 0.5).pvalue > ALPHA
    y = samplers.discrete_gaussian_ints(3, 2, 20_000, src)
    assert chi2_pvalue(tally(y), _dgauss_pmf_ts(3, 2, 60)) > ALPHA


def test_noise_pool_hands_each_draw_out_once_in_order():
    pool = samplers._NoisePool(max_draws=64)
    counter = [0]

    def draw(m):
        out = np.arange(counter[0], counter[0] + m, dtype=np.int64)
        counter[0] += m
        return out

    rng = np_rng(50)
    got = np.concatenate([pool.take(rng, ("gaussian", 3, 1), n, draw) for n in (5, 5, 5, 7, 40, 3, 100, 1)])
    np.testing.assert_array_equal(got, np.arange(got.size))     # never repeated, never skipped
    assert counter[0] - got.size <= 64                            # drawn ahead: at most max_draws
    first = pool.take(np_rng(50), ("gaussian", 3, 1), 4, draw)   # another generator: its own pool
    assert first[0] == counter[0] - 4
    # a one-off scale draws exactly what it uses
    before = counter[0]
    pool.take(rng, ("gaussian", 5, 1), 9, draw)
    assert counter[0] - before == 9


def test_pooled_releases_are_deterministic_per_generator_and_differ_across_calls():
    mech = GaussianMechanism(sigma=2.0)
    r1, r2 = np_rng(51), np_rng(51)
    a = [mech.release(np.zeros(16), r1) for _ in range(5)]
    b = [mech.release(np.zeros(16), r2) for _ in range(5)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert len({x.tobytes() for x in a}) == 5


def test_pooled_and_unpooled_noise_have_the_same_law(monkeypatch):
    monkeypatch.setattr(samplers._POOL, "max_draws", 0)
    src_law = samplers._discrete_ints("laplace", Fraction(3, 2), 20_000, np_rng(52))
    monkeypatch.setattr(samplers._POOL, "max_draws", 4096)
    rng = np_rng(53)
    pooled = np.concatenate([samplers._discrete_ints("laplace", Fraction(3, 2), 100, rng) for _ in range(200)])
    assert _two_sample_pvalue(src_law, pooled) > ALPHA
