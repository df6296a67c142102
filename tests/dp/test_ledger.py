"""AttributeLedger: hypothesis stateful test against an exact model, plus unit cases.

``LedgerContract`` holds the behaviour every ledger kind must have (in-memory and SQLite-backed
subclass it, as the accountants subclass ``AccountantContract``); the durable-only cases follow.

The model keeps L_a as exact rationals. Every rule compares the ledger with the model;
the invariants check after every step that no L_a exceeds B_a and that the stored
history explains every L_a exactly (all-or-nothing: a charge of a set appears once and
moves every attribute of the set by the same epsilon, or appears not at all).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from fedmem.dp import AttributeLedger, DurableStore
from fedmem.errors import BudgetExceeded

ATTRS = ("diabetes", "debt", "address", "religion")
# Epsilons from a small set with exact binary and non-binary fractions, so sequences that
# exactly meet a cap (0.25 + 0.25 + 0.5) and float round-off (0.1 * 3) both occur.
EPSILONS = st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0, 1e-3])
CAPS = st.sampled_from([0.3, 0.5, 1.0, 1.5])


class LedgerMachine(RuleBasedStateMachine):
    ledger_class = AttributeLedger

    def new_ledger(self, caps):
        return self.ledger_class(caps, store=DurableStore(None), name="m")

    @initialize(caps=st.fixed_dictionaries({a: CAPS for a in ATTRS}))
    def setup(self, caps):
        self.caps = caps
        self.ledger = self.new_ledger(caps)
        self.model = {a: Fraction(0) for a in ATTRS}
        self.charges = 0

    def _admissible(self, attrs, eps) -> bool:
        return all(self.model[a] + Fraction(eps) <= Fraction(self.caps[a]) for a in attrs)

    @rule(attrs=st.sets(st.sampled_from(ATTRS), min_size=1), eps=EPSILONS)
    def try_charge(self, attrs, eps):
        expected = self._admissible(attrs, eps)
        assert self.ledger.fits(attrs, eps) == expected
        assert self.ledger.try_charge(attrs, eps, label="t") == expected
        if expected:
            for a in attrs:
                self.model[a] += Fraction(eps)
            self.charges += 1

    @rule(attrs=st.sets(st.sampled_from(ATTRS), min_size=1), eps=EPSILONS)
    def book(self, attrs, eps):
        if self._admissible(attrs, eps):
            self.ledger.book(attrs, eps)
            for a in attrs:
                self.model[a] += Fraction(eps)
            self.charges += 1
        else:
            with pytest.raises(BudgetExceeded):
                self.ledger.book(attrs, eps)

    @rule(attr=st.sampled_from(ATTRS))
    def fill_to_cap(self, attr):
        """Charge exactly the remaining budget of one attribute (exact boundary case)."""
        rest = Fraction(self.caps[attr]) - self.model[attr]
        eps = float(rest)
        if eps > 0 and Fraction(eps) <= rest:
            assert self.ledger.try_charge([attr], eps)
            self.model[attr] += Fraction(eps)
            self.charges += 1

    @invariant()
    def never_exceeds_caps(self):
        spent = self.ledger.spent()
        for a in ATTRS:
            assert spent[a] <= self.caps[a]   # rounding is monotone, caps are floats
            assert self.model[a] <= Fraction(self.caps[a])

    @invariant()
    def matches_model(self):
        spent = self.ledger.spent()
        assert spent == {a: float(v) for a, v in self.model.items()}
        for a in ATTRS:
            assert self.ledger.remaining(a) == float(Fraction(self.caps[a]) - self.model[a])

    @invariant()
    def history_explains_spending(self):
        hist = self.ledger.history()
        assert len(hist) == self.charges
        recomputed = {a: Fraction(0) for a in ATTRS}
        for c in hist:
            for a in c.attrs:
                recomputed[a] += Fraction(c.epsilon)
        assert recomputed == self.model


TestLedgerStateful = LedgerMachine.TestCase
TestLedgerStateful.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# ------------------------------------------------- the stateful test can fail
class _CheckFirstOnly(AttributeLedger):
    """Broken: the prospective check looks only at the first attribute of the set."""

    def _admits(self, spent, attrs, eps):
        return super()._admits(spent, attrs[:1], eps)


class _FloatSums(AttributeLedger):
    """Broken: admits when the float sum rounds to the cap (0.1 + 0.2 "==" 0.3)."""

    def _admits(self, spent, attrs, eps):
        return all(float(spent[a]) + float(eps) <= self._caps[a] + 1e-12 for a in attrs)


@pytest.mark.parametrize("broken", [_CheckFirstOnly, _FloatSums], ids=["check-first-only", "float-sums"])
def test_stateful_machine_catches_broken_ledger(broken):
    machine = type("BrokenMachine", (LedgerMachine,), {"ledger_class": broken})
    # The machine reports the divergence as a failed assertion or a missing BudgetExceeded.
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        run_state_machine_as_test(machine, settings=settings(
            max_examples=200, stateful_step_count=30, deadline=None, phases=[Phase.generate],
            database=None, derandomize=True))


# --------------------------------------------------------------------------- the ledger contract
class LedgerContract:
    """Shared contract of the per-attribute ledgers (the accountants' ``AccountantContract`` in
    tests/dp/test_accountant.py is its model): every ledger kind subclasses it and says how a
    ledger is made (``make``). The vocabulary is the accountants': ``fits`` / ``book``."""

    def make(self, caps, **kw) -> AttributeLedger:
        raise NotImplementedError

    def test_agrees_with_the_exact_model(self):
        # The stateful machine above, on ledgers of this kind. Its power against broken ledgers is
        # measured by test_stateful_machine_catches_broken_ledger (200 examples); 20 examples here
        # catch check-first-only, not float-sums.
        machine = type("ContractMachine", (LedgerMachine,), {"new_ledger": lambda m, caps: self.make(caps)})
        run_state_machine_as_test(machine, settings=settings(
            max_examples=20, stateful_step_count=30, deadline=None, database=None, derandomize=True))

    def test_fits_and_book(self):
        led = self.make({"a": 1.0, "b": 0.5})
        assert led.fits(["a", "b"], 0.5)
        assert led.book(["a", "b"], 0.5, label="first") is None
        assert not led.fits(["b"], 1e-3)
        with pytest.raises(BudgetExceeded, match=r"charge of 0\.001 to \['b'\] refused by ledger"):
            led.book(["b"], 1e-3)
        led.book(["a"], 0.5, label="second")
        assert led.spent() == {"a": 1.0, "b": 0.5}
        assert [(c.attrs, c.epsilon, c.label) for c in led.history()] == [(("a", "b"), 0.5, "first"),
                                                                         (("a",), 0.5, "second")]

    def test_refused_set_charge_changes_nothing(self):
        led = self.make({"a": 1.0, "b": 0.5})
        led.book(["a", "b"], 0.4)
        assert not led.try_charge(["a", "b"], 0.2)  # b would reach 0.6 > 0.5; a must not move
        assert led.spent() == {"a": 0.4, "b": 0.4}
        assert len(led.history()) == 1
        assert led.try_charge(["a"], 0.6)            # exactly meets a's cap
        assert not led.try_charge(["a"], 1e-12)

    def test_floating_point_round_off_cannot_exceed_cap(self):
        led = self.make({"a": 0.3})
        assert led.try_charge(["a"], 0.1) and led.try_charge(["a"], 0.1)
        # 0.1 + 0.1 + 0.1 > 0.3 exactly in binary rationals (0.1 is slightly above 1/10),
        # so the third charge is refused even though float sums would round to 0.30000000000000004.
        assert Fraction(0.1) * 3 > Fraction(0.3)
        assert not led.try_charge(["a"], 0.1)

    def test_unknown_and_empty_attributes_rejected(self):
        led = self.make({"a": 1.0})
        with pytest.raises(ValueError, match="unknown"):
            led.try_charge(["zzz"], 0.1)
        with pytest.raises(ValueError, match="attrs"):
            led.try_charge([], 0.1)
        assert led.history() == []


class TestInMemoryLedger(LedgerContract):
    """A ledger in a private in-memory store (``DurableStore(None)``, the default)."""

    def make(self, caps, **kw) -> AttributeLedger:
        return AttributeLedger(caps, **kw)


class TestSqliteLedger(LedgerContract):
    """A durable ledger in an SQLite file; every ledger made by one test is a new name in the
    same file (what two ledgers sharing a store look like)."""

    @pytest.fixture(autouse=True)
    def _store(self, tmp_path):
        self.store = DurableStore(tmp_path / "ledgers.sqlite")
        self.names = itertools.count()

    def make(self, caps, **kw) -> AttributeLedger:
        return AttributeLedger(caps, store=self.store, name=f"ledger-{next(self.names)}", **kw)


# --------------------------------------------------------------------------- durable store only
def test_resume_from_store_and_cap_mismatch(tmp_path):
    path = tmp_path / "l.sqlite"
    led = AttributeLedger({"a": 1.0}, store=DurableStore(path), name="x")
    led.book(["a"], 0.7)
    again = AttributeLedger({"a": 1.0}, store=DurableStore(path), name="x")
    assert again.spent("a") == 0.7
    assert not again.try_charge(["a"], 0.5)
    with pytest.raises(ValueError, match="caps"):
        AttributeLedger({"a": 2.0}, store=DurableStore(path), name="x")



def test_incremental_sums_equal_a_full_read_across_writers_and_edits(tmp_path):
    """The ledger reads only rows it has not seen (O(new rows) per charge); what it answers
    must still equal a full read of the history: rows appended by another ledger object on
    the same file are counted, and a row removed behind its back forces a full recompute."""
    path = tmp_path / "ledger.sqlite"
    a = AttributeLedger({"x": 1.0, "y": 1.0}, store=DurableStore(path), name="m")
    b = AttributeLedger({"x": 1.0, "y": 1.0}, store=DurableStore(path), name="m")
    for _ in range(3):
        assert a.try_charge(["x"], 0.1)
    assert b.try_charge(["x", "y"], 0.2)                 # another writer on the same file
    assert a.spent() == pytest.approx({"x": 0.5, "y": 0.2})
    assert a.remaining("x") == float(Fraction(1) - 3 * Fraction(0.1) - Fraction(0.2))
    with DurableStore(path).transaction() as db:        # tamper: drop b's charge
        db.execute("DELETE FROM ledger_charges WHERE ledger='m' AND epsilon=0.2")
    assert a.spent() == pytest.approx({"x": 0.3, "y": 0.0})
    fresh = AttributeLedger({"x": 1.0, "y": 1.0}, store=DurableStore(path), name="m")
    assert fresh.spent() == a.spent()
    # admitted exactly when the rational sum fits the cap (the full read decides the same)
    assert a.try_charge(["x"], 0.7) is (3 * Fraction(0.1) + Fraction(0.7) <= 1)
