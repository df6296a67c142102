"""CrypTen parties (fedmem.federation.mpc.runtime): equal to the plaintext reference, faults,
placement, sealed packets.

CrypTen parties start once per session (``crypten_parties`` in conftest.py); the fault
tests use their own short-lived instance so that killing it cannot disturb the others.
Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import os
import threading
import time
import zlib

import numpy as np
import pytest

from fedmem.errors import MpcFailure
from fedmem.federation.mpc import PlaintextParties
from fedmem.federation.sharing import SelectionSpec, share_candidates
from tests.federation.mpc.helpers import assert_same, make_candidates
from tests.federation.mpc.helpers import dead_refs as _dead_refs


# ----------------------------------------------------------------------------- CrypTen parties

CASES = [
    ("topk", SelectionSpec("topk", k=5), "rank"),
    ("topk-merge", SelectionSpec("topk", k=5), "merge"),
    ("topk-grouped", SelectionSpec("topk", k=5), "grouped"),
    ("topk-k2-grouped", SelectionSpec("topk", k=2), "grouped"),
    ("topk-k3-merge", SelectionSpec("topk", k=3), "merge"),
    ("topk-k8-merge", SelectionSpec("topk", k=8), "merge"),
    ("threshold", SelectionSpec("threshold", threshold=0.2), "auto"),
    ("broadcast", SelectionSpec("broadcast"), "auto"),
]


@pytest.mark.parametrize("name, spec, impl", CASES, ids=[c[0] for c in CASES])
def test_crypten_equals_plaintext_with_ties(crypten_parties, name, spec, impl):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    packets, (sc, vals, ok, ids) = make_candidates(rng, B=3, S=11, m=5, d=6, n_hosts=3)
    want = PlaintextParties(2).run(packets, spec)
    got = crypten_parties.run(packets, spec, impl=impl)
    assert_same(want, got)
    np.testing.assert_array_equal(got.shard_ids, np.sort(ids))
    assert got.stats["rounds"] > 0 and got.stats["bytes"] > 0 and got.stats["seconds"] > 0


def test_crypten_merge_with_trusted_shard_order(crypten_parties):
    """shards_sorted=True skips the in-MPC sort; on host-sorted input it still equals plaintext."""
    rng = np.random.default_rng(14)
    B, S, m = 3, 10, 5
    ids = np.arange(S)
    sc = np.round(rng.uniform(-1, 1, (B, S, m)), 1)
    ok = rng.random((B, S, m)) < 0.7
    key = np.where(ok, sc, -np.inf)
    order = np.argsort(-key, axis=-1, kind="stable")  # what a host sends: valid by score desc, padding last
    sc, ok = np.take_along_axis(sc, order, -1), np.take_along_axis(ok, order, -1)
    vals = rng.uniform(-1, 1, (B, S, m, 4)) * ok[..., None]
    pk = share_candidates(sc, vals, ok, ids, 2, rng)
    packets = [[pk[0]], [pk[1]]]
    spec = SelectionSpec("topk", k=5)
    crypten_parties.shards_sorted = True
    try:
        got = crypten_parties.run(packets, spec, impl="merge")
    finally:
        crypten_parties.shards_sorted = False
    assert_same(PlaintextParties(2).run(packets, spec), got)


def test_packets_may_be_object_refs_fetched_inside_each_party(crypten_parties, ray_local):
    """A host's per-party outputs can go to the parties as ObjectRefs, never through the driver."""
    rng = np.random.default_rng(16)
    packets, _ = make_candidates(rng, B=2, S=8, m=3, d=4, n_hosts=2)
    refs = [[ray_local.put(x) for x in party] for party in packets]
    spec = SelectionSpec("topk", k=4)
    want = PlaintextParties(2).run(packets, spec)
    assert_same(want, crypten_parties.run(refs, spec))
    assert_same(want, PlaintextParties(2).run(refs, spec))


def test_crypten_reveals_only_what_the_policy_names(crypten_parties):
    rng = np.random.default_rng(11)
    packets, _ = make_candidates(rng, B=2, S=6, m=3, d=4)
    for reveal in (frozenset({"count"}), frozenset({"tallies"}), frozenset({"sum"}), frozenset()):
        spec = SelectionSpec("topk", k=4, reveal=reveal)
        got = crypten_parties.run(packets, spec)
        want = PlaintextParties(2).run(packets, spec)
        for f in ("sum", "count", "tallies"):
            assert (getattr(got, f) is None) == (f not in reveal), (reveal, f)
        assert_same(want, got)


def test_naive_argmax_baseline_is_correct_without_ties(crypten_parties):
    rng = np.random.default_rng(12)
    packets, _ = make_candidates(rng, B=2, S=5, m=3, d=2, decimals=6, p_valid=1.0)
    spec = SelectionSpec("topk", k=3)
    assert_same(PlaintextParties(2).run(packets, spec), crypten_parties.run(packets, spec, impl="argmax"))


def test_crypten_parties_validate_constructor():
    from fedmem.federation.mpc import CryptenParties

    with pytest.raises(ValueError, match="n_parties must be 2 or 3"):
        CryptenParties(4)
    with pytest.raises(ValueError, match="provider must be one of"):
        CryptenParties(2, provider="HE")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        CryptenParties(2, timeout_s=0)


def test_party_faults_fail_closed_without_hanging(ray_local):
    """Timeout -> MpcFailure; next run restarts the parties; a party killed mid-query -> MpcFailure."""
    from fedmem.federation.mpc import CryptenParties

    rng = np.random.default_rng(13)
    heavy, _ = make_candidates(rng, B=150, S=40, m=5, d=8, n_hosts=2)
    small, _ = make_candidates(rng, B=1, S=4, m=2, d=2)
    spec = SelectionSpec("topk", k=5)
    cp = CryptenParties(2, timeout_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(MpcFailure, match="timed out"):
            cp.run(heavy, spec, impl="merge")
        assert time.monotonic() - t0 < 15.0
        assert cp.actors == []  # stopped: nothing half-open remains

        cp.timeout_s = 60.0
        assert_same(PlaintextParties(2).run(small, spec), cp.run(small, spec))  # restarted
        assert cp.restarts == 1

        victim = cp.actors[1]
        killer = threading.Timer(0.3, lambda: ray_local.kill(victim, no_restart=True))
        t0 = time.monotonic()
        killer.start()
        with pytest.raises(MpcFailure, match="failed"):
            cp.run(heavy, spec, impl="merge")
        killer.join()
        assert time.monotonic() - t0 < 30.0
    finally:
        cp.close()
    with pytest.raises(MpcFailure, match="closed"):
        cp.run(small, spec)


@pytest.mark.skipif(not os.environ.get("FEDMEM_SLOW_TESTS"),
                    reason="starts 3 more CrypTen party sets (~30-60 s); set FEDMEM_SLOW_TESTS=1")
@pytest.mark.parametrize("n, provider", [(3, "TFP"), (2, "TTP"), (3, "TTP")])
def test_three_parties_and_ttp_provider_equal_plaintext(ray_local, n, provider):
    from fedmem.federation.mpc import CryptenParties

    rng = np.random.default_rng(15)
    packets, _ = make_candidates(rng, B=2, S=6, m=3, d=3, n_parties=n)
    with CryptenParties(n, provider=provider, timeout_s=120.0) as cp:
        for spec, impl in [(SelectionSpec("topk", k=4), "rank"), (SelectionSpec("topk", k=4), "merge"),
                           (SelectionSpec("threshold", threshold=0.1), "auto"), (SelectionSpec("broadcast"), "auto")]:
            assert_same(PlaintextParties(n).run(packets, spec), cp.run(packets, spec, impl=impl))


# ----------------------------------------------------------------------------- placement, refs, public cost

def test_placement_is_validated_and_a_shared_node_is_announced(ray_local):
    """On one node: ``auto`` warns that the parties share it, ``spread`` refuses to start."""
    from fedmem.federation.mpc import CryptenParties, SharedNodeWarning

    with pytest.raises(ValueError, match="placement must be one of"):
        CryptenParties(2, placement="anywhere")
    with pytest.raises(MpcFailure, match="placement='spread' needs 2 alive nodes"):
        CryptenParties(2, placement="spread")
    cp = object.__new__(CryptenParties)   # the placement decision alone, without starting parties
    cp.n_parties, cp.placement, cp._pg, cp.start_timeout_s = 2, "auto", None, 10.0
    with pytest.warns(SharedNodeWarning, match="share one Ray node"):
        assert cp._placement(2) == [{}, {}]


def test_rendezvous_is_on_the_party_node_ip(crypten_parties, ray_local):
    """Rank 0 picked the rendezvous on its own node's IP (not a hard-coded loopback)."""
    ip = ray_local.util.get_node_ip_address()
    assert crypten_parties.rendezvous.startswith(f"tcp://{ip}:")
    assert [n["ip"] for n in crypten_parties.nodes] == [ip, ip]
    assert len({n["pid"] for n in crypten_parties.nodes}) == 2


def test_unfetchable_shares_fail_closed_before_the_protocol(crypten_parties, ray_local):
    """A host died: MpcFailure before any party enters the protocol; the parties stay warm."""
    rng = np.random.default_rng(17)
    packets, _ = make_candidates(rng, B=1, S=4, m=2, d=2, n_hosts=2)
    spec = SelectionSpec("topk", k=3)
    crypten_parties.run(packets, spec)   # warm (and restarted if an earlier test broke them)
    actors, restarts = crypten_parties.actors, crypten_parties.restarts
    mixed = [[packets[0][0], _dead_refs(ray_local, packets)[0][1]], packets[1]]   # party 0 cannot fetch one
    with pytest.raises(MpcFailure, match="could not be fetched"):
        crypten_parties.run(mixed, spec)
    with pytest.raises(MpcFailure, match="could not be fetched"):
        PlaintextParties(2).run(mixed, spec)
    assert crypten_parties.actors == actors and crypten_parties.restarts == restarts
    assert_same(PlaintextParties(2).run(packets, spec), crypten_parties.run(packets, spec))


def test_crypten_parties_open_sealed_packets_and_refuse_tampering(crypten_parties):
    """Secure parties open their own packets (bit-identical to the plaintext reference); a
    tampered packet fails closed before the protocol and the parties stay warm."""
    import dataclasses

    from fedmem.federation.sharing import new_run_id, seal_packet

    rng = np.random.default_rng(93)
    packets, _ = make_candidates(rng, 2, 8, 3, 4, n_hosts=2)
    spec = SelectionSpec("topk", k=4)
    keys = crypten_parties.public_keys
    assert len(keys) == 2 and all(len(k) == 32 for k in keys) and keys[0] != keys[1]
    rid = new_run_id()
    sealed = [[seal_packet(x, keys[p], rid, p) for x in packets[p]] for p in range(2)]
    assert_same(crypten_parties.run(sealed, spec, run_id=rid), PlaintextParties(2).run(packets, spec))
    ct = bytearray(sealed[1][0].ciphertext)
    ct[7] ^= 0x80
    tampered = [list(sealed[0]), [dataclasses.replace(sealed[1][0], ciphertext=bytes(ct)), sealed[1][1]]]
    actors = crypten_parties.actors
    with pytest.raises(MpcFailure, match="refused|could not"):
        crypten_parties.run(tampered, spec, run_id=rid)
    with pytest.raises(MpcFailure, match="refused|could not"):
        crypten_parties.run(sealed, spec, run_id=new_run_id())     # replay into a new run
    assert crypten_parties.actors == actors                        # no restart: nobody entered the protocol
    assert_same(crypten_parties.run(sealed, spec, run_id=rid), PlaintextParties(2).run(packets, spec))
