"""Aggregator: channels per receipt policy, booking, and statistical privacy of each DP channel."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from fedmem.attacks.audit import histogram_epsilon_lower_bound
from fedmem.dp import Accountant, GaussianMechanism
from fedmem.federation.aggregator import Aggregator, Channel, ReleasePolicy, book_release

D = 8
DELTA = 1e-6


def policy(**kw):
    base = dict(selection="threshold", shards=6, k_local=2, clip=1.0, value_dim=D)
    base.update(kw)
    return ReleasePolicy(**base)


def kinds(rel):
    return {c.name: c.kind for c in rel.channels}


TOTAL = np.full(D, 0.25)
TALLIES = np.array([2, 0, 1, 0, 0, 1])


def test_channels_per_receipt_policy(rng):
    exp = Aggregator(policy(receipts="expose")).release(TOTAL, 4, TALLIES, rng)
    assert kinds(exp) == {"value": "dp", "receipts": "exact", "count": "exact"}
    assert exp.receipts.tolist() == TALLIES.tolist() and exp.count == 4.0
    assert exp.exact_channels == ("receipts", "count")

    sup = Aggregator(policy(receipts="suppress")).release(TOTAL, 4, None, rng)
    # threshold selection: the mean's denominator is the exact count -> implicit exact channel
    assert kinds(sup) == {"value": "dp", "count:implicit": "exact"}
    assert sup.receipts is None and sup.count is None

    sup_topk = Aggregator(policy(selection="topk", k=3, receipts="suppress", public_count=3)).release(
        TOTAL, 3, None, rng)
    assert kinds(sup_topk) == {"value": "dp"} and sup_topk.denominator == 3.0

    noi = Aggregator(policy(receipts="noised", receipt_sigma=2.0)).release(TOTAL, 4, TALLIES, rng)
    assert kinds(noi) == {"value": "dp", "receipts": "dp", "count": "derived"}
    assert noi.receipts.dtype == np.float64 and noi.count == pytest.approx(noi.receipts.sum())
    assert noi.denominator == pytest.approx(max(1.0, noi.count))

    bro = Aggregator(policy(selection="broadcast", receipts="broadcast", public_count=12)).release(
        TOTAL, 12, None, rng)
    assert kinds(bro) == {"value": "dp", "receipts": "public", "count": "public"}
    assert bro.receipts.tolist() == [2.0] * 6 and bro.count == 12.0


def test_spec_reveals_only_what_the_policy_needs():
    assert policy(receipts="suppress").selection_spec().reveal == {"sum", "count"}
    assert policy(receipts="expose").selection_spec().reveal == {"sum", "count", "tallies"}
    assert policy(receipts="noised").selection_spec().reveal == {"sum", "count", "tallies"}


def test_booked_events_and_calibration(rng):
    rel = Aggregator(policy(receipts="noised", receipt_sigma=3.0, sigma=1.5)).release(TOTAL, 4, TALLIES, rng)
    ev = rel.event()
    assert isinstance(ev, dp_accounting.ComposedDpEvent)
    assert [e.noise_multiplier for e in ev.events] == pytest.approx([1.5, 3.0], rel=1e-12)
    acc = Accountant()
    book_release(acc, rel, "q0")
    assert acc.count == 1
    # global calibration: the delivered multiplier is sigma * n / n_bound
    g = Aggregator(policy(selection="topk", k=5, public_count=5, sigma=1.2, n_bound=40, receipts="suppress")).release(
        TOTAL, 5, None, rng)
    assert g.calibrated_n == 40 and g.effective_noise_multiplier == pytest.approx(1.2 * 5 / 40)
    r = Aggregator(policy(selection="topk", k=5, public_count=5, calibration="realized", receipts="suppress")).release(
        TOTAL, 5, None, rng)
    assert r.calibrated_n == 5 and r.effective_noise_multiplier == 1.2
    lap = Aggregator(policy(noise="laplace", receipts="noised")).release(TOTAL, 4, TALLIES, rng)
    assert all(isinstance(e, dp_accounting.LaplaceDpEvent) for e in lap.event().events)


@pytest.mark.parametrize("kw, match", [
    (dict(selection="nope"), "selection must be one of"),
    (dict(receipts="broadcast"), "selection must be 'broadcast'"),
    (dict(sigma=0.0), "sigma must be positive"),
    (dict(n_bound=0), "n_bound must be >= 1"),
    (dict(noise="cauchy"), "noise must be one of"),
])
def test_policy_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        policy(**kw)


def test_channel_validation():
    with pytest.raises(ValueError, match="event must be given exactly"):
        Channel("value", "dp", False)
    with pytest.raises(ValueError, match="kind must be one of"):
        Channel("value", "magic", False)


# --------------------------------------------------------------- statistical privacy tests
N_SAMPLES = 8000
ALPHA = 1e-3


def _project(pol, total_a, total_b, n, rng, samples=N_SAMPLES):
    """Released values on neighbouring sums, projected on the direction they differ in."""
    agg = Aggregator(pol)
    u = (total_a - total_b) / np.linalg.norm(total_a - total_b)
    a = np.array([agg.release(total_a, n, None, rng).value @ u for _ in range(samples)])
    b = np.array([agg.release(total_b, n, None, rng).value @ u for _ in range(samples)])
    return a, b


def _eps_lb(a, b):
    edges = np.quantile(np.concatenate([a, b]), np.linspace(0.0005, 0.9995, 60))
    return max(histogram_epsilon_lower_bound(a, b, edges, DELTA, ALPHA),
               histogram_epsilon_lower_bound(b, a, edges, DELTA, ALPHA))


# neighbouring exact sums under add/remove-one-record adjacency: one selected value
# swapped for another, ||S - S'|| = 2C (the worst case the sensitivity covers)
SUM_A = np.zeros(D)
SUM_A[0] = 1.0
SUM_B = -SUM_A


def test_value_channel_realized_within_booked_epsilon():
    """Realized calibration: the empirical privacy loss stays below the booked epsilon."""
    pol = policy(selection="topk", k=5, public_count=5, sigma=3.0, calibration="realized", receipts="suppress")
    booked = GaussianMechanism.from_noise_multiplier(3.0).epsilon(DELTA)
    a, b = _project(pol, SUM_A, SUM_B, 5, np.random.default_rng(11))
    lb = _eps_lb(a, b)
    assert lb <= booked, (lb, booked)
    assert lb > 0.2  # the test has power: it does see the (allowed) loss


def test_value_channel_global_calibration_leaks_beyond_booked_epsilon():
    """Broken variant: global calibration with n=5 << n_bound=40 is caught exceeding the booking."""
    pol = policy(selection="topk", k=5, public_count=5, sigma=3.0, calibration="global", n_bound=40,
                 receipts="suppress")
    booked = GaussianMechanism.from_noise_multiplier(3.0).epsilon(DELTA)
    a, b = _project(pol, SUM_A, SUM_B, 5, np.random.default_rng(12))
    assert _eps_lb(a, b) > booked


def test_laplace_value_channel_within_booked_epsilon():
    pol = policy(selection="topk", k=5, public_count=5, sigma=1.0, noise="laplace", calibration="realized",
                 receipts="suppress")
    # pure DP: epsilon = 1 / sigma; worst-case pair is an L1-extreme swap of one selected value
    sa = np.full(D, 1.0 / math.sqrt(D))
    a, b = _project(pol, sa, -sa, 5, np.random.default_rng(13))
    lb = _eps_lb(a, b)
    assert 0.1 < lb <= 1.0 / 1.0


def _tally_samples(receipt_sigma, rng, samples=N_SAMPLES):
    """Noised tallies on neighbouring tallies (one record moves a selection from shard 1 to 0)."""
    agg = Aggregator(policy(receipts="noised", receipt_sigma=receipt_sigma))
    ta = np.array([1, 0, 0, 0, 0, 0])
    tb = np.array([0, 1, 0, 0, 0, 0])
    u = (ta - tb) / math.sqrt(2.0)
    a = np.array([agg.release(TOTAL, 1, ta, rng).receipts @ u for _ in range(samples)])
    b = np.array([agg.release(TOTAL, 1, tb, rng).receipts @ u for _ in range(samples)])
    return a, b


def test_noised_receipts_within_booked_epsilon():
    booked = GaussianMechanism.from_noise_multiplier(1.0).epsilon(DELTA)
    a, b = _tally_samples(1.0, np.random.default_rng(21))
    lb = _eps_lb(a, b)
    assert 0.3 < lb <= booked, (lb, booked)


def test_under_noised_receipts_are_caught():
    """Broken variant: tallies booked at receipt_sigma=4 but released with a quarter of that noise.

    (A sqrt(2) sensitivity error alone is below what 8000 samples can resolve; the
    tester's job here is to show an under-noised receipt channel is caught.)
    """
    booked = GaussianMechanism.from_noise_multiplier(4.0).epsilon(DELTA)
    a, b = _tally_samples(1.0, np.random.default_rng(22))
    assert _eps_lb(a, b) > booked


def test_exposed_receipts_have_no_finite_epsilon(rng):
    """Exact receipts separate neighbours with certainty: the tester's bound is large."""
    agg = Aggregator(policy(receipts="expose"))
    ta = np.array([1, 0, 0, 0, 0, 0])
    tb = np.array([0, 1, 0, 0, 0, 0])
    a = np.array([agg.release(TOTAL, 1, ta, rng).receipts[0] for _ in range(2000)], dtype=float)
    b = np.array([agg.release(TOTAL, 1, tb, rng).receipts[0] for _ in range(2000)], dtype=float)
    lb = histogram_epsilon_lower_bound(a, b, np.array([-0.5, 0.5, 1.5]), DELTA, ALPHA)
    assert lb > 5.0  # limited only by the sample size; there is no finite true epsilon
    assert "receipts" in agg.release(TOTAL, 1, ta, rng).exact_channels


def test_count_differing_from_public_value_is_not_public(rng):
    """Top-k over fewer than k candidates: the count is data-dependent, so it is not treated as public."""
    rel = Aggregator(policy(selection="topk", k=3, public_count=3, receipts="expose")).release(TOTAL, 2, TALLIES, rng)
    assert kinds(rel)["count"] == "exact" and rel.denominator == 2.0
    sup = Aggregator(policy(selection="topk", k=3, public_count=3, receipts="suppress")).release(TOTAL, 2, None, rng)
    assert kinds(sup) == {"value": "dp", "count:implicit": "exact"}


def test_secure_sampling_path(rng):
    rel = Aggregator(policy(receipts="noised", sampling="secure")).release(TOTAL, 4, TALLIES, rng)
    assert rel.value.shape == (D,) and np.all(np.isfinite(rel.value)) and rel.receipts.shape == (6,)
