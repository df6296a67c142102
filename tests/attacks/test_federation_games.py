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
