"""DP-MIND client side: embedding table, Algorithm 3 perturbation and its metric-DP
guarantee (statistical tests on the real MiniLM table), projections, streaming, bad input."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from scipy import stats

from fedmem.agent.dpmind.embeddings import load_minilm
from fedmem.agent.dpmind.perturb import (IVFProjector, TokenPerturber, cached_projector, naive_project, rechunk,
                                         torch_threads)
from fedmem.attacks.audit import clopper_pearson, epsilon_lower_bound
from fedmem.dp import MetricLaplace


@pytest.fixture(scope="session")
def minilm():
    return load_minilm()


@pytest.fixture(scope="session")
def exact(minilm):
    return cached_projector(minilm[0], "exact", threads=1)


@pytest.fixture(scope="session")
def ivf(minilm):
    return cached_projector(minilm[0], "ivf", n_clusters=256, n_probe=24, threads=1)


# ------------------------------------------------------------------ table & codec
def test_table_is_packaged_minilm_and_read_only(minilm):
    table, codec = minilm
    assert table.matrix.shape == (30522, 384) and table.matrix.dtype == np.float32
    assert not table.matrix.flags.writeable
    for tok in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"):
        assert table.tokens.index(tok) in table.special_ids
    assert not set(table.output_ids.tolist()) & set(table.special_ids)
    ids = codec.encode("The special magic number is 4821937.")
    assert codec.decode(ids) == "the special magic number is 4821937."
    assert codec.encode("").size == 0


# ------------------------------------------------------------------ projections
def test_exact_projection_matches_naive_loop_and_fixes_table_points(minilm, exact):
    table, _ = minilm
    rng = np.random.default_rng(3)
    ids = rng.choice(table.output_ids, 2000, replace=False)
    pts = table.matrix[ids[:40]] + rng.normal(0, 0.05, (40, 384)).astype(np.float32)
    np.testing.assert_array_equal(exact.project(pts), naive_project(table, pts))
    # An unperturbed embedding projects to itself (tokens with duplicate rows aside).
    assert np.mean(exact.project(table.matrix[ids]) == ids) >= 0.99


def test_special_tokens_are_never_output(minilm, exact, ivf):
    table, _ = minilm
    special = np.array(sorted(table.special_ids))
    pts = table.matrix[special]  # exactly on special tokens: the nearest *output* token must win
    for proj in (exact, ivf):
        out = proj.project(pts)
        assert not np.isin(out, special).any()


def test_ivf_recall_against_exact_in_the_useful_regime(minilm, exact, ivf):
    """IVF is post-processing (privacy unchanged); its recall@1 is a utility property."""
    table, codec = minilm
    ids = codec.encode(" ".join(["the committee tests a risky bet while the rest of the field waits"] * 60)
                       + " one of the special magic numbers for fluffy-chair is: 4821937.")
    for eps, floor in ((200.0, 0.99), (400.0, 0.995)):
        pert = TokenPerturber(MetricLaplace(eps, 384), table, exact)
        pts = pert.noisy_embeddings(ids, np.random.default_rng(int(eps)))
        assert np.mean(exact.project(pts) == ivf.project(pts)) >= floor


# ------------------------------------------------------- metric-DP guarantee (Eq. 1)
def _pair(table):
    """Two real tokens at a moderate distance (``cat`` and ``dog``)."""
    a, b = table.tokens.index("cat"), table.tokens.index("dog")
    return a, b, table.distance(a, b)


class _GammaShapeOne(MetricLaplace):
    """Broken: radius ~ Gamma(1, 1/eps), the one-dimensional Laplace radius (384x too little noise)."""

    def sample(self, rng, n=None):
        z = super().sample(rng, n)
        r = np.linalg.norm(z, axis=-1, keepdims=True)
        return z / r * rng.gamma(1.0, 1.0 / self.epsilon, size=r.shape)


def metric_laplace_profile(eps: float, d: float, eps_prime: float, grid: int = 1000) -> float:
    """Exact privacy profile ``delta(eps')`` of ``MetricLaplace(eps, 384)`` for two inputs at
    distance ``d``, computed from the law alone (scipy quantiles, never the sampler).

    With ``y = a + Z``, ``Z = R u``: the privacy loss is ``L = eps (||Z + (a - b)|| - R)``
    ``= eps (sqrt(R^2 + 2 R d c + d^2) - R)`` with ``R ~ Gamma(384, 1/eps)`` and
    ``c = <u, (a-b)/d>``, ``(c + 1)/2 ~ Beta(191.5, 191.5)``; the tight delta at
    ``eps'`` is ``E_a[(1 - e^{eps' - L})_+]`` (the supremum over events of
    ``P_a(E) - e^{eps'} P_b(E)``). Midpoint rule on ``grid x grid`` equal-probability
    cells (converged to ~1e-4 at 1000; Monte Carlo with 2e6 draws agrees); the result
    is rounded up by 1e-3 to cover the quadrature error. The released token is
    post-processing of ``y``, so it satisfies every point of this profile.

    In 384 dimensions this profile is far tighter than the worst case ``eps * d``: the
    loss concentrates around ``eps d N(0, 1) / sqrt(384)``. That is why a check against
    ``eps * d`` alone cannot see a sampler with 3x too little noise, and this one can.
    """
    K = 384
    u = (np.arange(grid) + 0.5) / grid
    R = stats.gamma(a=K, scale=1.0 / eps).ppf(u)[:, None]
    c = 2.0 * stats.beta((K - 1) / 2, (K - 1) / 2).ppf(u)[None, :] - 1.0
    L = eps * (np.sqrt(R * R + 2.0 * R * d * c + d * d) - R)
    return min(1.0, float(np.mean(np.clip(1.0 - np.exp(eps_prime - L), 0.0, None))) + 1e-3)


class _NoiseOverThree(MetricLaplace):
    """Broken: the noise scale divided by 3 (radius ~ Gamma(d, 1/(3 eps))), still claiming eps."""

    def sample(self, rng, n=None):
        return super().sample(rng, n) / 3.0


PROFILE_EPS = (1.0, 2.0, 3.0, 4.0)


def _worst_excess(a, b, out_a, out_b, n, claims):
    """Largest ``lb(eps') - eps'`` over ``claims`` ``(eps', delta')`` for the events {output = a}
    (inputs a vs b) and {output = b} (b vs a), Clopper-Pearson at alpha 1e-4 per event; and the
    per-claim detail for the assertion message."""
    excess, detail = -math.inf, []
    for hit, x_in, x_out in ((a, out_a, out_b), (b, out_b, out_a)):
        tp, fp = int(np.sum(x_in == hit)), int(np.sum(x_out == hit))
        for e, dl in claims:
            lb = epsilon_lower_bound(tp, n, fp, n, delta=dl, alpha=1e-4)
            excess = max(excess, lb - e)
            detail.append((round(float(e), 2), round(dl, 4), tp, fp, round(lb, 2)))
    return excess, detail


def _profile_audit(mech, table, projector, wa, wb, n=2000, seed=0):
    """Largest ``lb(eps') - eps'`` over the claims ``(eps', delta(eps'))`` of the exact profile
    plus the worst case ``(eps d, 0)``, for the events {output = a} (inputs a vs b) and
    {output = b} (b vs a). Each event's Clopper-Pearson bounds hold with probability
    1 - 1e-4 and serve every claim at once (lb is monotone in delta), so the check is
    wrong with probability <= 2e-4."""
    a, b = table.tokens.index(wa), table.tokens.index(wb)
    d = table.distance(a, b)
    pert = TokenPerturber(mech, table, projector)
    out_a = pert.perturb_ids(np.full(n, a), np.random.default_rng(seed))
    out_b = pert.perturb_ids(np.full(n, b), np.random.default_rng(seed + 1))
    claims = [(mech.epsilon * d, 0.0)] + [(e, metric_laplace_profile(mech.epsilon, d, e)) for e in PROFILE_EPS]
    return _worst_excess(a, b, out_a, out_b, n, claims)


# Any projector is post-processing of the noisy embedding, so the audits use the fast
# IVF projector; the guarantee being audited is the same.
@pytest.mark.parametrize("variant", ["correct", "noise_over_3"])
@pytest.mark.parametrize("wa,wb,eps", [("cat", "dog", 20.0), ("cat", "cats", 40.0)])
def test_metric_dp_ratio_on_real_embeddings_within_bound(minilm, ivf, wa, wb, eps, variant):
    """Pr[M(a) = a] <= exp(eps') Pr[M(b) = a] + delta(eps') on the exact privacy profile of
    the claimed mechanism, and the worst case exp(eps d(a, b)) (Def. 3.2), checked with
    Clopper-Pearson bounds. The settings put the loss where tokens are informative
    (eps d = 29 and 33: the input token comes back 0.4% (cat/dog) and 10% (cat/cats) of
    the time with the correct noise); the same check catches a sampler with a third of
    the noise (excess about +1.6 and +2.8 over the claim; the correct sampler stays
    below the claim everywhere)."""
    table, _ = minilm
    cls = MetricLaplace if variant == "correct" else _NoiseOverThree
    excess, detail = _profile_audit(cls(eps, 384), table, ivf, wa, wb)
    assert (excess <= 0.0) == (variant == "correct"), (excess, detail)


def _audit(mech, table, projector, n=2000, seed=0):
    """eps lower bound from the event {output == a}, for inputs a vs b; and d(a, b)."""
    a, b, d = _pair(table)
    pert = TokenPerturber(mech, table, projector)
    out_a = pert.perturb_ids(np.full(n, a), np.random.default_rng(seed))
    out_b = pert.perturb_ids(np.full(n, b), np.random.default_rng(seed + 1))
    tp, fp = int(np.sum(out_a == a)), int(np.sum(out_b == a))
    return epsilon_lower_bound(tp, n, fp, n, alpha=1e-4), d, tp, fp


def test_metric_dp_audit_flags_wrong_gamma_shape(minilm, ivf):
    table, _ = minilm
    eps = 2.0
    lb, d, tp, fp = _audit(_GammaShapeOne(eps, 384), table, ivf)
    assert lb > eps * d, (d, tp, fp, lb)


def test_metric_dp_audit_flags_missing_noise_on_one_input(minilm, ivf):
    """Broken: the projection sees the clean embedding (noise skipped): leaks at any eps."""
    table, _ = minilm
    a, b, d = _pair(table)
    eps, n = 2.0, 2000
    pert = TokenPerturber(MetricLaplace(eps, 384), table, ivf)
    out_a = ivf.project(np.repeat(table.matrix[[a]], n, axis=0))  # the bug
    out_b = pert.perturb_ids(np.full(n, b), np.random.default_rng(1))
    lb = epsilon_lower_bound(int(np.sum(out_a == a)), n, int(np.sum(out_b == a)), n, alpha=1e-4)
    assert lb > eps * d


def _noise_tests(mech, eps_claimed, n=4000, seed=5):
    """KS p-values: radius vs Gamma(d, 1/eps_claimed); direction component vs the uniform-sphere law."""
    z = mech.sample(np.random.default_rng(seed), n)
    r = np.linalg.norm(z, axis=1)
    p_r = stats.kstest(r, stats.gamma(a=mech.dim, scale=1.0 / eps_claimed).cdf).pvalue
    u = (z[:, 0] / r + 1.0) / 2.0  # (1 + <e_1, v>) / 2 ~ Beta((d-1)/2, (d-1)/2) for v uniform on S^{d-1}
    p_u = stats.kstest(u, stats.beta((mech.dim - 1) / 2, (mech.dim - 1) / 2).cdf).pvalue
    return p_r, p_u


def test_noise_law_matches_density_exp_minus_eps_norm():
    """The density exp(-eps ||z||) in R^d is exactly: radius ~ Gamma(d, 1/eps), direction uniform.

    In 384 dimensions the privacy loss between two tokens concentrates far below its
    worst case eps * d(a, b), so a pairwise ratio test cannot see a doubled epsilon;
    this characterisation test does.
    """
    p_r, p_u = _noise_tests(MetricLaplace(100.0, 384), 100.0)
    assert p_r > 1e-4 and p_u > 1e-4


def test_noise_law_test_flags_doubled_epsilon_and_wrong_shape():
    p_r, _ = _noise_tests(MetricLaplace(200.0, 384), 100.0)  # sampler uses 2x the claimed epsilon
    assert p_r < 1e-6
    p_r, _ = _noise_tests(_GammaShapeOne(100.0, 384), 100.0)
    assert p_r < 1e-6


# ------------------------------------------------------------- streaming, chunking
def test_rechunk_splits_by_token_count():
    blocks = [np.arange(0, 7), np.arange(7, 8), np.arange(8, 23)]
    chunks = list(rechunk(blocks, 5))
    assert [c.size for c in chunks] == [5, 5, 5, 5, 3]
    np.testing.assert_array_equal(np.concatenate(chunks), np.arange(23))
    with pytest.raises(ValueError, match="chunk_tokens"):
        list(rechunk(blocks, 0))


def test_stream_memory_does_not_grow_with_length(minilm, ivf):
    table, _ = minilm
    pert = TokenPerturber(MetricLaplace(150.0, 384), table, ivf, block=512)

    def peak(n_blocks):
        blocks = (np.full(512, 2003) for _ in range(n_blocks))
        tracemalloc.start()
        total = sum(p.size for _, p in pert.stream(blocks, np.random.default_rng(0)))
        peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert total == 512 * n_blocks
        return peak_bytes

    small, large = peak(2), peak(12)
    assert large < 1.5 * small + (1 << 20)


def test_torch_threads_context_restores():
    import torch

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# -------------------------------------------------------------------- bad input
def test_bad_parameters_raise_clear_errors(minilm, exact):
    table, _ = minilm
    for eps in (0.0, -1.0):
        with pytest.raises(ValueError, match="epsilon must be positive"):
            MetricLaplace(eps, 384)
    with pytest.raises(ValueError, match="mechanism.dim"):
        TokenPerturber(MetricLaplace(1.0, 10), table, exact)
    with pytest.raises(TypeError, match="MetricLaplace"):
        TokenPerturber(object(), table, exact)
    pert = TokenPerturber(MetricLaplace(1.0, 384), table, exact)
    with pytest.raises(ValueError, match="ids must be in"):
        pert.perturb_ids([5, 40000], np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        pert.perturb_ids([5], 42)
    with pytest.raises(ValueError, match="points must have shape"):
        exact.project(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="n_probe"):
        IVFProjector(table, n_clusters=4, n_probe=8)
    assert pert.perturb_ids(np.zeros(0, np.int64), np.random.default_rng(0)).size == 0
    assert math.isfinite(clopper_pearson(0, 10)[1])


# ------------------------------------------------------------ cascade projector
from fedmem.agent.dpmind.perturb import CascadeProjector, make_projector  # noqa: E402


@pytest.fixture(scope="session")
def cascade(minilm):
    return cached_projector(minilm[0], "cascade", threads=1)


def test_cascade_recall_against_exact_at_scenario_epsilons(minilm, exact, cascade):
    """bfloat16 candidates + exact re-rank: recall@1 >= 0.99 against exact where the NIAH curve moves.

    Post-processing of the noisy embedding, so privacy is unchanged; recall is utility.
    Sized by power: 1,000 tokens per epsilon; a projector whose true recall is
    0.98 passes one epsilon (>= 990 hits) with probability P(Bin(1000, 0.98) >= 990) ~ 0.012,
    so the check has power ~0.99 against recall 0.98 at each epsilon. The scale measurement
    (recall@1 on 2,048-200,000 tokens) is ``scripts/bench_dpmind.py`` (docs/dpmind.md).
    """
    table, codec = minilm
    ids = codec.encode(" ".join(["the committee tests a risky bet while the rest of the field waits for news"] * 70)
                       + " one of the special magic numbers for fluffy-chair is: 4821937.")[-1000:]
    assert ids.size == 1000
    for eps in (50.0, 100.0, 200.0):
        pert = TokenPerturber(MetricLaplace(eps, 384), table, exact)
        pts = pert.noisy_embeddings(ids, np.random.default_rng(int(eps) + 7))
        assert np.mean(cascade.project(pts) == exact.project(pts)) >= 0.99, eps


def test_cascade_equals_exact_when_m_is_large(minilm, exact):
    table, _ = minilm
    n = table.output_ids.size
    big = CascadeProjector(table, group=16, probe=64, candidates=1024, block=32, threads=1)
    rng = np.random.default_rng(11)
    ids = rng.choice(table.output_ids, 300, replace=False)
    for eps in (50.0, 200.0):
        pts = TokenPerturber(MetricLaplace(eps, 384), table, exact).noisy_embeddings(ids, rng)
        np.testing.assert_array_equal(big.project(pts), exact.project(pts))
    # Exhaustive: every output token is a candidate (table points and noisy points). A
    # structural property (no candidate pass can drop the winner), so 4 + 4 points (issue
    # 22; each point re-ranks all 29,536 tokens in float64, one at a time).
    full = CascadeProjector(table, group=16, probe=-(-n // 16), candidates=n, block=1, threads=1)
    pts = np.concatenate([table.matrix[ids[:4]], TokenPerturber(MetricLaplace(50.0, 384), table, exact)
                          .noisy_embeddings(ids[4:8], rng).astype(np.float32)])
    np.testing.assert_array_equal(full.project(pts), exact.project(pts))


def _noisy_points(table, eps, n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.choice(table.output_ids, n)
    return (table.matrix[ids].astype(np.float64) + MetricLaplace(eps, 384).sample(rng, n)).astype(np.float32)


@pytest.fixture(scope="module")
def eps50_points(minilm):
    """400 noisy points at epsilon 50 and their float64 exhaustive nearest tokens, computed
    once for the certified test and its broken companion (the reference does not depend
    on the cascade's parameters: it is the float64 argmin over the whole output set)."""
    table, _ = minilm
    pts = _noisy_points(table, 50.0, 400, 1)
    return pts, CascadeProjector(table, threads=1).exhaustive(pts)


def test_certified_cascade_equals_float64_exhaustive_and_uses_its_fallback(minilm, eps50_points):
    """The certificate makes the default cascade exact: equal to the float64 argmin on every point.

    At epsilon 50 (queries far from every token, many near-ties in bfloat16) the probe's
    certificate fails for a good share of points, so the bound-based re-rank is exercised.
    """
    table, _ = minilm
    proj = CascadeProjector(table, threads=1)
    assert proj.certify
    pts, ref = eps50_points
    np.testing.assert_array_equal(proj.project(pts), ref)
    pts = _noisy_points(table, 100.0, 400, 2)
    np.testing.assert_array_equal(proj.project(pts), proj.exhaustive(pts))
    assert 0 < proj.fallbacks < proj.projected


def test_certificate_with_a_broken_bound_is_caught(minilm, eps50_points):
    """Broken variant: an error bound that is too small (here slightly negative, so exact
    bfloat16 ties no longer trigger the re-rank) with one candidate lets wrong answers through.

    The same comparison with the float64 exhaustive search that the correct certificate
    passes must fail here, so the equality test above can fail.
    """
    table, _ = minilm
    broken = CascadeProjector(table, probe=1, candidates=1, threads=1, matmul="float32")
    broken._max_e = broken._max_de = broken._gamma = broken._u_out = 0.0
    broken._max_dsq = -1e-6
    pts, ref = eps50_points
    assert np.mean(broken.project(pts) != ref) > 0.005
    good = CascadeProjector(table, probe=1, candidates=1, threads=1, matmul="float32")
    np.testing.assert_array_equal(good.project(pts), ref)


def test_float32_product_equals_the_bfloat16_product_and_needs_a_valid_mode(minilm, eps50_points):
    """The float32 path (bfloat16-rounded operands, float32 product, scores rounded to
    bfloat16; "auto" on CPUs without bfloat16 units) and the bfloat16 product give the same
    certified answer and use the re-rank on the same points. 32 points at epsilon 50 (one
    block: the emulated bfloat16 product is slow on AVX2-only CPUs)."""
    table, _ = minilm
    pts, ref = eps50_points
    pts, ref = pts[:32], ref[:32]
    f32 = CascadeProjector(table, threads=1, matmul="float32")
    bf16 = CascadeProjector(table, threads=1, matmul="bfloat16")
    assert f32._aug_mm.dtype != bf16._aug_mm.dtype
    np.testing.assert_array_equal(f32.project(pts), ref)
    np.testing.assert_array_equal(bf16.project(pts), ref)
    assert f32.fallbacks > 0 and bf16.fallbacks > 0
    assert CascadeProjector(table, threads=1).matmul in ("int8", "bfloat16", "float32")
    with pytest.raises(ValueError, match="matmul must be one of .* Found 'fp16'"):
        CascadeProjector(table, matmul="fp16")


def test_uncertified_cascade_is_the_old_heuristic(minilm, exact):
    table, _ = minilm
    old = CascadeProjector(table, certify=False, threads=1)
    pts = _noisy_points(table, 100.0, 600, 3)
    assert np.mean(old.project(pts) == exact.project(pts)) >= 0.99
    assert old.fallbacks == 0
    with pytest.raises(ValueError, match="certify"):
        CascadeProjector(table, certify="yes")


def test_cascade_is_default_and_never_outputs_special_tokens(minilm, cascade):
    table, _ = minilm
    assert isinstance(TokenPerturber(MetricLaplace(100.0, 384), table).projector, CascadeProjector)
    assert isinstance(make_projector(table), CascadeProjector)
    special = np.array(sorted(table.special_ids))
    assert not np.isin(cascade.project(table.matrix[special]), special).any()
    assert cascade.project(np.zeros((0, 384))).size == 0
    with pytest.raises(ValueError, match="candidates"):
        CascadeProjector(table, candidates=33, probe=2, group=16)
    with pytest.raises(ValueError, match="probe"):
        CascadeProjector(table, probe=10**6)
    with pytest.raises(ValueError, match="projection must be one of"):
        make_projector(table, "hnsw")


# ------------------------------------------- labelled per-coordinate (L1) Laplace mode
from fedmem.agent.dpmind.mechanism import CoordinateLaplace, guarantee_distance, make_mechanism  # noqa: E402


class _CoordOverThree(CoordinateLaplace):
    """Broken: per-coordinate Laplace with a third of the scale, still claiming eps."""

    def sample(self, rng, n=None):
        return super().sample(rng, n) / 3.0


def coordinate_laplace_profile(eps: float, diff: np.ndarray, eps_primes, n: int = 50_000,
                               seed: int = 123) -> list[float]:
    """Privacy profile ``delta(eps')`` of per-coordinate Laplace(1/eps) for two inputs with
    ``a - b = diff``, from the law alone: the privacy loss is
    ``L = eps (||Z + diff||_1 - ||Z||_1)`` with Z_i iid Laplace(1/eps), and the tight
    delta is ``E[(1 - e^{eps' - L})_+]``. Z is drawn by the Laplace quantile function
    ``-sign(u) log(1 - 2|u|) / eps`` on seeded uniforms u in (-1/2, 1/2) (not the sampler
    under test); the Monte Carlo mean is rounded up by 5 standard errors + 1e-4, so each
    value is an upper bound except with probability below 3e-7.

    Sized by power: n = 50,000 (was 200,000) keeps that guarantee (it holds at
    any n) and loosens the deltas by about 0.005 (cat/dog at eps 1.5: 0.553 / 0.380 / 0.226
    / 0.114 against 0.548 / 0.375 / 0.222 / 0.112); the broken sampler's excess over the
    claim stays +0.61 (cat/dog) and +2.53 (cat/cats) against +0.62 and +2.55 at 200,000, the
    correct one's stays at -1.0, both measured with the audit's seeds."""
    diff = np.asarray(diff, dtype=np.float64)
    rng = np.random.default_rng(seed)
    losses = []
    for s in range(0, n, 20_000):
        u = rng.uniform(-0.5, 0.5, size=(min(20_000, n - s), diff.size))
        z = -np.sign(u) * np.log1p(-2.0 * np.abs(u)) / eps
        losses.append(eps * (np.abs(z + diff).sum(1) - np.abs(z).sum(1)))
    loss = np.concatenate(losses)
    out = []
    for e in eps_primes:
        v = np.clip(1.0 - np.exp(e - loss), 0.0, None)
        out.append(min(1.0, float(v.mean() + 5.0 * v.std() / math.sqrt(v.size) + 1e-4)))
    return out


_L1_PROFILES: dict = {}  # (claimed eps, wa, wb) -> profile; depends on the claim only, not the sampler


def _l1_profile_audit(mech, table, projector, wa, wb, n=2000, seed=0):
    """Largest ``lb(eps') - eps'`` over the L1 claims (worst case ``eps ||a-b||_1`` at delta 0
    and the profile points), events {output = a} (a vs b) and {output = b} (b vs a);
    Clopper-Pearson at alpha 1e-4 per event."""
    a, b = table.tokens.index(wa), table.tokens.index(wb)
    diff = table.matrix[a].astype(np.float64) - table.matrix[b].astype(np.float64)
    pert = TokenPerturber(mech, table, projector)
    out_a = pert.perturb_ids(np.full(n, a), np.random.default_rng(seed))
    out_b = pert.perturb_ids(np.full(n, b), np.random.default_rng(seed + 1))
    claims = [(mech.epsilon * np.abs(diff).sum(), 0.0)]
    key = (mech.epsilon, wa, wb)
    if key not in _L1_PROFILES:
        _L1_PROFILES[key] = coordinate_laplace_profile(mech.epsilon, diff, PROFILE_EPS)
    claims += list(zip(PROFILE_EPS, _L1_PROFILES[key]))
    return _worst_excess(a, b, out_a, out_b, n, claims)


@pytest.mark.parametrize("variant", ["correct", "noise_over_3"])
@pytest.mark.parametrize("wa,wb,eps", [("cat", "dog", 1.5), ("cat", "cats", 3.0)])
def test_l1_mode_privacy_profile_on_real_embeddings(minilm, ivf, wa, wb, eps, variant):
    """L1 mode: Pr[M(a) = a] <= exp(eps') Pr[M(b) = a] + delta(eps') on the privacy profile
    of per-coordinate Laplace(1/eps), and the worst case exp(eps ||phi(a) - phi(b)||_1),
    with Clopper-Pearson bounds; the same check catches a sampler with a third of the
    noise."""
    table, _ = minilm
    cls = CoordinateLaplace if variant == "correct" else _CoordOverThree
    excess, detail = _l1_profile_audit(cls(eps, 384), table, ivf, wa, wb)
    assert (excess <= 0.0) == (variant == "correct"), (excess, detail)


def _coord_ks(mech, eps_claimed, n=400, seed=9):
    """KS p-value of all n*d coordinates against Laplace(1/eps_claimed), and of the
    pairwise products of coordinate signs of neighbouring coordinates against a fair coin
    (independence)."""
    z = mech.sample(np.random.default_rng(seed), n)
    p = stats.kstest(z.ravel(), stats.laplace(scale=1.0 / eps_claimed).cdf).pvalue
    same = int(np.sum(np.sign(z[:, :-1]) == np.sign(z[:, 1:])))
    p_ind = stats.binomtest(same, z[:, 1:].size, 0.5).pvalue
    return p, p_ind


def test_l1_noise_law_and_its_broken_companions():
    """Correct: every coordinate Laplace(1/eps), neighbouring signs independent. The same
    test flags a doubled epsilon, a third of the scale, and the L2 law (wrong mode)."""
    p, p_ind = _coord_ks(CoordinateLaplace(7.0, 384), 7.0)
    assert p > 1e-4 and p_ind > 1e-4
    assert _coord_ks(CoordinateLaplace(14.0, 384), 7.0)[0] < 1e-6
    assert _coord_ks(_CoordOverThree(7.0, 384), 7.0)[0] < 1e-6
    assert _coord_ks(MetricLaplace(7.0, 384), 7.0)[0] < 1e-6
    # torch generators are accepted and follow the same law
    import torch

    z = CoordinateLaplace(7.0, 384).sample(torch.Generator().manual_seed(4), 400)
    assert stats.kstest(z.ravel(), stats.laplace(scale=1 / 7.0).cdf).pvalue > 1e-4


def test_l1_mode_selection_and_bad_values(minilm, exact):
    table, _ = minilm
    assert isinstance(make_mechanism("l1", 7.0, 384), CoordinateLaplace)
    assert isinstance(make_mechanism("l2", 7.0, 384), MetricLaplace)
    with pytest.raises(ValueError, match="mechanism must be one of .* Found 'linf'"):
        make_mechanism("linf", 7.0, 384)
    with pytest.raises(ValueError, match="epsilon must be positive. Found -1"):
        CoordinateLaplace(-1.0, 384)
    with pytest.raises(ValueError, match="dim"):
        CoordinateLaplace(1.0, 0)
    with pytest.raises(ValueError, match="mechanism.dim"):
        TokenPerturber(CoordinateLaplace(1.0, 10), table, exact)
    a, b = table.matrix[10], table.matrix[11]
    assert guarantee_distance(CoordinateLaplace(1.0, 384), a, b) >= guarantee_distance(MetricLaplace(1.0, 384), a, b)
    out = TokenPerturber(CoordinateLaplace(7.0, 384), table, exact).perturb_ids(np.full(50, 2003),
                                                                               np.random.default_rng(0))
    assert out.shape == (50,) and not np.isin(out, sorted(table.special_ids)).any()
