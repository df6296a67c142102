"""Gateway: data-independent decisions on public plans, per-principal and total budgets,
atomic durable booking, uniform refusals."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import rdp

from fedmem.dp import Accountant, DurableStore
from fedmem.errors import BudgetExceeded, SupportPrivacyViolation
from fedmem.federation.aggregator import ReleasePolicy
from fedmem.federation.gateway import REFUSAL_TEXT, Gateway, refusal

DELTA = 1e-6


def plan(**kw):
    base = dict(selection="threshold", shards=4, k_local=2, clip=1.0, value_dim=4, calibration="realized",
                receipts="suppress")
    base.update(kw)
    return ReleasePolicy(**base).plan()


def gw(acc=None, **kw):
    kw.setdefault("epsilon_budget", math.inf)
    kw.setdefault("total_epsilon_budget", math.inf)
    return Gateway(acc if acc is not None else Accountant(), **kw)


def decide(g, principal, plans, retry_of=None, family="f"):
    qid = g.register(principal, [family], [retry_of])[0]
    return g.decide(qid, principal, family, retry_of, plans)


def admit(g, principal, p, **kw):
    d = decide(g, principal, {"primary": p}, **kw)
    if d.admitted:
        g.book(d, p, f"q{d.query_id}")
    g.clear_pending()
    return d


# ------------------------------------------------------------------ unbookable plans
@pytest.mark.parametrize("kw, exact", [
    (dict(receipts="expose"), ("receipts", "count")),
    (dict(receipts="suppress"), ("count:implicit",)),
    (dict(receipts="noised", calibration="global", n_bound=4), ("value:calibration",)),
])
def test_unbookable_plans_are_refused_for_every_query(kw, exact):
    p = plan(**kw)
    assert p.exact_channels == exact and not p.bookable
    g = gw()
    pid = g.new_principal()
    for _ in range(3):
        d = decide(g, pid, {"primary": p})
        assert not d.admitted and d.reasons == ("unbookable",)
    assert g.accountant.count == 0


def test_fallback_route_when_primary_is_unbookable():
    g = gw()
    pid = g.new_principal()
    safe = plan(selection="broadcast", receipts="broadcast", public_count=8)
    d = decide(g, pid, {"primary": plan(receipts="expose"), "fallback": safe})
    assert d.route == "fallback" and d.reasons == ("unbookable",)


def test_gateway_off_admits_exact_channels_but_still_books_the_dp_ones():
    g = gw(enabled=False)
    pid = g.new_principal()
    d = admit(g, pid, plan(receipts="expose"))
    assert d.admitted and g.accountant.count == 1 and g.support_bits(pid) == 0.0


# ------------------------------------------------------------------ support budgets
def _bits(sigma, n):
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma), n)
    return acc.get_epsilon(DELTA) / math.log(2.0)


def test_support_bits_compose_per_principal_and_refuse_over_budget():
    p = plan(receipts="noised", receipt_sigma=8.0)
    one, two = _bits(8.0, 1), _bits(8.0, 2)
    g = gw(support_budget_bits=(one + two) / 2, total_support_budget_bits=100.0)
    pid = g.new_principal()
    assert admit(g, pid, p).admitted
    assert g.support_bits(pid) == pytest.approx(one, rel=1e-9)
    d = admit(g, pid, p)
    assert not d.admitted and d.reasons == ("support_budget",)
    assert g.support_bits(pid) == pytest.approx(one, rel=1e-9)   # nothing booked for the refusal


@pytest.mark.parametrize("keyed_by", ["principal", "label"])
def test_budgets_cannot_be_dodged_with_labels_or_sybils(keyed_by):
    """Fresh labels per query and many principals: the per-principal budget ignores labels and
    the total budget bounds the Sybil. The broken variant (budgets keyed by the caller's label,
    no total) lets every query through and is caught by the same check."""
    p = plan(receipts="noised", receipt_sigma=8.0)
    total = 3.5 * _bits(8.0, 1)
    if keyed_by == "principal":
        g = gw(support_budget_bits=1.5 * _bits(8.0, 1), total_support_budget_bits=total)
    else:   # broken: what an operator gets by keying the budget on the family label, with no total
        g = gw(support_budget_bits=1.5 * _bits(8.0, 1), total_support_budget_bits=math.inf)
    sybils = [g.new_principal() for _ in range(6)]
    admitted = 0
    for i in range(24):
        pid = sybils[i % len(sybils)] if keyed_by == "principal" else g.new_principal()  # label -> fresh key
        admitted += admit(g, pid, p, family=f"fresh-label-{i}").admitted
    composed = _bits(8.0, admitted)
    if keyed_by == "principal":
        assert composed <= total + 1e-9 and admitted < 24
        assert g.support_bits(None) == pytest.approx(composed, rel=1e-6)
    else:
        assert composed > total


def test_pending_reservations_make_a_batch_compose_like_single_queries():
    p = plan(receipts="noised", receipt_sigma=8.0)
    g = gw(support_budget_bits=(_bits(8.0, 1) + _bits(8.0, 2)) / 2)
    pid = g.new_principal()
    ids = g.register(pid, ["a", "b"], [None, None])
    d1 = g.decide(ids[0], pid, "a", None, {"primary": p})
    d2 = g.decide(ids[1], pid, "b", None, {"primary": p})
    assert d1.admitted and not d2.admitted
    g.clear_pending()


def _reference_decisions(g, plans, queries, writer, write_at):
    """The gateway's decisions as ``Accountant.fits(every pending charge + this query's)`` gives
    them, query by query (what ``decide`` computed before the pending charges were kept
    composed): the reference the batch decisions must equal."""
    pending, out = {}, []
    for i, pid in enumerate(queries):
        if i == write_at:
            writer()
        route = None
        for name in ("primary", "fallback"):
            pl = plans.get(name)
            if pl is None or not pl.bookable:
                continue
            caps = g._caps(pid, pl)
            if all(acc.fits(pending.get(acc.name, []) + list(ev), cap) for acc, ev, cap, _ in caps):
                for acc, ev, _, _ in caps:
                    pending.setdefault(acc.name, []).extend(ev)
                route = name
                break
        out.append(route)
    return out


@pytest.mark.parametrize("fallback, writer_sigma", [(False, 1.0), (True, 3.0)])
def test_batch_decisions_equal_fits_on_the_whole_pending_list(fallback, writer_sigma):
    """A batch of 40 queries from 3 principals against per-principal, total and support budgets
    (and a fallback route), with another writer booking into the total ledger mid-batch: the
    decisions with pending charges kept composed (``PendingTrial``) equal the reference that
    recomposes every pending charge per query, and both admissions and refusals occur. The
    writer changes the decisions (asserted), so a kept composition that missed its booking is
    caught here (checked by hand: a PendingTrial that never re-reads the ledger fails both cases)."""
    primary = plan(receipts="noised", receipt_sigma=6.0, selection="topk", k=2, public_count=2, sigma=3.0)
    plans = {"primary": primary}
    if fallback:
        plans["fallback"] = plan(receipts="broadcast", selection="broadcast", sigma=3.0)

    def world():
        store = DurableStore(None)
        g = gw(Accountant(store=store), epsilon_budget=4.0, total_epsilon_budget=7.0,
               support_budget_bits=2.0, total_support_budget_bits=5.0)
        other = Accountant(store=store, name=g.accountant.name)
        return g, (lambda: other.book(dp_accounting.GaussianDpEvent(writer_sigma), "concurrent writer"))

    g1, w1 = world()
    pids = [g1.new_principal() for _ in range(3)]
    queries = [pids[i % 3] for i in range(40)]
    want = _reference_decisions(g1, plans, queries, w1, write_at=7)
    g0, _ = world()
    p0 = [g0.new_principal() for _ in range(3)]
    unwritten = _reference_decisions(g0, plans, [p0[i % 3] for i in range(40)], lambda: None, write_at=7)
    assert want != unwritten                  # the concurrent booking changes decisions: it must be seen
    g2, w2 = world()
    pids2 = [g2.new_principal() for _ in range(3)]
    got = []
    ids = g2.register(pids2[0], ["f"] * 40, [None] * 40)
    for i in range(40):
        if i == 7:
            w2()
        got.append(g2.decide(ids[i], pids2[i % 3], "f", None, plans).route)
    g2.clear_pending()
    assert got == want, (got, want)
    assert None in got and "primary" in got and (not fallback or "fallback" in got)


def _sequential(g, ids, pids, fams, retries, plans):
    return [g.decide(q, p, f, r, plans) for q, p, f, r in zip(ids, pids, fams, retries)]


def _check_decide_many(decide_many, kind="rdp"):
    """``decide_many`` against query-by-query ``decide`` on identical worlds (3 principals, an unissued
    one, a retry of an unknown query, per-principal/total/support budgets, with and without a fallback
    route), budgets from loose (the whole batch fits) to binding (refusals and fallbacks occur): the
    same decisions, and the same spend once every admission is booked. Returns how many of the
    batches were decided without any per-query ``decide`` (the fast path)."""
    from fedmem.federation.gateway import UNISSUED

    primary = plan(receipts="noised", receipt_sigma=6.0, selection="topk", k=2, public_count=2, sigma=3.0)
    fast = 0
    for fallback in (False, True):
        plans = {"primary": primary}
        if fallback:
            plans["fallback"] = plan(receipts="broadcast", selection="broadcast", sigma=3.0)
        for scale in (100.0, 1.0, 0.4):
            spent = []
            for how in ("sequential", "many"):
                g = gw(Accountant(kind, store=DurableStore(None)), epsilon_budget=4.0 * scale,
                       total_epsilon_budget=7.0 * scale, support_budget_bits=2.0 * scale,
                       total_support_budget_bits=5.0 * scale)
                pids = [g.new_principal().label for _ in range(3)]
                got = []
                for batch in range(3):     # three batches: the later ones start from booked spend
                    who = [pids[i % 3] for i in range(20)]
                    who[5] = UNISSUED
                    ids = g.register(who, ["f"] * 20, [None] * 20)
                    retries = [None] * 20
                    retries[9] = 10**6      # never issued
                    if how == "many":
                        calls = []
                        real = g.decide
                        g.decide = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
                        ds = decide_many(g, ids, who, ["f"] * 20, retries, plans)
                        del g.decide
                        fast += not calls
                    else:
                        ds = _sequential(g, ids, who, ["f"] * 20, retries, plans)
                    admitted = [d for d in ds if d.admitted]
                    booked = not admitted or g.book_many(
                        [(d, plans[d.route], f"q{d.query_id}") for d in admitted]) is not None
                    got.append(([(d.query_id, d.route, d.reasons) for d in ds], booked))
                    g.clear_pending()
                spent.append((got, [g.principal_spent(p) for p in pids], [g.support_bits(p) for p in pids],
                              g.accountant.spent(DELTA), g.support_bits(None)))
            assert spent[0] == spent[1], (kind, fallback, scale)
            assert all(booked for _, booked in spent[0][0])   # decide's admissions always book
            routes = [r for batch, _ in spent[0][0] for _, r, _ in batch]
            if scale < 100:   # binding: more than the two uniform refusals per batch, or fallbacks
                assert routes.count(None) > 6 or "fallback" in routes
            else:             # loose: only those
                assert routes.count(None) == 6 and "fallback" not in routes
    return fast


def test_decide_many_equals_deciding_query_by_query():
    """Gateway.decide_many gives decide()'s decisions and spend (see _check_decide_many); the loose
    batches take the fast path (no per-query decide). A PLD gateway never takes it (its discretised
    epsilon is not provably monotone): every query goes through decide."""
    assert _check_decide_many(lambda g, *a: g.decide_many(*a), "rdp") > 0
    g = gw(Accountant("pld"), epsilon_budget=50.0)
    calls, real = [], g.decide
    g.decide = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    pid = g.new_principal().label
    ds = g.decide_many(g.register(pid, ["f"] * 3, [None] * 3), [pid] * 3, ["f"] * 3, [None] * 3,
                       {"primary": plan(selection="topk", k=2, public_count=2, sigma=3.0)})
    assert len(calls) == 3 and all(d.route == "primary" for d in ds)


def test_decide_many_check_catches_a_fast_path_that_checks_only_the_first_query():
    """Companion: a fast path that admits the whole batch when its first chargeable query fits (a missing
    charge for the rest) is caught by the same check, in the binding batches."""
    def broken(g, ids, pids, fams, retries, plans):
        first = g.decide(ids[0], pids[0], fams[0], retries[0], plans)
        if first.route != "primary":
            return _sequential(g, ids, pids, fams, retries, plans)
        rest = g.decide_many(ids[1:], pids[1:], fams[1:], retries[1:], {"primary": plans["primary"]})
        return [first] + [type(d)(d.query_id, d.principal, d.family, d.retry_of, "primary", ())
                          if d.reasons[:1] not in (("unissued_principal",), ("retry_unbooked",)) else d for d in rest]

    with pytest.raises(AssertionError, match="rdp"):
        _check_decide_many(broken, "rdp")


# ------------------------------------------------------------------ epsilon budgets
def test_epsilon_budget_per_principal_and_total():
    p = plan(selection="topk", k=2, public_count=2, sigma=2.0)
    def eps(n):
        acc = rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(2.0), n)
        return acc.get_epsilon(DELTA)

    e = eps(1)
    g = gw(epsilon_budget=(eps(1) + eps(2)) / 2, total_epsilon_budget=(eps(2) + eps(3)) / 2)
    a, b = g.new_principal(), g.new_principal()
    assert admit(g, a, p).admitted
    d = admit(g, a, p)
    assert not d.admitted and d.reasons == ("epsilon_budget",)
    assert admit(g, b, p).admitted          # b has its own budget ...
    c = g.new_principal()
    assert not admit(g, c, p).admitted      # ... but the total caps everyone (a third query exceeds it)
    assert g.principal_spent(a) == pytest.approx(e)


def test_booking_is_all_or_nothing_across_accountants():
    """A total budget spent by a concurrent writer after decide(): book() raises and writes nothing."""
    p = plan(selection="topk", k=2, public_count=2, sigma=2.0)
    acc = Accountant()
    g = gw(acc, total_epsilon_budget=5.0)
    pid = g.new_principal()
    d = decide(g, pid, {"primary": p})
    assert d.admitted
    acc.book(dp_accounting.GaussianDpEvent(0.5), "concurrent writer")   # eps ~ 10 at 1e-6
    with pytest.raises(BudgetExceeded):
        g.book(d, p, "late")
    assert g.principal_accountant(pid).count == 0 and acc.count == 1


# ------------------------------------------------------------------ durability, ids, retries
def test_state_survives_a_restart(tmp_path):
    store = DurableStore(tmp_path / "gw.sqlite")
    p = plan(receipts="noised", receipt_sigma=8.0)
    cap = (_bits(8.0, 1) + _bits(8.0, 2)) / 2
    g = gw(Accountant(store=store, name="fed"), support_budget_bits=cap)
    pid = g.new_principal()
    d0 = admit(g, pid, p)
    assert d0.admitted
    store.close()
    store2 = DurableStore(tmp_path / "gw.sqlite")
    g2 = gw(Accountant(store=store2, name="fed"), support_budget_bits=cap)
    assert g2.support_bits(pid) == pytest.approx(_bits(8.0, 1), rel=1e-9)
    assert not admit(g2, pid, p).admitted             # the budget was not reset
    assert g2.new_principal() != pid                  # ids are never reused
    assert g2.issued(d0.query_id)                     # and the old query is still known (retries compose)
    assert g2.register(pid, ["x"], [None])[0] > d0.query_id


def test_retry_of_unknown_query_is_refused_and_known_retry_is_booked():
    p = plan(selection="topk", k=2, public_count=2)
    g = gw()
    pid = g.new_principal()
    d = decide(g, pid, {"primary": p}, retry_of=999)
    assert not d.admitted and d.reasons == ("retry_unbooked",)
    first = admit(g, pid, p)
    second = admit(g, pid, p, retry_of=first.query_id)
    assert second.admitted and g.principal_accountant(pid).count == 2


def test_refusal_is_uniform():
    a, b = refusal(3), refusal(7)
    assert isinstance(a, SupportPrivacyViolation) and str(a) == str(b) == REFUSAL_TEXT
    assert set(vars(a)) == {"query_id"}


@pytest.mark.parametrize("kw, match", [
    (dict(support_budget_bits=0.0), "support_budget_bits must be positive"),
    (dict(total_support_budget_bits=-1.0), "total_support_budget_bits must be positive"),
    (dict(epsilon_budget=float("nan")), "epsilon_budget must be positive"),
    (dict(delta=0.0), "delta must be in"),
])
def test_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        gw(**kw)
    with pytest.raises(TypeError, match="accountant must be"):
        Gateway("nope")
