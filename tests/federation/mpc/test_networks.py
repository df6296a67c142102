"""Selection networks and the public choice between them (fedmem.federation.mpc.networks).

Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import pytest

from fedmem.federation.mpc import merge_network


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
