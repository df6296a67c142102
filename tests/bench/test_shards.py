"""Synthetic clustered shards (fedmem.bench.shards), and shards generated at the hosts from a recipe.

The shard hosts' local step is tested in tests/federation/test_shard_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.bench.shards import make_clustered_shards, sample_queries, with_record, without_record
from fedmem.federation.shard_host import split_shards


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(40, 30, 32, 16, 1.0, np.random.default_rng(7))


def test_shapes_norms_and_determinism(data):
    assert data.n_shards == 40 and data.key_dim == 32 and data.value_dim == 16
    for k, v in zip(data.keys, data.values):
        assert k.shape == (30, 32) and v.shape == (30, 16)
        np.testing.assert_allclose(np.linalg.norm(k, axis=1), 1.0, atol=1e-12)
        assert np.all(np.linalg.norm(v, axis=1) <= 1.0 + 1e-12)
    again = make_clustered_shards(40, 30, 32, 16, 1.0, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(data.keys, again.keys))
    other = make_clustered_shards(40, 30, 32, 16, 1.0, np.random.default_rng(8))
    assert not np.array_equal(data.keys[0], other.keys[0])


def test_contributing_set_depends_on_query(data):
    """papers/003: 3 to 40 of 40 shards contributed depending on the query."""
    qs = sample_queries(data, 200, np.random.default_rng(1))
    best = np.stack([(np.stack(data.keys) @ q).max(axis=1) for q in qs])  # (200, 40) best score per shard
    n = (best >= 0.5).sum(axis=1)
    assert n.min() <= 6 and n.max() >= 36
    assert len(np.unique(n)) >= 5


def test_neighbours(data):
    key = np.ones(32)
    value = np.full(16, 0.1)
    bigger = with_record(data, 3, key, value, text="x")
    assert bigger.sizes[3] == 31 and bigger.sizes.sum() == data.sizes.sum() + 1
    np.testing.assert_allclose(bigger.keys[3][-1], key / np.linalg.norm(key))
    back = without_record(bigger, 3, 30)
    assert all(np.array_equal(a, b) for a, b in zip(back.keys, data.keys))
    assert all(np.array_equal(a, b) for a, b in zip(back.values, data.values))
    assert data.sizes[3] == 30  # the original is untouched (frozen, copied)


@pytest.mark.parametrize("call, match", [
    (lambda d: with_record(d, 40, np.ones(32), np.zeros(16)), "shard must be < 40"),
    (lambda d: with_record(d, 0, np.zeros(32), np.zeros(16)), "key must be non-zero"),
    (lambda d: with_record(d, 0, np.ones(32), np.ones(16)), "value must have L2 norm <= clip"),
    (lambda d: with_record(d, 0, np.ones(31), np.zeros(16)), "key must have last dimension 32"),
    (lambda d: without_record(d, 0, 30), "index must be < 30"),
    (lambda d: sample_queries(d, 3, np.random.default_rng(0), kind="nope"), "kind must be one of"),
    (lambda d: make_clustered_shards(0, 3, 4, 4, 1.0, np.random.default_rng(0)), "shards must be >= 1"),
    (lambda d: make_clustered_shards(3, 3, 4, 4, -1.0, np.random.default_rng(0)), "clip must be positive"),
])
def test_bad_input_is_named(data, call, match):
    with pytest.raises(ValueError, match=match):
        call(data)


def test_rng_must_be_injected():
    with pytest.raises(TypeError, match="rng must be"):
        make_clustered_shards(3, 3, 4, 4, 1.0, rng=1)


def test_query_kinds_are_unit(data):
    for kind in ("cluster", "record", "uniform"):
        q = sample_queries(data, 20, np.random.default_rng(3), kind=kind)
        assert q.shape == (20, 32)
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-12)


# ----------------------------------------------------------------------------- data generated at the hosts

def test_recipe_shards_are_identical_wherever_generated():
    from fedmem.bench.shards import ShardRecipe

    r = ShardRecipe(shards=9, records_per_shard=6, key_dim=8, value_dim=4, seed=7, clusters=4)
    whole = r.build()
    again = ShardRecipe(shards=9, records_per_shard=6, key_dim=8, value_dim=4, seed=7, clusters=4).build()
    for cuts in (split_shards(9, 1), split_shards(9, 3), [np.array([8, 0, 4]), np.array([1, 2, 3, 5, 6, 7])]):
        for ids in cuts:
            keys, values = r.shards_for(ids)   # what one host generates for its range, in its own order
            for i, k, v in zip(ids, keys, values):
                np.testing.assert_array_equal(k, whole.keys[i])
                np.testing.assert_array_equal(v, whole.values[i])
    for i in range(9):
        np.testing.assert_array_equal(whole.keys[i], again.keys[i])
        assert np.allclose(np.linalg.norm(whole.keys[i], axis=1), 1.0)
        assert np.all(np.linalg.norm(whole.values[i], axis=1) <= 1.0 + 1e-12)
    other = ShardRecipe(shards=9, records_per_shard=6, key_dim=8, value_dim=4, seed=8, clusters=4).build()
    assert not np.array_equal(other.keys[0], whole.keys[0])
    np.testing.assert_array_equal(r.centers, whole.centers)
    assert r.sizes.tolist() == [6] * 9 and r.n_shards == 9


@pytest.mark.parametrize("kw, match", [(dict(seed=-1), "seed"), (dict(shards=0), "shards"),
                                        (dict(dtype="int8"), "dtype"), (dict(min_prevalence=2.0), "min_prevalence")])
def test_recipe_rejects_bad_input(kw, match):
    from fedmem.bench.shards import ShardRecipe

    base = dict(shards=4, records_per_shard=3, key_dim=4, value_dim=2, seed=1)
    with pytest.raises(ValueError, match=match):
        ShardRecipe(**{**base, **kw})


def test_host_generating_its_shards_equals_host_given_them():
    from fedmem.bench.shards import ShardRecipe
    from fedmem.federation.shard_host import ShardHostCore

    r = ShardRecipe(shards=6, records_per_shard=5, key_dim=8, value_dim=4, seed=3, clusters=3)
    d = r.build()
    ids = np.array([1, 4, 5])
    a = ShardHostCore(ids, None, None, recipe=r, clip=1.0, k_local=2, n_parties=2, seed=11)
    b = ShardHostCore(ids, [d.keys[i] for i in ids], [d.values[i] for i in ids], clip=1.0, k_local=2,
                      n_parties=2, seed=11)
    q = np.random.default_rng(2).standard_normal((3, 8))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for x, y in zip(a.plain_candidates(q, "topk"), b.plain_candidates(q, "topk")):
        np.testing.assert_array_equal(x, y)
    for pa, pb in zip(a.candidates(q, "topk"), b.candidates(q, "topk")):   # same seed: same shares too
        np.testing.assert_array_equal(pa.scores, pb.scores)
    with pytest.raises(ValueError, match="keys and values must be None"):
        ShardHostCore(ids, [d.keys[1]], [d.values[1]], recipe=r, clip=1.0, k_local=2, n_parties=2, seed=1)


def test_federation_over_host_generated_data_equals_single_process_data(ray_local):
    import math

    from fedmem.bench.shards import ShardRecipe
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation, FederationConfig

    r = ShardRecipe(shards=8, records_per_shard=10, key_dim=8, value_dim=4, seed=5, clusters=4)
    cfg = FederationConfig(shards=8, records_per_shard=10, key_dim=8, value_dim=4, k_local=2, hosts=3, mpc="plaintext",
                           selection="threshold", threshold=0.3, n_bound=8, gateway=False, receipts="expose",
                           calibration="global", epsilon_budget=math.inf, total_epsilon_budget=math.inf,
                           support_budget_bits=math.inf, total_support_budget_bits=math.inf)
    import dataclasses

    import ray

    q = sample_queries(r.build(), 4, np.random.default_rng(6))
    out = []
    # the recipe itself; ShardData built by it (carries the recipe: hosts still generate);
    # the same records without the recipe (sent from the driver)
    for data, generated in ((r, True), (r.build(), True), (dataclasses.replace(r.build(), recipe=None), False)):
        with Federation(cfg, data, accountant=Accountant(), rng=np.random.default_rng(9)) as f:
            assert [x["generated"] for x in ray.get([h.info.remote() for h in f.hosts])] == [generated] * 3
            rs = f.retrieve_many(q)
            truth = f.ground_truth_many(q)
            out.append(([x.receipts.tolist() for x in rs], [x.value.tolist() for x in rs],
                        [t.sum.tolist() for t in truth]))
    assert out[0] == out[1] == out[2]


def test_scenario_data_generated_at_hosts_is_deterministic_and_neighbours_drop_the_recipe():
    import dataclasses

    from fedmem.bench.shards import ShardRecipe, clustered_data, with_record, without_record

    kw = dict(clusters=4, spread=0.3)
    a = clustered_data(7, 5, 8, 4, 1.0, np.random.default_rng(3), at_hosts=True, **kw)
    b = clustered_data(7, 5, 8, 4, 1.0, np.random.default_rng(3), at_hosts=True, **kw)
    assert isinstance(a.recipe, ShardRecipe) and a.recipe == b.recipe
    ref = a.recipe.build()     # what the hosts generate, shard by shard
    for x, y in ((a, ref), (a, b)):
        for i in range(7):
            np.testing.assert_array_equal(x.keys[i], y.keys[i])
            np.testing.assert_array_equal(x.values[i], y.values[i])
    assert (a.recipe.clusters, a.recipe.spread, a.recipe.clip) == (4, 0.3, 1.0)
    plain = clustered_data(7, 5, 8, 4, 1.0, np.random.default_rng(3), **kw)
    assert plain.recipe is None
    assert not np.array_equal(plain.keys[0], a.keys[0])     # a different random stream (documented)
    # a modified neighbour must be sent by the driver: hosts regenerating it would hide the change
    assert with_record(a, 2, np.ones(8), np.zeros(4)).recipe is None
    assert without_record(a, 2, 0).recipe is None
    with pytest.raises(ValueError, match="recipe must describe"):
        dataclasses.replace(plain, recipe=ShardRecipe(shards=6, records_per_shard=5, key_dim=8, value_dim=4, seed=1))
    with pytest.raises(TypeError, match="recipe must be a ShardRecipe"):
        dataclasses.replace(plain, recipe="seed 3")
    with pytest.raises(TypeError, match="at_hosts"):
        clustered_data(7, 5, 8, 4, 1.0, np.random.default_rng(3), at_hosts="yes")
