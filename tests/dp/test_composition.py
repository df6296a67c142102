"""fedmem.dp.composition: the vectorised RDP epsilon equals dp-accounting's, float for float."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedmem.dp.composition import rdp_epsilon


def _curves(rng):
    orders = np.asarray(RdpAccountant()._orders, dtype=np.float64)
    yield orders, np.zeros_like(orders)                      # nothing composed
    for _ in range(300):
        scale = 10.0 ** rng.uniform(-6, 3)
        yield orders, scale * orders * rng.uniform(0.5, 1.5)   # Gaussian-like curves, tiny to huge
    r = rng.uniform(-1e-3, 1.0, size=orders.shape)           # negative entries (numerical noise)
    yield orders, r
    r = orders * 0.3
    r[5:9] = np.inf                                          # Laplace/pure parts at large orders
    yield orders, r
    yield orders, np.full_like(orders, np.inf)
    yield np.array([1.0, 1.005, 1.5, 2.0, 64.0]), np.array([0.1, 0.2, 0.3, 0.4, 5.0])   # orders at / near 1


def _disagreements(epsilon_of, delta) -> list:
    """Curves on which ``epsilon_of(orders, rdp, delta)`` is not dp-accounting's float."""
    out = []
    for orders, rdp in _curves(np.random.default_rng(0)):
        want = compute_epsilon(orders, rdp, delta)[0]
        got = epsilon_of(orders, rdp, delta)
        if not (float(got) == float(want) or (math.isnan(got) and math.isnan(want))):
            out.append((rdp[:3], got, want))
    return out


def _basic_bound(orders, rdp, delta):
    """A plausible broken vectorisation: Mironov's basic bound, without the log1p(-1/a) term."""
    with np.errstate(invalid="ignore", divide="ignore"):
        eps = np.where(orders > 1.01, rdp - math.log(delta) / (orders - 1), np.inf)
    return max(0.0, float(np.min(eps)))


@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-5, 0.3, 0.999])
def test_rdp_epsilon_is_dp_accountings_bit_for_bit(delta):
    assert sum(1 for _ in _curves(np.random.default_rng(0))) == 305
    assert _disagreements(rdp_epsilon, delta) == []


@pytest.mark.parametrize("delta", [1e-6, 0.3])
def test_a_broken_vectorisation_is_caught_by_the_same_comparison(delta):
    assert len(_disagreements(_basic_bound, delta)) > 250


def test_rdp_epsilon_edge_cases_are_dp_accountings():
    orders = np.asarray(RdpAccountant()._orders, dtype=np.float64)
    assert rdp_epsilon(orders, np.zeros_like(orders), 0.0) == compute_epsilon(orders, np.zeros_like(orders), 0.0)[0]
    assert rdp_epsilon(orders, orders * 0.1, 0.0) == math.inf
    with pytest.raises(ValueError, match="same length"):
        rdp_epsilon(orders, orders[:-1], 1e-6)
    with pytest.raises(ValueError, match="at least 1"):
        rdp_epsilon(np.array([0.5, 2.0]), np.array([0.1, 0.2]), 1e-6)


# ------------------------------------------------------------------ copy_tracks (trial compositions)
def _history(rng, n):
    """A random history in the shapes fedmem books: Gaussian (repeated and not), Laplace,
    self-composed and composed events, pure/approximate DP and EM selections."""
    import dp_accounting

    from fedmem.dp.mechanisms import ApproxDpEvent, PureDpEvent

    out = []
    for _ in range(n):
        c = int(rng.integers(6))
        if c == 0:
            out.append(dp_accounting.GaussianDpEvent(float(rng.choice([1.0, 2.5, 6.0]))))
        elif c == 1:
            out.append(dp_accounting.LaplaceDpEvent(float(rng.uniform(0.5, 3.0))))
        elif c == 2:
            out.append(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), int(rng.integers(1, 5))))
        elif c == 3:
            out.append(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(4.0),
                                                      dp_accounting.LaplaceDpEvent(2.0)]))
        elif c == 4:
            out.append(PureDpEvent(float(rng.uniform(0.01, 0.2))))
        else:
            out.append(ApproxDpEvent(float(rng.uniform(0.01, 0.2)), 1e-9))
    return out


def _trial(copier, tracks, events, delta):
    from fedmem.dp.composition import smallest_epsilon

    trial = copier(tracks)
    for e in events:
        for t in trial:
            t.compose(e)
    return smallest_epsilon(trial, delta)


def _share_the_curve(tracks):
    """Broken: a shallow copy (composing on it writes the original's RDP curve in place)."""
    import copy

    return [copy.copy(t) for t in tracks]


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_copy_tracks_is_a_deep_copy_and_a_shallow_one_is_caught(kind):
    import copy

    from fedmem.dp.accountant import _normalised, new_tracks
    from fedmem.dp.composition import copy_tracks, smallest_epsilon

    rng = np.random.default_rng(7)
    checks = 0
    for _ in range(6 if kind == "rdp" else 2):
        tracks = new_tracks(kind)
        for e in _history(rng, int(rng.integers(0, 12))):
            for t in tracks:
                t.compose(_normalised(e))
        trial = [_normalised(e) for e in _history(rng, 3)]
        for delta in (1e-6, 1e-3):
            before = smallest_epsilon(tracks, delta)
            want = _trial(copy.deepcopy, tracks, trial, delta)
            assert _trial(copy_tracks, tracks, trial, delta) == want           # bit for bit
            assert smallest_epsilon(tracks, delta) == before                   # the original untouched
            checks += 1
    assert checks == (12 if kind == "rdp" else 4)
    if kind == "rdp":    # the same check catches a copy that shares the curve
        tracks = new_tracks(kind)
        for t in tracks:
            t.compose(_normalised(_history(np.random.default_rng(1), 1)[0]))
        before = smallest_epsilon(tracks, 1e-6)
        _trial(_share_the_curve, tracks, [_normalised(e) for e in _history(rng, 3)], 1e-6)
        assert smallest_epsilon(tracks, 1e-6) != before
