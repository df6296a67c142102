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
