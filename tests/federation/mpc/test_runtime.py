"""The MPC layer: fixed-point sharing, selection semantics, CrypTen parties, faults.

CrypTen parties start once per session (``crypten_parties`` in conftest.py); the fault
tests use their own short-lived instance so that killing it cannot disturb the others.
"""

from __future__ import annotations

import os
import threading
import time
import zlib

import numpy as np
import pytest
from scipy import stats

from fedmem.errors import MpcFailure
from fedmem.federation.mpc import PlaintextParties, merge_network, plaintext_mask
from fedmem.federation.parties import Parties
from fedmem.federation.sharing import (
    FRAC_BITS, SCORE_BOUND, Revealed, SelectionSpec, SharePacket, decode, encode, reconstruct, share,
    share_candidates,
)

ALL = frozenset({"sum", "count", "tallies"})


# ----------------------------------------------------------------------------- helpers

def make_candidates(rng, B, S, m, d, *, n_parties=2, n_hosts=3, decimals=1, p_valid=0.75):
    """Random candidates on several hosts with shuffled, non-contiguous global shard ids.

    Scores are rounded to ``decimals`` so exact ties are frequent. Returns the per-party
    packet lists and the plaintext inputs.
    """
    ids = rng.permutation(3 * S)[:S].astype(np.int64)
    sc = np.round(rng.uniform(-1, 1, (B, S, m)), decimals)
    vals = rng.uniform(-1, 1, (B, S, m, d))
    ok = rng.random((B, S, m)) < p_valid
    vals[~ok] = 0.0
    sc[~ok] = -SCORE_BOUND  # what a shard host puts in padding rows (ignored by selection)
    cuts = np.array_split(np.arange(S), n_hosts)
    per_host = [share_candidates(sc[:, c], vals[:, c], ok[:, c], ids[c], n_parties, rng) for c in cuts if len(c)]
    packets = [[h[p] for h in per_host] for p in range(n_parties)]
    return packets, (sc, vals, ok, ids)


def brute_force(sc, vals, ok, ids, spec):
    """Independent reference straight from the documented semantics, one query at a time."""
    B, S, m = sc.shape
    order = np.argsort(ids)
    enc = encode(sc)
    sums, counts, tallies = [], [], []
    for b in range(B):
        cands = [(s_pos, c) for s_pos in range(S) for c in range(m) if ok[b, order[s_pos], c]]
        if spec.mode == "topk":
            cands.sort(key=lambda t: (-enc[b, order[t[0]], t[1]], ids[order[t[0]]], t[1]))
            chosen = cands[: spec.k]
        elif spec.mode == "threshold":
            chosen = [t for t in cands if enc[b, order[t[0]], t[1]] >= encode(spec.threshold)]
        else:
            chosen = cands
        tal = np.zeros(S, dtype=np.int64)
        ring = np.zeros(vals.shape[-1], dtype=np.int64)
        for s_pos, c in chosen:
            tal[s_pos] += 1
            ring += encode(vals[b, order[s_pos], c])
        sums.append(decode(ring))
        counts.append(len(chosen))
        tallies.append(tal)
    return np.array(sums), np.array(counts), np.array(tallies)


def byte_uniformity_pvalue(arr: np.ndarray) -> float:
    """Smallest chi-square p-value over the 8 byte positions of int64 ring elements."""
    b = np.ascontiguousarray(arr, dtype=np.int64).view(np.uint8).reshape(-1, 8)
    return min(stats.chisquare(np.bincount(b[:, j], minlength=256)).pvalue for j in range(8))


def assert_same(a: Revealed, b: Revealed):
    for f in ("sum", "count", "tallies"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=f)


# ----------------------------------------------------------------------------- encoding and sharing

def test_encode_decode_roundtrip_and_ring_wrap():
    x = np.array([0.0, 1.0, -1.0, 0.5, -3.25, 1e6, -1e6, 2.0**-16, 1 / 3])
    assert encode(x).dtype == np.int64
    np.testing.assert_array_equal(encode(x[:8]), np.rint(x[:8] * 2**FRAC_BITS).astype(np.int64))
    assert np.max(np.abs(decode(encode(x)) - x)) <= 2.0**-17
    # The ring wraps: shares of a negative number sum (mod 2^64) back to it.
    rng = np.random.default_rng(1)
    v = encode(np.array([-7.5, 3.0]))
    np.testing.assert_array_equal(reconstruct(share(v, 3, rng)), v)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 2.0**48])
def test_encode_rejects_unencodable(bad):
    with pytest.raises(ValueError, match="x must"):
        encode(np.array([0.0, bad]))


@pytest.mark.parametrize("n", [2, 3])
def test_share_reconstructs_extremes(n):
    rng = np.random.default_rng(2)
    i64 = np.iinfo(np.int64)
    x = np.array([0, 1, -1, i64.max, i64.min, 123456789], dtype=np.int64)
    sh = share(x, n, rng)
    assert len(sh) == n and all(s.dtype == np.int64 for s in sh)
    np.testing.assert_array_equal(reconstruct(sh), x)


def test_single_party_shares_look_uniform_whatever_the_secret():
    """Any n-1 shares are uniform on Z_2^64: chi-square per byte, for two very different secrets."""
    rng = np.random.default_rng(3)
    for secret in (0, encode(np.array([0.731]))[0]):
        x = np.full(20000, secret, dtype=np.int64)
        for p, s in enumerate(share(x, 3, rng)):
            assert byte_uniformity_pvalue(s) > 1e-4, (secret, p)


def test_uniformity_check_catches_weak_masks():
    """Companion: shares masked with 32-bit randomness (a plausible bug) are caught."""
    rng = np.random.default_rng(4)
    x = np.zeros(20000, dtype=np.int64)
    weak = rng.integers(0, 2**32, size=x.shape, dtype=np.int64)
    assert byte_uniformity_pvalue(weak) < 1e-10
    assert byte_uniformity_pvalue(x - weak) < 1e-10


# (Shard hosts are numpy-only: that importing the sharing layer and mpc pulls no torch/CrypTen is
# checked in a fresh interpreter by tests/system/test_lazy_imports.py::test_fedmem_imports_no_heavy_module,
# the one subprocess for all import checks.)


def test_share_rejects_bad_input():
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="n_parties must be >= 2"):
        share(np.zeros(3, dtype=np.int64), 1, rng)
    with pytest.raises(TypeError, match="x_int must be an int64"):
        share(np.zeros(3), 2, rng)
    with pytest.raises(TypeError, match="rng must be"):
        share(np.zeros(3, dtype=np.int64), 2, 7)


def test_share_candidates_validates_and_packs():
    rng = np.random.default_rng(6)
    sc, vals, ok = rng.uniform(-1, 1, (4, 3)), rng.normal(size=(4, 3, 2)), np.ones((4, 3))
    pk = share_candidates(sc, vals, ok, np.array([7, 2, 9, 4]), 2, rng)  # single query: batch axis added
    assert len(pk) == 2 and pk[0].scores.shape == (1, 4, 3) and pk[0].values.shape == (1, 4, 3, 2)
    np.testing.assert_array_equal(reconstruct([p.valid for p in pk]), np.ones((1, 4, 3), dtype=np.int64))
    np.testing.assert_array_equal(reconstruct([p.scores for p in pk]), encode(sc[None]))
    with pytest.raises(ValueError, match="valid must hold only 0/1"):
        share_candidates(sc, vals, ok * 2, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match=r"scores must satisfy \|score\|"):
        share_candidates(sc * 1e7, vals, ok, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match="values must have shape"):
        share_candidates(sc, vals[:, :2], ok, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match="shard_ids must be"):
        share_candidates(sc, vals, ok, np.arange(5), 2, rng)
    with pytest.raises(ValueError, match="shard_ids must be distinct"):
        SharePacket(pk[0].scores, pk[0].values, pk[0].valid, np.array([1, 1, 2, 3]))


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "best"}, "mode must be one of"),
    ({"mode": "topk", "k": 0}, "k must be >= 1"),
    ({"mode": "threshold", "threshold": float("nan")}, "threshold must be finite"),
    ({"mode": "topk", "reveal": frozenset({"sum", "ids"})}, "reveal must be a subset"),
])
def test_selection_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SelectionSpec(**kwargs)
    with pytest.raises(TypeError, match="reveal must be a set"):
        SelectionSpec("topk", reveal="sum")


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


def test_auto_choice_depends_on_public_shapes_only():
    from fedmem.federation.mpc import choose_impl, grouped_plan

    assert grouped_plan(40, 5, 5) == 4 and grouped_plan(6, 3, 4) is None
    assert choose_impl(10, 40, 5, 5) == "grouped"
    assert choose_impl(400, 40, 5, 5) == "merge"
    assert choose_impl(1, 10_000, 5, 5) == "merge"
    assert choose_impl(1, 3, 2, 2) == "rank"


def test_auto_choice_is_the_fitted_model_and_switches_where_it_predicts():
    """``auto`` follows a cost model fitted to measurements in the engine's own configuration
    (unsorted shards, 40 x 5, k = 5): the constants are the fit of the stored measurements,
    the model reproduces them, and the choice flips exactly where the predictions cross."""
    from fedmem.federation.mpc import networks as NW

    r, c = NW.fit_cost_model(NW.FIT_POINTS)
    assert r == pytest.approx(NW.ROUND_S, rel=0.01) and c == pytest.approx(NW.COMPARISON_S, rel=0.01)
    costs = NW.impl_costs(40, 5, 5)
    assert costs["grouped"] == (28, 4175) and costs["merge"] == (250, 1067)     # the engine's own shapes
    for impl, B, t in NW.FIT_POINTS:
        assert NW.predicted_seconds(B, 40, 5, 5)[impl] == pytest.approx(t, rel=0.3), (impl, B)
    sw = NW.switch_batch(40, 5, 5)
    assert sw is not None and 50 < sw < 200
    below, at = NW.predicted_seconds(sw - 1, 40, 5, 5), NW.predicted_seconds(sw, 40, 5, 5)
    assert NW.choose_impl(sw - 1, 40, 5, 5) == "grouped" and below["grouped"] <= below["merge"]
    assert NW.choose_impl(sw, 40, 5, 5) == "merge" and at["merge"] < at["grouped"]
    # trusted shard order removes the merge tree's shard sort: merge wins earlier
    assert NW.switch_batch(40, 5, 5, shards_sorted=True) < sw
    # the memory cap keeps the constant-round methods bounded whatever the model says
    assert NW.choose_impl(NW.CONSTANT_ROUNDS_MAX // 4175 + 1, 40, 5, 5) == "merge"


def test_merge_network_is_pruned_and_schedules_are_small():
    K, M, sort_layers, mix, clean = merge_network(5, 5)
    assert (K, M) == (8, 8) and mix == [3, 4]
    assert sum(map(len, sort_layers)) == 9  # optimal 5-sorter after pruning the padding
    assert sum(map(len, clean)) == 11


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


def _dead_refs(ray, packets):
    """Per-party refs to results of a shard host that died before producing them (unfetchable)."""

    @ray.remote(num_cpus=0, max_restarts=0)
    class Host:
        def packet(self, x):
            return x

    h = Host.remote()
    ray.kill(h, no_restart=True)
    return [[h.packet.remote(x) for x in party] for party in packets]


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


# ----------------------------------------------------------------------------- engine: refs and MPC cost

def _engine_cfg(**kw):
    import math

    from fedmem.federation.engine import FederationConfig

    base = dict(shards=8, records_per_shard=10, key_dim=8, value_dim=4, k_local=2, hosts=2, mpc="crypten",
                n_bound=8, timeout_s=60.0, gateway=False, receipts="expose", calibration="global",
                epsilon_budget=math.inf, total_epsilon_budget=math.inf, support_budget_bits=math.inf,
                total_support_budget_bits=math.inf)
    base.update(kw)
    return FederationConfig(**base)


@pytest.fixture(scope="module")
def small_data():
    from fedmem.bench.shards import make_clustered_shards

    return make_clustered_shards(8, 10, 8, 4, 1.0, np.random.default_rng(31), clusters=4)


def test_engine_hands_parties_refs_owned_by_the_hosts(small_data, ray_local, crypten_parties):
    """The driver relays ObjectRefs only; the hosts own them (their death makes them unfetchable)."""
    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation

    q = sample_queries(small_data, 2, np.random.default_rng(32))
    with Federation(_engine_cfg(selection="topk", k=3), small_data, accountant=Accountant(),
                    rng=np.random.default_rng(33), parties=crypten_parties) as f:
        packets = f._packets(f._queries(q), "topk")
        assert len(packets) == 2 and all(len(p) == 2 for p in packets)
        assert all(isinstance(x, ray_local.ObjectRef) for p in packets for x in p)
        got = crypten_parties.run(packets, SelectionSpec("topk", k=3))
        truth = f.ground_truth_many(q)
        np.testing.assert_array_equal(got.tallies, np.stack([t.tallies for t in truth]))
        from ray.core.generated.common_pb2 import Address

        owners = [[Address.FromString(x.owner_address()).worker_id.hex() for x in p] for p in packets]
        hosts = [w["worker_id"] for w in ray_local.get([h.where.remote() for h in f.hosts])]
        assert owners == [hosts, hosts]   # put by the hosts; the driver only borrowed the refs


def test_unfetchable_host_output_fails_the_query_closed(small_data, ray_local, crypten_parties):
    """A host's packet cannot be fetched by a party: FederationFault, nothing booked, hosts healed."""
    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.errors import FederationFault
    from fedmem.federation.engine import Federation, Response

    q = sample_queries(small_data, 2, np.random.default_rng(34))

    class LoseOnePacket(Parties):
        n_parties = 2

        def __init__(self):
            self.calls = 0

        @property
        def public_keys(self):
            return crypten_parties.public_keys

        def run(self, packets, spec, *, run_id=None):
            self.calls += 1
            if self.calls == 1:
                packets = [list(p) for p in packets]
                packets[1][1] = _dead_refs(ray_local, [[None]])[0][0]
            return crypten_parties.run(packets, spec, run_id=run_id)

        def close(self):
            return None

    acc = Accountant()
    with Federation(_engine_cfg(selection="topk", k=3), small_data, accountant=acc,
                    rng=np.random.default_rng(35), parties=LoseOnePacket()) as f:
        with pytest.raises(FederationFault, match="nothing was released or booked"):
            f.retrieve(q[0])
        assert acc.count == 0 and [a.decision for a in f.audit] == ["fault"]
        assert isinstance(f.retrieve(q[0]), Response) and acc.count > 0


def test_mpc_rounds_and_bytes_are_public_and_carried(small_data, ray_local, crypten_parties):
    """Rounds/bytes reach Response and audit, and are identical on neighbouring datasets."""
    from fedmem.bench.shards import sample_queries, with_record
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation

    q = sample_queries(small_data, 3, np.random.default_rng(36))
    rng = np.random.default_rng(37)
    key = q[0] / np.linalg.norm(q[0])       # a record that the first query will surely select
    neighbour = with_record(small_data, 3, key, rng.uniform(-0.3, 0.3, 4))
    for kw in (dict(selection="topk", k=3), dict(selection="threshold", threshold=0.3),
               dict(selection="broadcast")):
        seen = []
        for data in (small_data, neighbour):
            with Federation(_engine_cfg(**kw), data, accountant=Accountant(), rng=np.random.default_rng(38),
                            parties=crypten_parties) as f:
                rs = f.retrieve_many(q)
                one = f.retrieve(q[1])
                costs = [(r.mpc_rounds, r.mpc_bytes, r.mpc_batch) for r in rs] + [
                    (one.mpc_rounds, one.mpc_bytes, one.mpc_batch)]
                assert [(a.mpc_rounds, a.mpc_bytes, a.mpc_batch) for a in f.audit] == costs
                seen.append((costs, [t.sum.tolist() for t in f.ground_truth_many(q)]))
        (c0, rec0), (c1, rec1) = seen
        assert c0 == c1, kw                       # public: same cost whatever the records
        assert c0[0][0] > 0 and c0[0][1] > 0 and c0[0][2] == 3 and c0[-1][2] == 1
        assert rec0 != rec1, kw                   # the neighbour really changed what was selected
    with Federation(_engine_cfg(mpc="plaintext", selection="topk", k=3), small_data, accountant=Accountant(),
                    rng=np.random.default_rng(38)) as f:
        r = f.retrieve(q[0])
        assert (r.mpc_rounds, r.mpc_bytes, r.mpc_batch) == (None, None, None)


# ----------------------------------------------------------------------------- fused rounds (simulated parties)

def _simulate(gens, n, rng):
    """Run one SPMD sub-protocol per simulated party in lockstep; each round's requests are
    answered from the reconstructed plaintext with fresh random shares (an ideal functionality
    for mul/and/b2a/open), so only the protocol logic above those requests is under test."""
    import torch

    def ashare(z):
        parts = [torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=tuple(z.shape), dtype=np.int64,
                                               endpoint=True)) for _ in range(n - 1)]
        return parts + [z - sum(parts, torch.zeros_like(z))]

    def xshare(z):
        parts = [torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=tuple(z.shape), dtype=np.int64,
                                               endpoint=True)) for _ in range(n - 1)]
        last = z.clone()
        for p in parts:
            last = last ^ p
        return parts + [last]

    def xor_all(ts):
        out = ts[0].clone()
        for t in ts[1:]:
            out = out ^ t
        return out

    sends = [None] * n
    while True:
        reqs, done = [], []
        for g, s in zip(gens, sends):
            try:
                reqs.append(g.send(s))
            except StopIteration as stop:
                done.append(stop.value)
        if done:
            assert len(done) == n, "SPMD: every party finishes in the same round"
            return done                         # one return value per party
        answers = [[] for _ in range(n)]
        for j, q in enumerate(reqs[0]):
            per = [r[j] for r in reqs]
            if q[0] == "and":
                z = xor_all([p[1] for p in per]) & xor_all([p[2] for p in per])
                for a, s in zip(answers, xshare(z)):
                    a.append(s)
            elif q[0] == "mul":
                z = getattr(torch, q[1])(sum(p[2] for p in per), sum(p[3] for p in per))
                for a, s in zip(answers, ashare(z)):
                    a.append(s)
            elif q[0] == "b2a":
                bit = xor_all([p[1] for p in per]) & 1
                outs = [ashare(bit)] + [ashare(bit.reshape(bit.shape + (1,) * nd) * sum(p[2][i][0] for p in per))
                                        for i, (_, nd) in enumerate(q[2])]
                for r in range(n):
                    answers[r].append([o[r] for o in outs])
            else:
                raise AssertionError(q[0])
        sends = answers


def _ltz_parties(xs, L, n, ys=None):
    """Rounds.ltz objects for n simulated parties (the sub-protocols only read rank and n)."""
    import torch

    from fedmem.federation.mpc.rounds import Rounds

    gens = []
    for r in range(n):
        R = Rounds.__new__(Rounds)
        R.rank, R.n = r, n
        gens.append(R.ltz(torch.from_numpy(xs[r]), L, [] if ys is None else [(torch.from_numpy(ys[r]), 1)]))
    return gens


def _ltz_values(x, L, n, rng):
    """Reconstructed [x < 0] through Rounds.ltz on n simulated parties (x: int64 ring values)."""
    outs = _simulate(_ltz_parties(share(np.asarray(x, dtype=np.int64), n, rng), L, n), n, rng)
    return reconstruct([o[0].numpy() for o in outs])


@pytest.mark.parametrize("n", [2, 3])
def test_fused_comparison_is_exact_at_every_bound(n):
    """Rounds.ltz = [x < 0] for x at the edges of (-2^L, 2^L), for every L, with 2 and 3
    parties (carry-save layer); the same values with a bound one bit too small are caught."""
    from fedmem.federation.mpc.rounds import ltz_rounds

    rng = np.random.default_rng(40 + n)
    for L in (1, 2, 3, 5, 8, 13, 38, 47, 62, 63):
        top = (1 << L) - 1
        x = np.array([0, 1, -1, top, -top, top - 1, -(top - 1), 2, -2], dtype=np.int64)
        x = np.concatenate([x[np.abs(x) <= top], rng.integers(-top, top, size=40, endpoint=True)])
        for _ in range(2):   # fresh shares each time
            np.testing.assert_array_equal(_ltz_values(x, L, n, rng), (x < 0).astype(np.int64), err_msg=f"L={L}")
        if L >= 2:           # L-1 bits: the sign of |x| >= 2^(L-1) comes out wrong
            assert not np.array_equal(_ltz_values(x, L - 1, n, rng), (x < 0).astype(np.int64)), L
    assert ltz_rounds(2) == 8 and ltz_rounds(2, 5) == 5 and ltz_rounds(3) == 9


def test_fused_comparison_products_and_bounds():
    """The products fused into the conversion round equal bit * y; bits_for picks the smallest bound."""
    from fedmem.federation.mpc.rounds import bits_for

    assert [bits_for(b) for b in (0, 1, 2, 3, 4, 20, 2**62, 2**70)] == [1, 1, 2, 2, 3, 5, 63, 63]
    with pytest.raises(ValueError, match="bound"):
        bits_for(-1)
    rng = np.random.default_rng(44)
    x = rng.integers(-50, 50, size=(3, 7))
    y = rng.integers(-2**40, 2**40, size=(3, 7, 4))
    outs = _simulate(_ltz_parties(share(x, 2, rng), 6, 2, share(y, 2, rng)), 2, rng)
    bit = reconstruct([o[0].numpy() for o in outs])
    prod = reconstruct([o[1].numpy() for o in outs])
    np.testing.assert_array_equal(bit, (x < 0).astype(np.int64))
    np.testing.assert_array_equal(prod, (x < 0)[..., None] * y)


# ----------------------------------------------------------------------------- sealed share packets (issue 19)

def _sealed_fixture(rng, party=0):
    from fedmem.federation.sharing import PartyKey, new_run_id, seal_packet

    packets, _ = make_candidates(rng, 3, 6, 4, 5, n_hosts=1)
    key, rid = PartyKey(), new_run_id()
    return packets[party][0], key, rid, seal_packet(packets[party][0], key.public, rid, party)


def test_sealed_packet_opens_only_for_its_party_run_and_shards():
    """Round trip is exact; any other run, party, key, shard ids, shape, ephemeral key or byte is refused."""
    import dataclasses
    import pickle

    from fedmem.federation.sharing import PartyKey, new_run_id

    rng = np.random.default_rng(91)
    pk, key, rid, sealed = _sealed_fixture(rng)
    got = key.open(sealed, rid, 0)
    for f in ("scores", "values", "valid", "shard_ids"):
        np.testing.assert_array_equal(getattr(got, f), getattr(pk, f))
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in (pk.scores, pk.values, pk.valid))
    blob = pickle.dumps(sealed)
    assert not any(body[i:i + 16] in blob for i in range(0, len(body) - 16, 16))   # no share bytes in the clear
    ct = bytearray(sealed.ciphertext)
    ct[len(ct) // 2] ^= 1
    bad = {
        "flipped ciphertext bit": (dataclasses.replace(sealed, ciphertext=bytes(ct)), rid, 0, key),
        "other run (replay)": (dataclasses.replace(sealed, run_id=new_run_id()), None, 0, key),
        "claims another run": (sealed, new_run_id(), 0, key),
        "other party": (dataclasses.replace(sealed, party=1), rid, 1, key),
        "other key": (sealed, rid, 0, PartyKey()),
        "swapped shard ids": (dataclasses.replace(sealed, shard_ids=sealed.shard_ids[::-1].copy()), rid, 0, key),
        "other shape": (dataclasses.replace(sealed, shape=(1, 18, 4, 5)), rid, 0, key),
        "other ephemeral key": (dataclasses.replace(sealed, epk=PartyKey().public), rid, 0, key),
        "plaintext packet": (pk, rid, 0, key),
        "other aead claimed": (dataclasses.replace(sealed, aead="chacha20-poly1305"), rid, 0, key),
    }
    for what, (s, r, p, k) in bad.items():
        with pytest.raises(ValueError, match="refused"):
            k.open(s, s.run_id if r is None and hasattr(s, "run_id") else r, p)
        assert what
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    from fedmem.federation.sharing import seal_packet

    cc = seal_packet(pk, key.public, rid, 0, aead="chacha20-poly1305")   # the AEAD without AES hardware
    np.testing.assert_array_equal(key.open(cc, rid, 0).values, pk.values)
    with pytest.raises(ValueError, match="refused"):
        key.open(dataclasses.replace(cc, aead="aes-256-gcm"), rid, 0)


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


def test_engine_object_store_holds_only_ciphertext(small_data, ray_local):
    """What the hosts put in the object store are SealedPackets: an observer that fetches them
    (as any code in the cluster can) finds no share bytes; answers equal the ground truth; a
    packet replaced in the store fails the query closed with nothing booked."""
    import dataclasses
    import pickle

    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.errors import FederationFault
    from fedmem.federation.engine import Federation, Response
    from fedmem.federation.sharing import SealedPacket

    q = sample_queries(small_data, 3, np.random.default_rng(94))

    class Spy(PlaintextParties):
        def __init__(self):
            super().__init__(2)
            self.seen, self.tamper = [], False

        def run(self, packets, spec, *, run_id=None):
            self.seen.append((packets, run_id))
            if self.tamper:
                packets = [list(p) for p in packets]
                s = ray_local.get(packets[0][0])
                ct = bytearray(s.ciphertext)
                ct[-1] ^= 1
                packets[0][0] = ray_local.put(dataclasses.replace(s, ciphertext=bytes(ct)))
            return super().run(packets, spec, run_id=run_id)

    spy, acc = Spy(), Accountant()
    with Federation(_engine_cfg(mpc="plaintext", selection="topk", k=3), small_data, accountant=acc,
                    rng=np.random.default_rng(95), parties=spy) as f:
        rs = f.retrieve_many(q)
        truth = f.ground_truth_many(q)
        for r, t in zip(rs, truth):
            np.testing.assert_array_equal(r.receipts, t.tallies)
        packets, rid = spy.seen[-1]
        assert rid is not None and len(rid) == 16
        for p, row in enumerate(packets):
            for ref in row:
                s = ray_local.get(ref)              # what anyone reading the object store gets
                assert isinstance(s, SealedPacket) and s.party == p and s.run_id == rid
                plain = spy._keys[p].open(s, rid, p)
                body = b"".join(np.ascontiguousarray(a).tobytes() for a in (plain.scores, plain.values, plain.valid))
                blob = pickle.dumps(s)
                assert not any(body[i:i + 16] in blob for i in range(0, len(body) - 16, 16))
        n_booked = acc.count
        spy.tamper = True
        with pytest.raises(FederationFault, match="nothing was released or booked"):
            f.retrieve(q[0])
        assert acc.count == n_booked and f.audit[-1].decision == "fault"
        spy.tamper = False
        assert isinstance(f.retrieve(q[0]), Response)


def test_triple_keystream_is_order_exact_with_or_without_precomputation():
    """The dealer's AES-CTR keystream: what a party takes never depends on how much was
    generated ahead (both parties stay in step), the pool stays bounded, and the output
    passes the same byte-uniformity check that catches weak masks."""
    import threading

    from fedmem.federation.mpc.rounds import KeyStream

    key = bytes(range(32))
    ahead, lazy = KeyStream(key, cap_elements=5000), KeyStream(key, cap_elements=0)
    stop = threading.Event()
    got_a, got_l = [], []
    for n in (1, 7, 4096, 3, 20000, 1):
        ahead.refill(stop)                      # what the background thread does between queries
        assert ahead._pooled <= ahead.cap       # bounded memory
        got_a.append(ahead.take(n).clone())
        got_l.append(lazy.take(n).clone())
    for a, b in zip(got_a, got_l):
        assert np.array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(KeyStream(bytes(32), 0).take(64).numpy(), KeyStream(key, 0).take(64).numpy())
    assert byte_uniformity_pvalue(KeyStream(key, 0).take(60_000).numpy()) > 1e-4
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        KeyStream(b"short", 0)
