"""The federation games' declared public facts (fedmem.attacks.federation_games): replace-one neighbours keep
shard sizes public, and each world is judged against its own booking."""

from __future__ import annotations

import numpy as np
import pytest


# ------------------------------------------------------------------ declared public facts
def _topk_answers(data, k_local: int, k: int) -> bool:
    """The engine's public-count decision (fedmem.federation.engine): top-k answers with a public
    denominator only when the shards hold k candidates."""
    return int(np.minimum(data.sizes, k_local).sum()) >= k


def test_replace_one_neighbours_keep_shard_sizes_public():
    """A federation holding k-1 candidates: with add/remove neighbours the target's presence flips
    the top-k decision (a channel decided from shard sizes); with replace-one neighbours (the games'
    default: shard sizes are a declared public parameter) both worlds decide alike."""
    from fedmem.attacks.federation_games import neighbours
    from fedmem.bench.shards import make_clustered_shards, without_record

    rng = np.random.default_rng(0)
    data = make_clustered_shards(2, 3, 8, 4, 1.0, rng, clusters=2)
    small = without_record(data, 0, 0)                     # sizes (2, 3): 5 candidates, k = 6
    key, value = rng.standard_normal(8), rng.standard_normal(4)
    value /= np.linalg.norm(value)
    ar = neighbours(small, 0, key, value, "add-remove", rng)
    assert _topk_answers(ar["with"], 3, 6) and not _topk_answers(ar["without"], 3, 6)
    r1 = neighbours(small, 0, key, value, "replace-one", rng)
    assert np.array_equal(r1["with"].sizes, r1["without"].sizes)
    assert _topk_answers(r1["with"], 3, 6) == _topk_answers(r1["without"], 3, 6)
    filler = r1["without"].keys[0][-1]
    assert abs(float(filler @ key) / np.linalg.norm(key)) < 1e-9    # orthogonal: not what the query selects
    with pytest.raises(ValueError, match="relation"):
        neighbours(small, 0, key, value, "swap", rng)


def test_each_world_is_judged_against_its_own_booking():
    """A world that booked 0 (it refused) is not judged against the other world's booking."""
    from fedmem.attacks.federation_games import booked_per_world
    from fedmem.attacks.verdict import judge

    g = {"booked_pos": [4.25] * 60, "booked_neg": [0.0] * 60}
    bp, bn, b = booked_per_world(g)
    assert (bp, bn, b) == (4.25, 0.0, 0.0)
    pos, neg = np.ones(60), np.zeros(60)                  # answered vs refused: exact separation
    assert judge(pos, neg, b).label == "LEAK"
    # the old rule (max over both worlds) read the same channel as no leak
    assert judge(pos, neg, max(bp, bn)).label != "LEAK"


def _relevant_selection_reference(data, q, f):
    """relevant_selection as it was before its per-shard memo: one pass over every shard."""
    qn = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    shards, total, count = 0, np.zeros(data.value_dim), 0
    for k, v in zip(data.keys, data.values):
        sc = k @ qn
        top = np.argsort(-sc, kind="stable")[: f.k_local]
        sel = top[sc[top] >= f.threshold]
        if sel.size:
            shards += 1
            total += v[sel].sum(axis=0)
            count += sel.size
    return shards, (total / count if count else None), count


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relevant_selection_reuses_shared_shards_and_equals_one_full_pass(dtype):
    """The two worlds of a membership game share every shard's arrays but one; relevant_selection keeps
    each shard's selection for the last query and reuses it: for queries asked world after world (and
    worlds asked query after query, so the memo is both reused and invalidated), every answer equals a
    full pass bit for bit (float32 and float64 data, ragged shards). The query aimed at the inserted
    record gets different answers in the two worlds (asserted), so a memo keyed by shard position
    rather than by the shard's arrays would be caught here."""
    from fedmem.attacks.federation_games import neighbours, relevant_selection
    from fedmem.bench.shards import make_clustered_shards
    from fedmem.federation.config import FederationConfig

    rng = np.random.default_rng(11)
    data = make_clustered_shards(30, 12, 16, 8, 1.0, rng, clusters=4, dtype=dtype)
    data = type(data)(keys=[k[: 6 + i % 7] for i, k in enumerate(data.keys)],
                      values=[v[: 6 + i % 7] for i, v in enumerate(data.values)], centers=data.centers,
                      clip=data.clip)
    f = FederationConfig(shards=30, records_per_shard=12, key_dim=16, value_dim=8, k_local=3,
                         selection="threshold", threshold=0.3)
    key = data.centers[1] / np.linalg.norm(data.centers[1])
    value = np.full(8, 0.2)
    worlds = neighbours(data, 7, key, value, "replace-one", np.random.default_rng(12))
    queries = [key, *rng.normal(size=(5, 16)), data.centers[2]]
    for q in queries:                          # world after world for each query: the memo is reused
        for w in ("without", "with"):
            got, want = relevant_selection(worlds[w], q, f), _relevant_selection_reference(worlds[w], q, f)
            assert got[0] == want[0] and got[2] == want[2]
            assert (got[1] is None) == (want[1] is None)
            if got[1] is not None:
                np.testing.assert_array_equal(got[1], want[1])
    for w in ("with", "without"):               # query after query for each world: the memo is replaced
        for q in queries:
            got, want = relevant_selection(worlds[w], q, f), _relevant_selection_reference(worlds[w], q, f)
            assert got[2] == want[2] and (got[1] is None or np.array_equal(got[1], want[1]))
    a, b = (relevant_selection(worlds[w], key, f) for w in ("without", "with"))
    assert a[2] != b[2] or not np.array_equal(a[1], b[1])
