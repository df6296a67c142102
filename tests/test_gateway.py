"""Gateway: one unit test per rejection reason, booking before release, family composition."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from fedmem.dp import Accountant
from fedmem.errors import SupportPrivacyViolation
from fedmem.federation.aggregator import Aggregator, ReleasePolicy
from fedmem.federation.gateway import DEFAULT_FAMILY, Gateway

D = 4
TOTAL = np.full(D, 0.3)
TALLIES = np.array([1, 0, 2, 0])


def release(rng, count=3, **kw):
    base = dict(selection="threshold", shards=4, k_local=2, clip=1.0, value_dim=D, calibration="realized",
                receipts="suppress")
    base.update(kw)
    pol = ReleasePolicy(**base)
    return Aggregator(pol).release(TOTAL, count, TALLIES, rng)


def gw(acc=None, **kw):
    return Gateway(acc if acc is not None else Accountant(), **kw)


def test_exact_receipts_rejected_for_support_leak(rng):
    g = gw()
    rel = release(rng, receipts="expose")
    fam = g.register(0)
    a = g.assess(rel, 0, fam)
    assert a.reasons == ("support_leak",) and math.isinf(a.leak_bits)
    assert "receipts" in a.messages[0]
    exc = g.reject(a, label="q0")
    assert isinstance(exc, SupportPrivacyViolation) and exc.reasons == ("support_leak",) and exc.booked == ()
    assert str(exc).startswith("no memory available")
    assert g.accountant.count == 0  # nothing emitted -> nothing booked


def test_implicit_exact_count_rejected(rng):
    """Threshold + suppress divides by the exact n: the implicit count channel is caught."""
    g = gw()
    a = g.assess(release(rng, receipts="suppress"), 0, g.register(0))
    assert a.reasons == ("support_leak",)


def test_calibration_mismatch(rng):
    g = gw(tolerance=2)
    rel = release(rng, selection="topk", k=5, public_count=5, calibration="global", n_bound=40, count=5)
    a = g.assess(rel, 0, g.register(0))
    assert a.reasons == ("calibration_mismatch",)
    assert "calibrated_n=40" in a.messages[0] and "realized n=5" in a.messages[0]
    within = release(rng, selection="topk", k=5, public_count=5, calibration="global", n_bound=7, count=5)
    assert gw(tolerance=2).assess(within, 0, DEFAULT_FAMILY).admitted  # |5 - 7| <= 2


def test_retry_of_unknown_query_rejected(rng):
    g = gw()
    rel = release(rng, selection="topk", k=3, public_count=3)
    fam = g.register(5, retry_of=99)
    a = g.assess(rel, 5, fam, retry_of=99)
    assert a.reasons == ("retry_unbooked",)


def test_retry_joins_original_family_and_composes(rng):
    g = gw(support_budget_bits=100.0)
    rel = release(rng, selection="topk", k=3, public_count=3, receipts="noised", receipt_sigma=2.0)
    f0 = g.register(0, family="alpha")
    a0 = g.assess(rel, 0, f0)
    g.admit(rel, a0, "q0")
    f1 = g.register(1, family="beta", retry_of=0)  # a retry cannot escape its original's family
    assert f1 == "alpha"
    a1 = g.assess(rel, 1, f1, retry_of=0)
    assert a1.admitted and a1.leak_bits > a0.leak_bits
    g.admit(rel, a1, "q1 retry_of=0")
    assert g.accountant.count == 2  # the retry is its own booking


def test_noised_receipts_bits_are_the_rdp_bound_and_compose(rng):
    g = gw(support_budget_bits=5.0)
    rel = release(rng, selection="topk", k=3, public_count=3, receipts="noised", receipt_sigma=4.0)
    one = g.leak_bits("fam", rel)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(4.0))
    assert one == pytest.approx(acc.get_epsilon(1e-6) / math.log(2))
    admitted = 0
    for i in range(20):
        a = g.assess(rel, i, g.register(i, family="fam"))
        if not a.admitted:
            assert a.reasons == ("support_leak",)
            break
        g.admit(rel, a, f"q{i}")
        admitted += 1
    assert 1 <= admitted < 20  # the family budget runs out: support leakage composes
    assert g.accountant.count == admitted
    # another family starts from zero
    assert g.assess(rel, 99, g.register(99, family="other")).admitted


def test_public_support_is_free_and_admitted(rng):
    g = gw(support_budget_bits=0.0)
    rel = release(rng, selection="broadcast", receipts="broadcast", public_count=8, count=8)
    for i in range(5):
        a = g.assess(rel, i, g.register(i))
        assert a.admitted and a.leak_bits == 0.0
        g.admit(rel, a, f"q{i}")
    assert g.accountant.count == 5


def test_admit_books_before_release_and_respects_budget(rng):
    acc = Accountant(budget=(5.0, 1e-6))
    g = gw(acc)
    rel = release(rng, selection="topk", k=3, public_count=3, sigma=1.2)
    from fedmem.errors import BudgetExceeded

    a = g.assess(rel, 0, g.register(0))
    g.admit(rel, a, "q0")
    with pytest.raises(BudgetExceeded):
        g.admit(rel, g.assess(rel, 1, g.register(1)), "q1")
    assert acc.count == 1
    with pytest.raises(ValueError, match="assessment must be an admission"):
        bad = g.assess(release(rng, receipts="expose"), 2, g.register(2))
        g.admit(rel, bad, "q2")


def test_rejected_but_emitted_channel_still_counts(rng):
    """papers/003 (b): a receipt that already left is booked even though the response is rejected."""
    g = gw(support_budget_bits=0.5)
    rel = release(rng, selection="topk", k=3, public_count=3, receipts="noised", receipt_sigma=1.0)
    a = g.assess(rel, 0, g.register(0))
    assert a.reasons == ("support_leak",)
    emitted = [c for c in rel.channels if c.name == "receipts"]
    exc = g.reject(a, emitted=emitted, label="q0")
    assert len(exc.booked) == 1 and g.accountant.count == 1
    assert g.leak_bits(DEFAULT_FAMILY) > 0  # the family's estimate includes it


def test_ungated_exact_emission_poisons_the_family(rng):
    g = gw()
    g.record_ungated(release(rng, receipts="expose"), "f", "q0")
    assert math.isinf(g.leak_bits("f"))
    assert g.empirical_bits("f") == 0.0  # one released count: plug-in entropy 0 (why it is not used)


def test_every_reason_at_once(rng):
    g = gw()
    rel = release(rng, receipts="expose", calibration="global", n_bound=40)
    a = g.assess(rel, 0, g.register(0, retry_of=7), retry_of=7)
    assert set(a.reasons) == {"support_leak", "calibration_mismatch", "retry_unbooked"}


@pytest.mark.parametrize("kw, match", [
    (dict(support_budget_bits=-1.0), "support_budget_bits must be non-negative"),
    (dict(tolerance=-1), "tolerance must be a non-negative integer"),
    (dict(delta=1.0), "delta must be in the open interval"),
])
def test_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        gw(**kw)
    with pytest.raises(TypeError, match="accountant must be"):
        Gateway(object())
