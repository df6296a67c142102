"""The support-leak attacks (fedmem.attacks.support) on synthetic responses: they beat chance on leaky
data, never on safe data."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from fedmem.attacks import support as S
from fedmem.dp import GaussianMechanism


@dataclass(frozen=True)
class Resp:
    value: np.ndarray
    count: float | None = None
    receipts: np.ndarray | None = None


@dataclass(frozen=True)
class Truth:
    contributing: np.ndarray


def _tallies(rng, shards, n):
    t = np.zeros(shards, dtype=np.int64)
    who = rng.choice(shards, size=n, replace=False)
    t[who] = rng.integers(1, 4, size=n)
    return t


# ------------------------------------------------------------------- (a) cardinality
def test_receipts_reconstruct_cardinality_exactly(rng):
    est, tru = [], []
    for _ in range(200):
        n = int(rng.integers(3, 41))
        t = _tallies(rng, 40, n)
        est.append(S.cardinality_from_receipts(t))
        tru.append(S.true_cardinality(Truth(t > 0)))
    rep = S.reconstruction_report(est, tru)
    assert rep.rate == 1.0 and rep.mae == 0.0
    assert not rep.at_chance and rep.chance_rate < 0.3


def test_noised_receipts_degrade_reconstruction(rng):
    est_lo, est_hi, tru = [], [], []
    for _ in range(200):
        n = int(rng.integers(3, 41))
        t = _tallies(rng, 40, n)
        tru.append(n)
        est_lo.append(S.cardinality_from_receipts(t + rng.normal(0, 0.2, 40)))
        est_hi.append(S.cardinality_from_receipts(t + rng.normal(0, 3.0, 40)))
    good, bad = S.reconstruction_report(est_lo, tru), S.reconstruction_report(est_hi, tru)
    assert good.rate > 0.9
    assert bad.rate < good.rate - 0.3


def test_constant_support_is_at_chance(rng):
    """Broadcast: every shard reports the same tally, so the estimate ignores the truth."""
    tru = rng.integers(3, 41, size=300)
    est = [S.cardinality_from_receipts(np.full(40, 5)) for _ in tru]
    rep = S.reconstruction_report(est, tru)
    assert rep.at_chance
    assert rep.rate <= rep.chance_rate


def test_count_estimate_is_feasible():
    assert S.cardinality_from_count(0, 40, 5) == 0.0
    for model in S.COUNT_MODELS:
        for c in (1, 5, 17, 200):
            e = S.cardinality_from_count(c, 40, 5, model)
            assert math.ceil(c / 5) <= e <= min(c, 40)
    assert S.cardinality_from_count(15, 40, 5) == 3.0          # three full shards
    assert S.cardinality_from_count(15, 40, 5, "uniform") > 3.0
    with pytest.raises(ValueError, match="model"):
        S.cardinality_from_count(3, 40, 5, "zipf")


def test_noise_scale_reveals_n_only_under_realized_calibration(rng):
    d, sigma, clip = 128, 1.2, 1.0
    realized = lambda n: sigma * clip / n          # noise follows the contributing set
    global_ = lambda n: sigma * clip / 40          # fixed bound: independent of n
    hits_r, hits_g = 0, 0
    for _ in range(100):
        n = int(rng.integers(3, 41))
        mean = rng.normal(size=d)
        mean *= 0.5 / np.linalg.norm(mean)
        r = mean + rng.normal(0, realized(n), d)
        hits_r += abs(S.cardinality_from_noise_scale(r, realized, 40) - n) <= 2
        g = mean + rng.normal(0, global_(n), d)
        hits_g += abs(S.cardinality_from_noise_scale(g, global_, 40) - n) <= 2
    assert hits_r >= 60
    assert hits_g <= 35


def test_reconstruct_prefers_receipts_then_count(rng):
    t = _tallies(rng, 40, 7)
    assert S.reconstruct_cardinality(Resp(np.zeros(4), 12.0, t), shards=40, k_local=5) == (7.0, "receipts")
    est, how = S.reconstruct_cardinality(Resp(np.zeros(4), 12.0, None), shards=40, k_local=5)
    assert how == "count" and 3 <= est <= 12
    est, how = S.reconstruct_cardinality(Resp(np.zeros(4)), shards=40, k_local=5)
    assert how == "none" and math.isnan(est)


# ------------------------------------------------------------ (b) differencing / audit
def _differencing_game(rng, trials, noise_sd):
    pos, neg = [], []
    for world in (1, 0):
        for _ in range(trials):
            base = _tallies(rng, 40, int(rng.integers(3, 20))).astype(float)
            tgt = base.copy()
            tgt[3] += world                      # the candidate record sits on shard 3
            noise = (lambda: rng.normal(0, noise_sd, 40)) if noise_sd else (lambda: 0.0)
            score = S.differencing_score(Resp(np.zeros(2), receipts=tgt + noise()),
                                         Resp(np.zeros(2), receipts=base + noise()), shard=3)
            (pos if world else neg).append(score)
    return np.array(pos), np.array(neg)


def test_differencing_beats_chance_on_exposed_receipts(rng):
    pos, neg = _differencing_game(rng, 150, 0.0)
    rep = S.membership_report(pos, neg, delta=1e-6, rng=rng, epsilon_claim=1.0)
    assert rep.auc == 1.0 and rep.auc_ci[0] > 0.9
    assert rep.tpr_at_1 == 1.0
    assert rep.eps_lower > 2.0               # an "epsilon-free" leak: far above a claim of 1
    assert rep.ceiling_violations > 0        # the audit catches the broken (unbooked) channel


def test_differencing_at_chance_on_support_safe_data(rng):
    """Constant receipts (broadcast) and suppressed receipts give nothing to difference."""
    pos = [S.differencing_score(Resp(np.zeros(2), receipts=np.full(40, 5)),
                                Resp(np.zeros(2), receipts=np.full(40, 5)), shard=3) for _ in range(100)]
    neg = list(pos)
    rep = S.membership_report(pos, neg, delta=1e-6, rng=rng, epsilon_claim=0.5)
    assert rep.auc == 0.5 and rep.auc_ci[0] <= 0.5 <= rep.auc_ci[1]
    assert rep.eps_lower == 0.0 and rep.ceiling_violations == 0
    supp = [S.differencing_score(Resp(np.zeros(2)), Resp(np.zeros(2))) for _ in range(8)]
    assert supp == [0.0] * 8


def test_noised_receipts_stay_under_their_dp_ceiling(rng):
    """A correctly noised tally (sensitivity 2 for a difference of two noised tallies)."""
    sigma = 2.0
    pos, neg = _differencing_game(rng, 400, sigma)
    # target and control are two Gaussian releases of sensitivity 1 each, composed
    eps = GaussianMechanism.from_noise_multiplier(sigma / math.sqrt(2)).epsilon(1e-6)
    rep = S.membership_report(pos, neg, delta=1e-6, rng=rng, epsilon_claim=eps)
    assert 0.55 < rep.auc < 0.9
    assert rep.ceiling_violations == 0
    assert rep.eps_lower <= eps


def test_broken_noise_is_caught_by_the_ceiling(rng):
    """Claiming the epsilon of sigma=2 while adding sigma=0.05 must be flagged."""
    pos, neg = _differencing_game(rng, 300, 0.05)
    claim = GaussianMechanism.from_noise_multiplier(2.0 / math.sqrt(2)).epsilon(1e-6)
    rep = S.membership_report(pos, neg, delta=1e-6, rng=rng, epsilon_claim=claim)
    assert rep.ceiling_violations > 0
    assert rep.eps_lower > claim


def test_rejection_score_is_lowest_and_finite():
    assert S.differencing_score(None, None) == S.REJECTED_SCORE
    assert S.value_score(None, np.ones(3)) == S.REJECTED_SCORE
    assert math.isfinite(S.REJECTED_SCORE)


# --------------------------------------------------------------- (c) noise scale
def _value_game(rng, n, std, trials, d=128):
    v = rng.normal(size=d)
    v /= np.linalg.norm(v)
    pos, neg = [], []
    for world in (1, 0):
        for _ in range(trials):
            others = rng.normal(size=(n - 1, d)) / math.sqrt(d)
            extra = v if world else rng.normal(size=d) / math.sqrt(d)
            mean = (others.sum(0) + extra) / n
            (pos if world else neg).append(S.value_score(Resp(mean + rng.normal(0, std, d)), v))
    return np.array(pos), np.array(neg)


def test_global_calibration_leaks_more_than_booked_when_n_small(rng):
    sigma, n_bound, n, delta = 1.2, 40, 3, 1e-6
    booked = GaussianMechanism.from_noise_multiplier(sigma).epsilon(delta)   # what global books
    # enough trials that a Clopper-Pearson bound can exceed ~4 (it is at most about ln(trials))
    pos, neg = _value_game(rng, n, sigma * 1.0 / n_bound, 1500)
    rep = S.membership_report(pos, neg, delta=delta, rng=rng, epsilon_claim=booked)
    assert rep.auc > 0.99
    assert rep.eps_lower > booked
    # per record the released mean moves by C/n, not C/n_bound: effective multiplier sigma*n/n_bound
    assert S.effective_epsilon(sigma, n, n_bound, delta) > 10 * booked
    assert S.effective_epsilon(sigma, 40, 40, delta) == pytest.approx(booked)


def test_realized_calibration_stays_under_booked(rng):
    sigma, n, delta = 1.2, 3, 1e-6
    booked = GaussianMechanism.from_noise_multiplier(sigma).epsilon(delta)
    # replace-one sensitivity of the mean is 2C/n; noise sigma * 2C/n
    pos, neg = _value_game(rng, n, sigma * 2.0 / n, 300)
    rep = S.membership_report(pos, neg, delta=delta, rng=rng, epsilon_claim=booked)
    assert rep.ceiling_violations == 0
    assert rep.eps_lower <= booked


# ------------------------------------------------------------------ (d) retries
def test_averaging_retries_shrinks_noise(rng):
    exact = np.zeros(64)
    one = [S.average_releases([exact + rng.normal(0, 1, 64)]) for _ in range(50)]
    many = [S.average_releases([exact + rng.normal(0, 1, 64) for _ in range(16)]) for _ in range(50)]
    mse1 = np.mean([np.mean(x ** 2) for x in one])
    mse16 = np.mean([np.mean(x ** 2) for x in many])
    assert mse16 == pytest.approx(mse1 / 16, rel=0.2)
    with pytest.raises(ValueError, match="at least one"):
        S.average_releases([])


# ------------------------------------------------------------------- validation
def test_bad_inputs_raise_named_errors(rng):
    with pytest.raises(ValueError, match="receipts"):
        S.cardinality_from_receipts(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="shards"):
        S.cardinality_from_count(3, 0, 5)
    with pytest.raises(ValueError, match="at least 4"):
        S.membership_report([1.0], [0.0], delta=1e-6, rng=rng)
    with pytest.raises(ValueError, match="delta"):
        S.membership_report([1.0] * 5, [0.0] * 5, delta=0.0, rng=rng)
    with pytest.raises(ValueError, match="equal-length"):
        S.reconstruction_report([1, 2], [1])
    with pytest.raises(ValueError, match="non-zero"):
        S.value_score(Resp(np.ones(3)), np.zeros(3))
