"""Accountant: dp-accounting reference values, calibration, budgets, history.

``AccountantContract`` holds the behaviour every accountant kind must have; it is
subclassed once per kind (after ``dp_accounting``'s ``privacy_accountant_test.py``).
"""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedmem.dp import (
    Accountant,
    ApproxDpEvent,
    DurableStore,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    PureDpEvent,
)
from fedmem.dp.accountant import event_from_dict, event_to_dict
from fedmem.errors import BudgetExceeded

G = dp_accounting.GaussianDpEvent
L = dp_accounting.LaplaceDpEvent
SC = dp_accounting.SelfComposedDpEvent
C = dp_accounting.ComposedDpEvent
DELTA = 1e-6


def reference(kind: str, events, delta: float = DELTA) -> float:
    acc = rdp.RdpAccountant() if kind == "rdp" else pld.PLDAccountant(value_discretization_interval=1e-4)
    for e in events:
        acc.compose(e)
    return float(acc.get_epsilon(delta))


class AccountantContract:
    """Shared contract; subclasses set ``kind``."""

    kind: str

    def make(self, **kw) -> Accountant:
        return Accountant(self.kind, **kw)

    # ---------------------------------------------------------------- reference values
    @pytest.mark.parametrize("events", [
        [G(1.0)],
        [G(0.7), G(2.0), G(1.3)],
        [L(2.0)],
        [L(1.0), G(1.5)],
        [SC(G(3.0), 25)],
        [C([G(1.0), L(3.0)]), SC(L(4.0), 3)],
    ], ids=["gauss", "gauss3", "laplace", "mixed", "self_composed", "composed"])
    def test_equals_dp_accounting(self, events):
        acc = self.make()
        for e in events:
            acc.book(e)
        assert acc.spent(DELTA) == pytest.approx(reference(self.kind, events), rel=1e-9)

    def test_self_composed_equals_repeated(self):
        a, b = self.make(), self.make()
        a.book(SC(G(2.0), 5))
        for _ in range(5):
            b.book(G(2.0))
        assert a.spent(DELTA) == pytest.approx(b.spent(DELTA), rel=1e-6)
        assert a.count == 1 and b.count == 5

    def test_k_gaussians_equal_one_gaussian_with_sigma_over_sqrt_k(self):
        a, b = self.make(), self.make()
        for _ in range(4):
            a.book(G(2.0))
        b.book(G(1.0))
        assert a.spent(DELTA) == pytest.approx(b.spent(DELTA), rel=1e-3)

    def test_single_gaussian_not_below_analytic(self):
        acc = self.make()
        acc.book(GaussianMechanism.from_noise_multiplier(1.5).event())
        analytic = dp_accounting.get_epsilon_gaussian(1.5, DELTA)
        assert acc.spent(DELTA) >= analytic * (1 - 1e-3)

    laplace_slack = 0.0  # how far above the pure epsilon the backend's bound may be

    def test_laplace_close_to_pure_epsilon(self):
        acc = self.make()
        acc.book(LaplaceMechanism.calibrate(0.5).event())
        assert 0.45 <= acc.spent(DELTA) <= 0.5 * (1 + self.laplace_slack) + 1e-9

    def test_pure_events_summed_exactly(self):
        acc = self.make()
        em = ExponentialMechanism(0.1, 1.0)
        for _ in range(10):
            acc.book(em.event())
        # Exact rational sum of ten binary 0.1's, rounded once, is 1.0; a running float
        # sum would under-report it as 0.9999999999999999.
        assert sum([0.1] * 10) < 1.0
        assert acc.spent(DELTA) == 1.0

    def test_pure_plus_gaussian_is_basic_composition(self):
        acc = self.make()
        acc.book(G(1.0))
        acc.book(PureDpEvent(0.25))
        acc.book(SC(PureDpEvent(0.25), 2))
        assert acc.spent(DELTA) == pytest.approx(reference(self.kind, [G(1.0)]) + 0.75, rel=1e-9)

    def test_approx_events_spend_delta(self):
        acc = self.make()
        acc.book(G(1.0))
        acc.book(ApproxDpEvent(0.5, 4e-7))
        # dp-accounting part evaluated at delta - 4e-7, plus 0.5.
        expected = reference(self.kind, [G(1.0)], DELTA - 4e-7) + 0.5
        assert acc.spent(DELTA) == pytest.approx(expected, rel=1e-9)
        assert acc.spent(3e-7) == math.inf  # delta already used up by the approx part

    def test_empty_accountant_spent_zero(self):
        assert self.make().spent(DELTA) == 0.0

    def test_spent_monotone(self):
        acc = self.make()
        last = 0.0
        for e in [G(3.0), L(5.0), PureDpEvent(0.01), G(10.0)]:
            acc.book(e)
            now = acc.spent(DELTA)
            assert now > last
            last = now

    # ------------------------------------------------------------------------ budget
    def test_budget_refusal_books_nothing(self, tmp_path):
        store = DurableStore(tmp_path / "acc.sqlite")
        mech = GaussianMechanism.calibrate(0.8, DELTA)
        acc = self.make(store=store, name="b", budget=(2.0, DELTA))
        booked = 0
        with pytest.raises(BudgetExceeded, match="budget"):
            for _ in range(100):
                acc.book(mech.event(), label=f"r{booked}")
                booked += 1
        assert 1 <= booked < 100
        before = (acc.count, acc.spent(DELTA), acc.to_json())
        with pytest.raises(BudgetExceeded):
            acc.book(mech.event())
        assert (acc.count, acc.spent(DELTA), acc.to_json()) == before
        assert acc.spent(DELTA) <= 2.0
        # The refusal is durable too: a fresh process-equivalent sees the same state.
        again = self.make(store=DurableStore(tmp_path / "acc.sqlite"), name="b", budget=(2.0, DELTA))
        assert again.count == booked
        # A smaller event may still fit.
        assert acc.remaining() >= 0.0

    def test_pure_event_over_budget_refused(self):
        acc = self.make(budget=(1.0, DELTA))
        acc.book(PureDpEvent(0.6))
        with pytest.raises(BudgetExceeded):
            acc.book(PureDpEvent(0.5))
        acc.book(PureDpEvent(0.4))  # exactly meets the budget: admitted
        assert acc.spent(DELTA) == pytest.approx(1.0)

    # ------------------------------------------------------------------ persistence
    def test_history_and_json_round_trip(self, tmp_path):
        acc = self.make(store=DurableStore(tmp_path / "h.sqlite"), name="h")
        events = [G(1.5), L(2.0), PureDpEvent(0.1), SC(G(4.0), 3), C([L(9.0), ApproxDpEvent(0.1, 1e-8)])]
        for i, e in enumerate(events):
            acc.book(e, label=f"e{i}")
        hist = acc.history
        assert [h.label for h in hist] == [f"e{i}" for i in range(len(events))]
        assert [event_from_dict(h.event) for h in hist] == [event_from_dict(event_to_dict(e)) for e in events]
        doc = json.loads(acc.to_json())
        assert doc["kind"] == self.kind and doc["name"] == "h" and len(doc["history"]) == len(events)
        rebuilt = self.make()
        for h in doc["history"]:
            rebuilt.book(event_from_dict(h["event"]), label=h["label"])
        assert rebuilt.spent(DELTA) == pytest.approx(acc.spent(DELTA), rel=1e-12)
        # Reopening the file resumes the same history.
        reopened = self.make(store=DurableStore(tmp_path / "h.sqlite"), name="h")
        assert reopened.spent(DELTA) == pytest.approx(acc.spent(DELTA), rel=1e-12)
        assert reopened.count == len(events)

    def test_two_objects_on_one_store_share_history(self, tmp_path):
        path = tmp_path / "shared.sqlite"
        a = self.make(store=DurableStore(path), name="s")
        b = self.make(store=DurableStore(path), name="s")
        a.book(G(2.0))
        b.book(G(2.0))
        assert a.count == b.count == 2
        assert a.spent(DELTA) == pytest.approx(b.spent(DELTA))

    def test_reopen_with_other_budget_rejected(self, tmp_path):
        store = DurableStore(tmp_path / "m.sqlite")
        self.make(store=store, name="m", budget=(1.0, DELTA))
        with pytest.raises(ValueError, match="budget"):
            self.make(store=store, name="m", budget=(5.0, DELTA))

    def test_unknown_event_type_rejected(self):
        acc = self.make()
        with pytest.raises(TypeError, match="event"):
            acc.book(dp_accounting.PoissonSampledDpEvent(0.1, G(1.0)))
        with pytest.raises(TypeError, match="event"):
            acc.book("gaussian")
        assert acc.count == 0


class TestRdpAccountant(AccountantContract):
    kind = "rdp"
    # RDP -> (eps, delta) conversion of one Laplace release is ~1% looser than its pure eps.
    laplace_slack = 0.02

    def test_rdp_closed_form_gaussian(self):
        """RDP of N(0, s^2) at order a is a / (2 s^2); dp-accounting's conversion is the
        Canonne-Kamath-Steinke bound eps = min_a rdp(a) + log((a-1)/a) - (log delta + log a)/(a-1)."""
        acc = self.make()
        acc.book(G(2.0))
        orders = rdp.RdpAccountant().orders if hasattr(rdp.RdpAccountant(), "orders") else None
        if orders is None:
            orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]
        best = min(a / 8.0 + math.log((a - 1) / a) - (math.log(DELTA) + math.log(a)) / (a - 1)
                   for a in orders if a > 1)
        assert acc.spent(DELTA) == pytest.approx(best, rel=1e-6)


class TestPldAccountant(AccountantContract):
    kind = "pld"

    def test_pld_single_gaussian_is_tight(self):
        acc = self.make()
        acc.book(G(2.0))
        assert acc.spent(1e-5) == pytest.approx(dp_accounting.get_epsilon_gaussian(2.0, 1e-5), rel=1e-3)


# ------------------------------------------------------------------- calibration
@settings(max_examples=60, deadline=None)
@given(epsilon=st.floats(0.01, 30.0), log_delta=st.floats(-14.0, -0.5), sens=st.floats(1e-3, 1e3))
@example(epsilon=0.01, log_delta=-14.0, sens=13.0)  # sigma/sens rounded an ulp low (fixed)
def test_gaussian_calibration_never_exceeds_target(epsilon, log_delta, sens):
    delta = 10.0 ** log_delta
    mech = GaussianMechanism.calibrate(epsilon, delta, sens)
    achieved = dp_accounting.get_epsilon_gaussian(mech.event().noise_multiplier, delta)
    assert achieved <= epsilon
    assert mech.epsilon(delta) <= epsilon
    # ...and is not wastefully loose: 0.1% more noise would have been unnecessary.
    tighter = dp_accounting.get_epsilon_gaussian(mech.sigma / sens * (1 - 1e-3), delta)
    assert tighter > epsilon or math.isclose(tighter, epsilon, rel_tol=1e-3)


@settings(max_examples=60, deadline=None)
@given(epsilon=st.floats(0.01, 30.0), sens=st.floats(1e-3, 1e3))
def test_laplace_calibration_is_exact(epsilon, sens):
    mech = LaplaceMechanism.calibrate(epsilon, sens)
    assert mech.epsilon <= epsilon * (1 + 1e-15)
    assert mech.event().noise_multiplier == pytest.approx(1 / epsilon, rel=1e-12)


def test_calibrated_gaussian_books_its_target_in_pld():
    mech = GaussianMechanism.calibrate(1.0, 1e-5, 0.3)
    acc = Accountant("pld")
    acc.book(mech.event())
    assert acc.spent(1e-5) == pytest.approx(1.0, rel=2e-3)
