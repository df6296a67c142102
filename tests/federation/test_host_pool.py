"""Shard hosts are reused across the federations of one driver (fedmem.federation.host_pool):
same results as new actors, no data left in an idle host, a dead pooled host replaced silently,
a faulted federation's hosts never reused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedmem.bench.shards import make_clustered_shards, sample_queries
from fedmem.dp import Accountant
from fedmem.federation import host_pool
from fedmem.federation.engine import Federation, FederationConfig

S, N, KD, VD = 8, 12, 8, 4


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(S, N, KD, VD, 1.0, np.random.default_rng(3), clusters=4)


@pytest.fixture(scope="module")
def queries(data):
    return sample_queries(data, 6, np.random.default_rng(4))


def fed(data, seed=1, **kw):
    base = dict(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, mpc="plaintext", hosts=2, k_local=2,
                selection="topk", k=4, n_bound=S, timeout_s=20.0, receipts="noised", calibration="realized",
                epsilon_budget=math.inf, total_epsilon_budget=math.inf, support_budget_bits=math.inf,
                total_support_budget_bits=math.inf)
    base.update(kw)
    return Federation(FederationConfig(**base), data, accountant=Accountant(), rng=np.random.default_rng(seed))


def _answers(f, queries):
    return [(r.value.tolist(), None if r.receipts is None else r.receipts.tolist(), r.count, r.epsilon_spent)
            for r in f.retrieve_many(queries)]


def _pids(ray, f):
    return [ray.get(h.where.remote())["pid"] for h in f.hosts]


def test_a_closed_federations_hosts_serve_the_next_one_with_the_same_results(data, queries, ray_local):
    for actor in host_pool.clear():                  # start from an empty pool (other tests of this worker)
        ray_local.kill(actor)
    with fed(data) as f:
        first = _answers(f, queries)
        pids = _pids(ray_local, f)
        idle = list(f.hosts)
    assert host_pool.idle() == 2
    # an idle pooled host holds no data: every data method fails
    with pytest.raises(Exception, match="AttributeError|has no attribute"):
        ray_local.get(idle[0].candidates.remote(queries[:1], "topk"), timeout=20)
    with fed(data) as f:                            # same seed: the reused hosts must give the same answers
        assert sorted(_pids(ray_local, f)) == sorted(pids) and host_pool.idle() == 0
        assert _answers(f, queries) == first
    # a pooled host that died while idle is replaced by a new actor; the federation does not fail
    alive, dead = host_pool.take("DEFAULT"), host_pool.take("DEFAULT")
    ray_local.kill(dead)
    host_pool.give("DEFAULT", alive)
    host_pool.give("DEFAULT", dead)                 # taken first (last in)
    with fed(data) as f:
        assert _answers(f, queries) == first
        assert len(set(_pids(ray_local, f)) - set(pids)) >= 1


def test_a_faulted_federations_hosts_are_killed_not_pooled(data, queries, ray_local):
    for actor in host_pool.clear():
        ray_local.kill(actor)
    with fed(data, timeout_s=2.0) as f:
        f.retrieve(queries[0])
        f.hosts[0].stall.remote(6.0)                # the next query times out: the hosts are suspect
        with pytest.raises(Exception, match="timed out"):
            f.retrieve(queries[1])
    assert host_pool.idle() == 0
