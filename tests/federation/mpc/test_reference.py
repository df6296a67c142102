"""The plaintext reference parties (fedmem.federation.mpc.reference): selection semantics, tie
break, malformed and tampered packets.

Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.errors import MpcFailure
from fedmem.federation.mpc import PlaintextParties, plaintext_mask
from fedmem.federation.sharing import SelectionSpec, reconstruct, share_candidates
from tests.federation.mpc.helpers import assert_same, brute_force, make_candidates


# ----------------------------------------------------------------------------- plaintext reference

def test_tie_break_is_lower_shard_id_then_lower_candidate_index():
    rng = np.random.default_rng(7)
    # Shard ids 5 and 2 (on different hosts), 2 candidates each, all scores tied at 0.5;
    # one invalid row with a huge score must never be selected.
    sc = np.array([[[0.5, 0.5]], [[0.5, 9.0]]])  # host A: shard 5, host B: shard 2
    ok = np.array([[[1, 1]], [[1, 0]]])
    vals = np.array([[[[1.0], [2.0]]], [[[4.0], [0.0]]]])
    hA = share_candidates(sc[0], vals[0], ok[0], np.array([5]), 2, rng)
    hB = share_candidates(sc[1], vals[1], ok[1], np.array([2]), 2, rng)
    packets = [[hA[p], hB[p]] for p in range(2)]
    r = PlaintextParties(2).run(packets, SelectionSpec("topk", k=2))
    # order: (shard 2, c0)=4.0 first, then (shard 5, c0)=1.0; (shard 5, c1) loses the tie.
    np.testing.assert_array_equal(r.shard_ids, [2, 5])
    np.testing.assert_array_equal(r.tallies, [[1, 1]])
    np.testing.assert_allclose(r.sum, [[5.0]])
    assert r.count.tolist() == [2]
    # fewer valid than k: all valid ones, never a padding row
    r = PlaintextParties(2).run(packets, SelectionSpec("topk", k=10))
    assert r.count.tolist() == [3] and r.tallies.tolist() == [[1, 2]]


@pytest.mark.parametrize("spec", [SelectionSpec("topk", k=5), SelectionSpec("topk", k=1),
                                  SelectionSpec("threshold", threshold=0.3), SelectionSpec("broadcast")])
def test_plaintext_parties_match_brute_force(spec):
    rng = np.random.default_rng(8)
    packets, (sc, vals, ok, ids) = make_candidates(rng, B=4, S=9, m=4, d=3, n_parties=3)
    r = PlaintextParties(3).run(packets, spec)
    s, c, t = brute_force(sc, vals, ok, ids, spec)
    np.testing.assert_array_equal(r.sum, s)
    np.testing.assert_array_equal(r.count, c)
    np.testing.assert_array_equal(r.tallies, t)
    np.testing.assert_array_equal(r.shard_ids, np.sort(ids))


def test_tie_data_is_sensitive_to_the_tie_break():
    """The equality tests below can fail: on their data a reversed tie-break selects differently."""
    rng = np.random.default_rng(9)
    packets, (sc, vals, ok, ids) = make_candidates(rng, B=6, S=12, m=5, d=4)
    from fedmem.federation.mpc import assemble

    scores = reconstruct([assemble(p)[0] for p in packets])
    valid = reconstruct([assemble(p)[2] for p in packets])
    spec = SelectionSpec("topk", k=5)
    good = plaintext_mask(scores, valid, spec)
    flipped = plaintext_mask(scores[:, ::-1], valid[:, ::-1], spec)[:, ::-1]  # higher index wins ties
    assert np.any(good != flipped)


def test_run_rejects_malformed_packets():
    rng = np.random.default_rng(10)
    packets, _ = make_candidates(rng, B=1, S=4, m=2, d=2)
    pp = PlaintextParties(2)
    with pytest.raises(ValueError, match="one entry per party"):
        pp.run(packets[:1], SelectionSpec("topk"))
    with pytest.raises(ValueError, match="same number of host packets"):
        pp.run([packets[0], packets[1][:1]], SelectionSpec("topk"))
    with pytest.raises(TypeError, match="spec must be a SelectionSpec"):
        pp.run(packets, "topk")


def test_plaintext_reference_refuses_tampered_or_unsealed_packets():
    from fedmem.federation.sharing import new_run_id, seal_packet

    rng = np.random.default_rng(92)
    packets, _ = make_candidates(rng, 2, 6, 3, 4, n_hosts=2)
    spec = SelectionSpec("topk", k=3)
    pp = PlaintextParties(2)
    rid = new_run_id()
    sealed = [[seal_packet(x, pp.public_keys[p], rid, p) for x in packets[p]] for p in range(2)]
    assert_same(pp.run(sealed, spec, run_id=rid), pp.run(packets, spec))
    with pytest.raises(MpcFailure, match="refused"):
        pp.run(sealed, spec, run_id=new_run_id())                   # replayed into another run
    with pytest.raises(MpcFailure, match="refused"):
        pp.run([sealed[1], sealed[0]], spec, run_id=rid)            # swapped between parties
    with pytest.raises(MpcFailure, match="refused"):
        pp.run(packets, spec, run_id=rid)                           # unsealed where sealing is expected
    with pytest.raises(MpcFailure, match="need the run id"):
        pp.run(sealed, spec)


def test_plaintext_parties_decrypt_into_kept_buffers_and_stay_correct():
    """Sealed share packets open into buffers the parties keep between runs (the same buffer object
    the next batch), and every run's output still equals brute force, also for a second batch of other
    data and size decrypted into the same buffers; a run while another holds the buffers (the lock)
    allocates afresh and is correct too; packets above the kept total get fresh buffers. PartyKey.open
    with ``into`` gives the shares a fresh open gives, as views of ``into`` (too small: a fresh buffer),
    and a tampered packet is refused with or without it."""
    import dataclasses

    from fedmem.federation.mpc import reference
    from fedmem.federation.sharing import PartyKey, new_run_id, seal_packet

    def sealed_run(pp, rng, B):
        packets, (sc, vals, ok, ids) = make_candidates(rng, B, 6, 3, 4, n_hosts=2)
        rid = new_run_id()
        sealed = [[seal_packet(x, pp.public_keys[p], rid, p) for x in packets[p]] for p in range(2)]
        spec = SelectionSpec("topk", k=3)
        r = pp.run(sealed, spec, run_id=rid)
        want = brute_force(sc, vals, ok, ids, spec)
        for got, w in zip((r.sum, r.count, r.tallies), want):
            np.testing.assert_array_equal(got, w)

    rng = np.random.default_rng(93)
    pp = PlaintextParties(2)
    sealed_run(pp, rng, 4)
    kept = dict(pp._buffers)
    assert len(kept) == 4 and all(b.dtype == np.uint8 for b in kept.values())
    sealed_run(pp, rng, 3)                                # smaller batch, other data: same buffers
    assert all(pp._buffers[k] is b for k, b in kept.items())
    with pp._lock:                                        # another run holds them: this one allocates
        sealed_run(pp, rng, 4)
    assert all(pp._buffers[k] is b for k, b in kept.items())
    small = PlaintextParties(2)
    old_cap = reference.KEPT_BUFFER_BYTES
    reference.KEPT_BUFFER_BYTES = 100
    try:
        sealed_run(small, rng, 4)
        assert small._buffers == {}
    finally:
        reference.KEPT_BUFFER_BYTES = old_cap

    key, rid = PartyKey(), new_run_id()
    packets, _ = make_candidates(rng, 2, 4, 3, 5, n_hosts=1)
    sealed = seal_packet(packets[0][0], key.public, rid, 0)
    fresh = key.open(sealed, rid, 0)
    into = np.empty(len(sealed.ciphertext) + 64, dtype=np.uint8)
    got = key.open(sealed, rid, 0, into=into)
    for f in ("scores", "values", "valid"):
        np.testing.assert_array_equal(getattr(got, f), getattr(fresh, f))
        assert np.shares_memory(getattr(got, f), into)
    tiny = np.empty(8, dtype=np.uint8)
    assert not np.shares_memory(key.open(sealed, rid, 0, into=tiny).values, tiny)
    bad = sealed.ciphertext.copy()
    bad[3] ^= 1
    for buf in (None, into):
        with pytest.raises(ValueError, match="failed authentication"):
            key.open(dataclasses.replace(sealed, ciphertext=bad), rid, 0, into=buf)


def test_value_rows_read_assembles_layout_without_concatenating():
    """value_rows(packets, b, n) equals assemble(packets)[1][b, n] for hosts with shuffled, non-contiguous
    shard ids (the plaintext reference reads selected rows this way)."""
    from fedmem.federation.mpc.layout import assemble, value_rows

    rng = np.random.default_rng(11)
    packets, _ = make_candidates(rng, B=5, S=10, m=3, d=4, n_hosts=3)
    for p in packets:
        full = assemble(p)[1]
        b = rng.integers(0, 5, 40)
        n = rng.integers(0, 30, 40)
        np.testing.assert_array_equal(value_rows(p, b, n), full[b, n])
        assert assemble(p, values=False)[1] is None


def test_plaintext_parties_take_impl_like_the_secure_parties():
    """``impl`` is part of the Parties contract: the reference checks it as CryptenParties does (an
    unknown value is a ValueError naming it) and selects the same records whichever protocol is named."""
    from fedmem.federation.mpc import IMPLS

    rng = np.random.default_rng(94)
    packets, _ = make_candidates(rng, 3, 6, 3, 4, n_hosts=2)
    spec = SelectionSpec("topk", k=3)
    pp = PlaintextParties(2)
    want = pp.run(packets, spec)
    for impl in IMPLS:
        assert_same(pp.run(packets, spec, impl=impl), want)
    with pytest.raises(ValueError, match="impl must be one of .* Found 'fastest'"):
        pp.run(packets, spec, impl="fastest")
