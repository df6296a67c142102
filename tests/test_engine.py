"""Federation engine end to end: hosts -> parties -> aggregator -> gateway, faults, CrypTen."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from fedmem.bench.shards import make_clustered_shards, sample_queries, with_record
from fedmem.dp import Accountant
from fedmem.errors import FederationFault, SupportPrivacyViolation
from fedmem.federation.client import MemoryClient
from fedmem.federation.engine import Federation, FederationConfig, Response

S, N, KD, VD = 12, 20, 16, 8


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(S, N, KD, VD, 1.0, np.random.default_rng(3), clusters=6)


@pytest.fixture(scope="module")
def queries(data):
    return sample_queries(data, 24, np.random.default_rng(4))


def cfg(**kw):
    base = dict(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, mpc="plaintext", hosts=1, k_local=2,
                selection="threshold", threshold=0.5, n_bound=S, timeout_s=20.0)
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
            assert r.channels == ("value", "receipts", "count")
            np.testing.assert_array_equal(r.receipts, t.tallies)  # exact: the support channel leaks
            assert r.count == t.count
        counts = {t.contributors for t in truths}
        assert len(counts) >= 3  # the contributing set depends on the query
        assert all(a.unaccounted == ("receipts", "count") for a in f.audit)
        # only the value channel was booked: the accountant does not cover the receipts
        assert f.accountant.count == len(queries)
        assert rs[-1].epsilon_spent == pytest.approx(f.accountant.spent(1e-6))
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
def test_gateway_rejects_leaky_responses_and_books_nothing(data, queries, ray_local):
    with fed(data, ray_local, gateway=True) as f:
        client = MemoryClient(f, family="agent")
        with pytest.raises(SupportPrivacyViolation, match="no memory available") as ei:
            client.retrieve(queries[0])
        assert "support_leak" in ei.value.reasons and ei.value.booked == ()
        assert f.accountant.count == 0 and client.responses == [] and len(client.refusals) == 1
        rs = f.retrieve_many(queries[:6])
        assert all(isinstance(r, SupportPrivacyViolation) for r in rs)
        assert all(a.decision == "rejected" and a.channels == () for a in f.audit)


def test_rerun_broadcast_releases_support_safe_answer(data, queries, ray_local):
    with fed(data, ray_local, gateway=True, on_reject="rerun_broadcast") as f:
        r = f.retrieve(queries[1])
        assert r.selection == "broadcast" and np.all(r.receipts == 2.0) and r.count == S * 2
        assert f.audit[-1].decision == "admitted_rerun" and "support_leak" in f.audit[-1].reasons
        assert f.audit[-1].unaccounted == () and f.accountant.count == 1


def test_global_calibration_mismatch_rejected(data, queries, ray_local):
    with fed(data, ray_local, gateway=True, receipts="broadcast", calibration="global", n_bound=400) as f:
        with pytest.raises(SupportPrivacyViolation) as ei:
            f.retrieve(queries[0])
        assert ei.value.reasons == ("calibration_mismatch",)


def test_noised_receipts_admitted_until_family_budget(data, queries, ray_local):
    acc = Accountant()
    with fed(data, ray_local, acc, gateway=True, selection="topk", k=3, receipts="noised",
             receipt_sigma=6.0, support_budget_bits=2.0, calibration="realized") as f:
        rs = f.retrieve_many(queries[:8], families=["fam"] * 8)
        ok = [r for r in rs if isinstance(r, Response)]
        assert 1 <= len(ok) < 8
        assert all(isinstance(r, SupportPrivacyViolation) for r in rs[len(ok):])
        assert ok[0].receipts.dtype == np.float64 and ok[0].channels == ("value", "receipts", "count")
        assert acc.count == len(ok)  # value + receipts of each admitted query, one composed booking each
        assert isinstance(f.retrieve(queries[9], family="fresh"), Response)


def test_retry_of_unknown_query_rejected_and_known_retry_composes(data, queries, ray_local):
    with fed(data, ray_local, gateway=True, receipts="broadcast", calibration="realized") as f:
        with pytest.raises(SupportPrivacyViolation) as ei:
            f.retrieve(queries[0], retry_of=1234)
        assert ei.value.reasons == ("retry_unbooked",)
        first = f.retrieve(queries[0], family="a")
        retry = f.retrieve(queries[0] + 0.01, family="b", retry_of=first.query_id)
        assert retry.epsilon_spent > first.epsilon_spent
        assert f.audit[-1].family == "a" and f.audit[-1].retry_of == first.query_id


def test_budget_refusal_releases_nothing(data, queries, ray_local):
    """Booking precedes release: once the accountant's budget refuses, no response is built."""
    from fedmem.errors import BudgetExceeded

    acc = Accountant(budget=(10.0, 1e-6))
    with fed(data, ray_local, acc, selection="topk", k=3, receipts="broadcast", calibration="realized") as f:
        rs = f.retrieve_many(queries[:6])
        ok = [r for r in rs if isinstance(r, Response)]
        assert 1 <= len(ok) < 6 and all(isinstance(r, BudgetExceeded) for r in rs[len(ok):])
        assert acc.count == len(ok) and acc.spent(1e-6) <= 10.0
        assert [a.decision for a in f.audit].count("budget_exceeded") == 6 - len(ok)
        with pytest.raises(BudgetExceeded):
            f.retrieve(queries[7])


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
        assert f.accountant.count == booked and len(f.audit) == 1
        assert isinstance(f.retrieve(queries[1]), Response)  # dead host re-created from the data


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
    (dict(k=100), "k must be <= shards \\* k_local"),
    (dict(selection="random"), "selection must be one of"),
    (dict(receipts="leak"), "receipts must be one of"),
    (dict(hosts=13), "hosts must be <= shards"),
    (dict(parties=4, mpc="crypten"), "parties must be 2 or 3"),
    (dict(threshold=2.0), "threshold must be a cosine similarity"),
    (dict(tolerance=-1), "tolerance must be >= 0"),
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


class _DeadParties:
    """Stands in for compute parties whose actor died: ``run`` raises ``MpcFailure`` (the mpc contract)."""

    n_parties = 2

    def run(self, packets, spec):
        from fedmem.errors import MpcFailure

        raise MpcFailure("party 1 died (RayActorError)")

    def close(self):
        return None


def test_failed_compute_parties_fail_closed(data, queries, ray_local):
    f = Federation(cfg(), data, accountant=Accountant(), rng=np.random.default_rng(2), parties=_DeadParties())
    with f:
        with pytest.raises(FederationFault, match="compute parties failed"):
            f.retrieve(queries[0])
        assert f.accountant.count == 0 and f.audit == []


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
