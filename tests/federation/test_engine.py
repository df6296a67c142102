"""Federation engine end to end: hosts -> parties -> aggregator -> gateway, faults, CrypTen."""

from __future__ import annotations

import math
import time

import dp_accounting
import numpy as np
import pytest

from fedmem.bench.shards import make_clustered_shards, sample_queries, with_record
from fedmem.dp import Accountant
from fedmem.errors import FederationFault, SupportPrivacyViolation
from fedmem.federation.engine import Federation, FederationConfig, Response
from fedmem.federation.parties import Parties

S, N, KD, VD = 12, 20, 16, 8


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(S, N, KD, VD, 1.0, np.random.default_rng(3), clusters=6)


@pytest.fixture(scope="module")
def queries(data):
    return sample_queries(data, 24, np.random.default_rng(4))


UNDEFENDED = dict(gateway=False, receipts="expose", calibration="global", epsilon_budget=math.inf,
                  total_epsilon_budget=math.inf, support_budget_bits=math.inf, total_support_budget_bits=math.inf)


def cfg(**kw):
    """Undefended papers/003 federation unless a test asks for more (the defaults are defended)."""
    base = dict(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, mpc="plaintext", hosts=1, k_local=2,
                selection="threshold", threshold=0.5, n_bound=S, timeout_s=20.0, **UNDEFENDED)
    base.update(kw)
    return FederationConfig(**base)


def fed(data, ray_local, accountant=None, seed=1, **kw):
    return Federation(cfg(**kw), data, accountant=accountant or Accountant(), rng=np.random.default_rng(seed))


# ------------------------------------------------------------------ undefended pipeline
def test_undefended_receipts_are_exact_and_unaccounted(data, queries, ray_local):
    with fed(data, ray_local, hosts=2) as f:
        rs = f.retrieve_many(queries)
        truths = f.ground_truth_many(queries)
        assert all(isinstance(r, Response) for r in rs)
        for r, t in zip(rs, truths):
            assert r.channels == ("value", "receipts", "count", "value:calibration")
            np.testing.assert_array_equal(r.receipts, t.tallies)  # exact: the support channel leaks
            assert r.count == t.count
        counts = {t.contributors for t in truths}
        assert len(counts) >= 3  # the contributing set depends on the query
        assert all(a.unaccounted == ("receipts", "count", "value:calibration") for a in f.audit)
        # only the value channel was booked: the accountant does not cover the receipts
        assert f.accountant.count == len(queries)
        assert rs[-1].epsilon_spent == pytest.approx(f.accountant.spent(1e-6))   # one (anonymous) principal
        assert rs[-1].epsilon_spent > rs[0].epsilon_spent


def test_single_and_batched_paths_agree(data, queries, ray_local):
    with fed(data, ray_local, seed=5) as f:
        one = [f.retrieve(q) for q in queries[:4]]
        many = f.retrieve_many(queries[:4])
        for x, y in zip(one, many):
            np.testing.assert_array_equal(x.receipts, y.receipts)
            assert x.count == y.count
        assert [r.query_id for r in one + many] == list(range(8))


def test_value_is_the_noised_mean(data, queries, ray_local):
    with fed(data, ray_local, selection="topk", k=3, calibration="realized", receipts="suppress", sigma=0.5) as f:
        errs = []
        for q in queries[:12]:
            r, t = f.retrieve(q), f.ground_truth(q)
            assert r.channels == ("value",) and r.count is None and r.receipts is None
            errs.append(r.value - t.sum / 3)
        sd = 0.5 * 2.0 / 3  # sigma * 2C / k on each coordinate
        assert np.std(np.concatenate(errs)) == pytest.approx(sd, rel=0.25)


def test_differencing_exact_receipts_reveal_membership(data, queries, ray_local):
    """Cardinality differencing (papers/003): exposed receipts differ between neighbouring datasets."""
    q = queries[0]
    with fed(data, ray_local, k_local=1) as f:
        without = f.retrieve(q).receipts
        shard = int(np.flatnonzero(f.ground_truth(q).tallies == 0)[0])  # a shard that does not contribute
    with fed(with_record(data, shard, q, np.full(VD, 0.1)), ray_local, k_local=1) as f:
        with_ = f.retrieve(q).receipts
    assert with_[shard] == 1 and without[shard] == 0  # the candidate's membership, read off one receipt
    np.testing.assert_array_equal(np.delete(with_, shard), np.delete(without, shard))


# ------------------------------------------------------------------ gateway in the engine
DEFENDED = dict(gateway=True, calibration="realized")


def test_default_config_is_defended():
    c = FederationConfig()
    assert c.gateway and c.calibration == "realized" and c.selection == "topk" and c.receipts == "suppress"
    assert all(math.isfinite(v) for v in c.budgets.values())


def test_gateway_refuses_unbookable_releases_uniformly_and_books_nothing(data, queries, ray_local):
    with pytest.warns(UserWarning, match="every query of this federation will be refused"):
        f = fed(data, ray_local, **DEFENDED)
    with f:
        client = f.connect()
        with pytest.raises(SupportPrivacyViolation) as ei:
            client.retrieve(queries[0])
        assert str(ei.value) == "no memory available for this query" and set(vars(ei.value)) == {"query_id"}
        assert f.accountant.count == 0 and client.responses == [] and len(client.refusals) == 1
        rs = client.retrieve_many(queries[:6])
        assert all(isinstance(r, SupportPrivacyViolation) for r in rs)
        assert len({str(r) for r in rs}) == 1
        assert all(a.decision == "refused" and a.channels == () and a.reasons == ("unbookable",) for a in f.audit)
        assert all(a.realized_n is None for a in f.audit)   # refused before anything was computed


def test_refusals_are_identical_on_neighbouring_datasets(data, queries, ray_local):
    """What a refused agent receives does not depend on the records (type, text, attributes, length)."""
    q = queries[0]
    seen = []
    for d in (data, with_record(data, 0, q, np.full(VD, 0.1))):
        with pytest.warns(UserWarning):
            f = fed(d, ray_local, **DEFENDED)
        with f:
            rs = f.connect().retrieve_many(np.repeat(q[None], 3, axis=0))
            seen.append([(type(r).__name__, str(r), len(str(r)), sorted(vars(r))) for r in rs])
    assert seen[0] == seen[1]


def test_rerun_broadcast_answers_support_safely(data, queries, ray_local):
    with fed(data, ray_local, on_reject="rerun_broadcast", **DEFENDED) as f:
        r = f.connect().retrieve(queries[1])
        assert r.selection == "broadcast" and np.all(r.receipts == 2.0) and r.count == S * 2
        assert f.audit[-1].decision == "admitted_fallback" and f.audit[-1].reasons == ("unbookable",)
        assert f.audit[-1].unaccounted == () and f.accountant.count == 1


def test_global_calibration_with_threshold_cannot_be_defended():
    with pytest.raises(ValueError, match="cannot be defended") as ei:
        cfg(gateway=True, calibration="global", selection="threshold")
    assert "calibration='realized'" in str(ei.value) and "gateway=False" in str(ei.value)
    cfg(gateway=True, calibration="global", selection="topk", k=3)   # public count: allowed, booked as delivered


def test_noised_receipts_charged_per_principal_not_per_label(data, queries, ray_local):
    acc = Accountant()
    with fed(data, ray_local, acc, selection="threshold", receipts="noised", receipt_sigma=6.0,
             support_budget_bits=2.0, total_support_budget_bits=3.0, **DEFENDED) as f:
        a = f.connect()
        rs = a.retrieve_many(queries[:8], families=[f"fresh-{i}" for i in range(8)])   # labels do not help
        ok = [r for r in rs if isinstance(r, Response)]
        assert 1 <= len(ok) < 8
        assert all(isinstance(r, SupportPrivacyViolation) for r in rs[len(ok):])
        assert ok[0].receipts.dtype == np.float64 and ok[0].channels == ("value", "receipts", "count")
        assert acc.count == len(ok) and a.support_bits_spent <= 2.0
        b = f.connect()                       # a second principal has its own budget ...
        got = [isinstance(r, Response) for r in b.retrieve_many(queries[:8])]
        assert any(got)
        assert f.gateway.support_bits(None) <= 3.0 + 1e-9   # ... but the total caps the Sybil


def test_retry_of_unknown_query_rejected_and_known_retry_composes(data, queries, ray_local):
    with fed(data, ray_local, receipts="broadcast", **DEFENDED) as f:
        c = f.connect()
        with pytest.raises(SupportPrivacyViolation):
            c.retrieve(queries[0], retry_of=1234)
        assert f.audit[-1].reasons == ("retry_unbooked",)
        first = c.retrieve(queries[0], family="a")
        retry = c.retrieve(queries[0] + 0.01, family="b", retry_of=first.query_id)
        silent = c.retrieve(queries[0])
        assert silent.epsilon_spent > retry.epsilon_spent > first.epsilon_spent
        assert f.audit[-2].retry_of == first.query_id


def test_epsilon_budget_refusal_releases_nothing(data, queries, ray_local):
    """Booking precedes release: once a budget refuses, no response is built; the refusal is uniform."""
    acc = Accountant()
    with fed(data, ray_local, acc, selection="topk", k=3, receipts="broadcast", epsilon_budget=10.0,
             total_epsilon_budget=15.0, **DEFENDED) as f:
        a = f.connect()
        rs = a.retrieve_many(queries[:6])
        ok = [r for r in rs if isinstance(r, Response)]
        assert 1 <= len(ok) < 6 and all(isinstance(r, SupportPrivacyViolation) for r in rs[len(ok):])
        assert acc.count == len(ok) and a.epsilon_spent <= 10.0
        assert [x.reasons for x in f.audit].count(("epsilon_budget",)) == 6 - len(ok)
        b = f.connect()
        assert sum(isinstance(r, Response) for r in b.retrieve_many(queries[:6])) >= 1
        assert acc.spent(1e-6) <= 15.0
        from fedmem.dp.accountant import event_from_dict

        assert event_from_dict(ok[0].event) == dp_accounting.GaussianDpEvent(1.2)


def _batched_run(data, queries, ray_local, monkeypatch, one_by_one: bool):
    """Two principals, noised receipts (support bits booked), budgets that run out mid-batch."""
    from fedmem.federation.gateway import Gateway

    if one_by_one:
        monkeypatch.setattr(Gateway, "book_many", lambda self, items: None)     # the query-by-query path
    else:
        def no_single_bookings(*a, **k):
            raise AssertionError("the batch fell back to booking query by query")
        monkeypatch.setattr(Gateway, "book", no_single_bookings)
    acc = Accountant()
    with fed(data, ray_local, acc, seed=7, receipts="noised", receipt_sigma=6.0, epsilon_budget=12.0,
             total_epsilon_budget=40.0, support_budget_bits=3.0, total_support_budget_bits=8.0, **DEFENDED) as f:
        a, b = f.connect(), f.connect()
        principals = [a.principal if i % 3 else b.principal for i in range(12)]
        rs = f.retrieve_many(queries[:12], principal=principals)
        rs += a.retrieve_many(queries[12:16])
        names = {a.principal.label: "A", b.principal.label: "B"}        # labels are random: compare by role
        ledger = [(x.event, " ".join(names.get(w.split("=")[-1], w) for w in x.label.split())) for x in acc.history]
        audit = [(r.query_id, r.decision, r.reasons, r.leak_bits, r.booking_ids) for r in f.audit]
    out = [(type(r).__name__, getattr(r, "epsilon_spent", None), getattr(r, "count", None)) for r in rs]
    return out, ledger, audit


def test_a_batch_booked_in_one_transaction_equals_booking_query_by_query(data, queries, ray_local, monkeypatch):
    """retrieve_many books every admitted release of a batch in one transaction (Gateway.book_many);
    what it returns, logs and writes is what booking them one by one gives: the same responses and
    refusals, each response's epsilon_spent the principal's spend right after it (to the last bit),
    the audit's support bits and booking ids, the same ledger rows in the same order."""
    batched = _batched_run(data, queries, ray_local, monkeypatch, one_by_one=False)
    monkeypatch.undo()
    one_by_one = _batched_run(data, queries, ray_local, monkeypatch, one_by_one=True)
    assert batched == one_by_one
    kinds = [k for k, _, _ in batched[0]]
    assert "Response" in kinds and "SupportPrivacyViolation" in kinds      # budgets ran out mid-batch
    spent = [e for k, e, _ in batched[0][:12] if k == "Response"]
    assert len(set(spent)) > 2                                              # per-response, not per-batch


def test_principals_are_issued_not_chosen(data, ray_local, tmp_path):
    from fedmem.dp import DurableStore

    store = DurableStore(tmp_path / "fed.sqlite")
    with fed(data, ray_local, Accountant(store=store, name="fed")) as f:
        ids = [f.connect().principal for _ in range(3)]
        assert len(set(ids)) == 3
        with pytest.raises(ValueError, match="principal must be an id this federation issued"):
            f.connect("i-choose-my-own")
        assert f.connect(ids[0]).principal == ids[0]   # operator re-attaches a known principal
    with fed(data, ray_local, Accountant(store=store, name="fed")) as f:   # restart on the same store
        assert f.connect().principal not in ids


def test_huge_and_tiny_queries_are_normalised_not_zeroed(data, queries, ray_local):
    with fed(data, ray_local) as f:
        t = f.ground_truth(queries[0])
        for scale in (1e300, 1e-300):
            assert f.ground_truth(queries[0] * scale).count == t.count
            r = f.retrieve(queries[0] * scale)
            np.testing.assert_array_equal(r.receipts, t.tallies)


def test_batch_size_is_limited(data, queries, ray_local):
    with fed(data, ray_local, max_batch=4) as f:
        with pytest.raises(ValueError, match="max_batch=4"):
            f.retrieve_many(queries[:5])


# ------------------------------------------------------------------ faults
def test_host_killed_mid_query_fails_closed_then_recovers(data, queries, ray_local):
    """The host dies while the query waits on it: the query fails closed well before the timeout."""
    import threading

    with fed(data, ray_local, hosts=2, timeout_s=30.0) as f:
        f.retrieve(queries[0])
        booked = f.accountant.count
        f.hosts[1].stall.remote(20.0)  # the host is busy: the next query's request waits in its queue
        outcome = {}

        def query():
            try:
                outcome["r"] = f.retrieve(queries[1])
            except Exception as exc:  # noqa: BLE001 - inspected below
                outcome["e"] = exc

        t0 = time.perf_counter()
        th = threading.Thread(target=query)
        th.start()
        time.sleep(1.0)
        ray_local.kill(f.hosts[1], no_restart=True)  # mid-query
        th.join(timeout=40)
        assert not th.is_alive() and time.perf_counter() - t0 < 25.0
        assert isinstance(outcome.get("e"), FederationFault) and "r" not in outcome
        assert "nothing was released or booked" in str(outcome["e"])
        assert f.accountant.count == booked and [a.decision for a in f.audit] == ["admitted", "fault"]
        assert isinstance(f.retrieve(queries[1]), Response)  # dead host re-created from the data


class _FlakyParties(Parties):
    """Plaintext parties that fail on the ``fail_on``-th run call (counting from 1)."""

    n_parties = 2

    def __init__(self, fail_on: int):
        from fedmem.federation.mpc import PlaintextParties

        self.inner, self.calls, self.fail_on = PlaintextParties(2), 0, fail_on

    def run(self, packets, spec, *, run_id=None, impl="auto"):
        from fedmem.errors import MpcFailure

        self.calls += 1
        if self.calls == self.fail_on:
            raise MpcFailure(f"party 1 died in run {self.calls}")
        return self.inner.run(packets, spec, run_id=run_id, impl=impl)

    @property
    def public_keys(self):
        return self.inner.public_keys


@pytest.mark.parametrize("fail_on", [1, 2])
def test_batch_fault_in_either_route_books_nothing(data, queries, ray_local, fail_on):
    """A batch answered partly by the primary route and partly by the broadcast fallback: a party
    failing in the first or in the second computation books nothing for the whole batch."""
    acc = Accountant()
    f = Federation(cfg(selection="topk", k=3, receipts="noised", receipt_sigma=6.0, support_budget_bits=1.5,
                       on_reject="rerun_broadcast", **DEFENDED),
                   data, accountant=acc, rng=np.random.default_rng(2), parties=_FlakyParties(fail_on))
    with f:
        c = f.connect()
        with pytest.raises(FederationFault, match="nothing was released or booked"):
            c.retrieve_many(queries[:4])
        assert acc.count == 0 and c.epsilon_spent == 0.0 and c.support_bits_spent == 0.0
        assert [a.decision for a in f.audit] == ["fault"] * 4
        routes = f.gateway   # the reservations were dropped: the next batch is decided afresh
        rs = c.retrieve_many(queries[:4])
        kinds = [r.selection for r in rs]
        assert kinds[0] == "topk" and "broadcast" in kinds     # both routes were really exercised
        assert acc.count == 4 and routes.support_bits(c.principal) <= 1.5


def test_shard_host_killed_between_routes_books_nothing(data, queries, ray_local):
    """The shard host dies after the primary route's computation, before the fallback's: the
    whole batch fails closed and nothing of the primary route is booked either."""
    acc = Accountant()
    holder = {}

    class KillHostAfterFirstRun(_FlakyParties):
        def run(self, packets, spec, *, run_id=None, impl="auto"):
            out = self.inner.run(packets, spec, run_id=run_id, impl=impl)
            if self.calls == 0:
                ray_local.kill(holder["f"].hosts[0], no_restart=True)
            self.calls += 1
            return out

    f = Federation(cfg(selection="topk", k=3, receipts="noised", receipt_sigma=6.0, support_budget_bits=1.5,
                       on_reject="rerun_broadcast", timeout_s=10.0, **DEFENDED),
                   data, accountant=acc, rng=np.random.default_rng(2), parties=KillHostAfterFirstRun(0))
    holder["f"] = f
    with f:
        c = f.connect()
        with pytest.raises(FederationFault, match="shard hosts"):
            c.retrieve_many(queries[:4])
        assert acc.count == 0 and c.epsilon_spent == 0.0


def test_hung_host_times_out(data, queries, ray_local):
    with fed(data, ray_local, timeout_s=2.0) as f:
        f.hosts[0].stall.remote(30.0)  # occupies the (single-threaded) actor
        t0 = time.perf_counter()
        with pytest.raises(FederationFault, match="timed out"):
            f.retrieve(queries[0])
        assert time.perf_counter() - t0 < 10.0
        assert f.accountant.count == 0


def test_shard_host_actor_has_no_torch_and_bad_queries_are_named(data, ray_local):
    f = fed(data, ray_local)
    info = ray_local.get(f.hosts[0].info.remote(), timeout=20)
    assert info["torch_loaded"] is False and info["shards"] == S
    import platform

    # the host keeps its freed batch arrays in its heap (fedmem._malloc), where glibc allows it
    assert info["malloc_kept"] is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    with pytest.raises(ValueError, match="q must have shape"):
        f.retrieve(np.ones(KD + 1))
    with pytest.raises(ValueError, match="q must be non-zero"):
        f.retrieve(np.zeros(KD))
    f.close()
    assert ray_local.is_initialized()  # attached to the session's Ray: not shut down
    with pytest.raises(FederationFault, match="closed"):
        f.retrieve(np.ones(KD))


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("kw, match", [
    (dict(sigma=0.0), "sigma must be positive"),
    (dict(delta=1.5), "delta must be in the open interval"),
    (dict(k=100), "k=100 is larger than the candidates sent, shards\\*k_local=24"),
    (dict(selection="random"), "selection must be one of"),
    (dict(receipts="leak"), "receipts must be one of"),
    (dict(hosts=13), "hosts=13 exceeds shards=12"),
    (dict(parties=4, mpc="crypten"), "parties: must be 2 or 3"),
    (dict(threshold=2.0), "threshold must be in \\[-1.0, 1.0\\], found 2.0"),
    (dict(k_local=N + 1), "k_local=21 exceeds records_per_shard=20"),
    (dict(epsilon_budget=0.0), "epsilon_budget must be positive"),
    (dict(max_batch=0), "max_batch must be positive, found 0"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_data_must_match_config(data, ray_local):
    with pytest.raises(ValueError, match="data must match config.key_dim=32"):
        Federation(cfg(key_dim=32), data, accountant=Accountant(), rng=np.random.default_rng(0))


# ------------------------------------------------------------------ CrypTen end to end
def test_crypten_engine_matches_ground_truth(data, queries, ray_local, crypten_parties):
    for kw in (dict(selection="topk", k=4), dict(selection="threshold", threshold=0.5)):
        f = Federation(cfg(mpc="crypten", hosts=2, **kw), data, accountant=Accountant(),
                       rng=np.random.default_rng(2), parties=crypten_parties)
        try:
            rs = f.retrieve_many(queries[:6])
            for r, t in zip(rs, f.ground_truth_many(queries[:6])):
                np.testing.assert_array_equal(r.receipts, t.tallies)
                assert r.count == t.count
        finally:
            f.close()
        assert not math.isnan(rs[0].epsilon_spent)


class _DeadParties(Parties):
    """Stands in for compute parties whose actor died: ``run`` raises ``MpcFailure`` (the mpc contract)."""

    n_parties = 2

    def run(self, packets, spec, *, run_id=None, impl="auto"):
        from fedmem.errors import MpcFailure

        raise MpcFailure("party 1 died (RayActorError)")


def test_parties_must_implement_the_contract(data, ray_local):
    """A duck-typed stand-in (right attributes, not a Parties) is refused at construction, naming
    the parameter; a Parties with the wrong count too."""
    class DuckParties:
        n_parties = 2

        def run(self, packets, spec, *, run_id=None, impl="auto"):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"parties must implement .*Parties.*Found DuckParties"):
        Federation(cfg(), data, accountant=Accountant(), rng=np.random.default_rng(2), parties=DuckParties())

    class Three(_DeadParties):
        n_parties = 3

    with pytest.raises(ValueError, match=r"parties must have n_parties=2. Found 3"):
        Federation(cfg(), data, accountant=Accountant(), rng=np.random.default_rng(2), parties=Three())


def test_failed_compute_parties_fail_closed(data, queries, ray_local):
    f = Federation(cfg(), data, accountant=Accountant(), rng=np.random.default_rng(2), parties=_DeadParties())
    with f:
        with pytest.raises(FederationFault, match="compute parties failed"):
            f.retrieve(queries[0])
        assert f.accountant.count == 0 and [a.decision for a in f.audit] == ["fault"]


def test_killed_crypten_party_fails_closed(data, queries, ray_local, crypten_parties):
    """A real kill of a CrypTen party actor mid-run (the session parties restart on their next run)."""
    with Federation(cfg(mpc="crypten"), data, accountant=Accountant(), rng=np.random.default_rng(2),
                    parties=crypten_parties) as f:
        f.retrieve(queries[0])
        booked = f.accountant.count
        ray_local.kill(crypten_parties.actors[1], no_restart=True)
        with pytest.raises(FederationFault, match="compute parties failed"):
            f.retrieve(queries[1])
        assert f.accountant.count == booked
