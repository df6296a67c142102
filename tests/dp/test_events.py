"""fedmem.dp.events: Gaussian DP of a booked event (gaussian_mu)."""

import math

import dp_accounting
import numpy as np
import pytest

from fedmem.dp.events import event_to_dict, gaussian_mu


def test_gaussian_mu_of_gaussian_compositions_and_none_for_others():
    g = dp_accounting.GaussianDpEvent(1.2)
    assert gaussian_mu(g) == pytest.approx(1 / 1.2)
    assert gaussian_mu(event_to_dict(g)) == pytest.approx(1 / 1.2)          # the stored form reads the same
    assert gaussian_mu(dp_accounting.SelfComposedDpEvent(g, 4)) == pytest.approx(2 / 1.2)
    both = dp_accounting.ComposedDpEvent([g, dp_accounting.GaussianDpEvent(0.5)])
    assert gaussian_mu(both) == pytest.approx(math.hypot(1 / 1.2, 2.0))
    assert gaussian_mu(dp_accounting.NoOpDpEvent()) == 0.0
    assert gaussian_mu(dp_accounting.LaplaceDpEvent(1.0)) is None
    assert gaussian_mu(dp_accounting.ComposedDpEvent([g, dp_accounting.LaplaceDpEvent(1.0)])) is None


def test_gaussian_mu_matches_the_rdp_accountant():
    """mu-GDP converted to (eps, delta) exactly is never above what the RDP accountant books for
    the same events (RDP is an upper bound on the exact curve), and close to it."""
    from fedmem.attacks.tight import gdp_epsilon
    from fedmem.dp import Accountant

    ev = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.2), 3)
    acc = Accountant("rdp")
    acc.book(ev, "three Gaussian releases")
    rdp = acc.spent(1e-6)
    exact = gdp_epsilon(gaussian_mu(ev), 1e-6)
    assert exact <= rdp <= 1.25 * exact
    assert np.isfinite(exact)
