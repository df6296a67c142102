"""fedmem.federation.compute: the plain Engine the gateway wraps (Federation in engine.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.bench.shards import make_clustered_shards, sample_queries
from fedmem.dp import Accountant
from fedmem.errors import FederationFault, SupportPrivacyViolation
from fedmem.federation.client import CapabilityService, MemoryClient
from fedmem.federation.compute import Computation, Engine
from fedmem.federation.engine import Federation, FederationConfig, Response

S, N, KD, VD = 8, 12, 16, 8


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(S, N, KD, VD, 1.0, np.random.default_rng(5), clusters=4)


def cfg(**kw):
    base = dict(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, mpc="plaintext", hosts=1, k_local=2,
                selection="topk", k=4, timeout_s=20.0, receipts="suppress")
    base.update(kw)
    return FederationConfig(**base)


def test_engine_computes_releases_without_principals_or_booking(data, ray_local):
    q = sample_queries(data, 3, np.random.default_rng(6))
    with Engine(cfg(), data, rng=np.random.default_rng(7)) as eng:
        done = eng.compute(eng.queries(q), eng.policy)
        assert isinstance(done, Computation) and len(done.releases) == 3
        assert done.mpc == {"mpc_rounds": None, "mpc_bytes": None, "mpc_batch": None}   # plaintext reference
        assert all(r.value.shape == (VD,) for r in done.releases)
        assert eng.timings["runs"] == 1
        with pytest.raises(TypeError, match="policy must be a ReleasePolicy"):
            eng.compute(eng.queries(q), "topk")
    with pytest.raises(FederationFault, match="closed"):
        eng.compute(eng.queries(q), eng.policy)


def test_gateway_calls_the_engine_once_per_admitted_route_and_never_for_a_refused_batch(data, ray_local):
    q = sample_queries(data, 4, np.random.default_rng(8))
    with Federation(cfg(epsilon_budget=1e9, total_epsilon_budget=1e9), data, accountant=Accountant(),
                    rng=np.random.default_rng(9)) as f:
        calls = []
        real = f.engine.compute
        f.engine.compute = lambda qq, policy: calls.append((len(qq), policy.selection)) or real(qq, policy)
        client = f.connect()
        got = client.retrieve_many(q)
        assert all(isinstance(r, Response) for r in got) and calls == [(4, "topk")]
        assert client.epsilon_spent == pytest.approx(f.spent(client.principal)) and client.epsilon_spent > 0
        # a forged capability: every query is refused before anything is computed
        forged = MemoryClient(f, principal="p-not-issued")
        calls.clear()
        got = forged.retrieve_many(q)
        assert all(isinstance(r, SupportPrivacyViolation) for r in got) and calls == []
        assert forged.epsilon_spent == 0.0 and f.support_bits_spent("p-not-issued") == 0.0


def test_memory_client_needs_a_capability_service():
    assert issubclass(Federation, CapabilityService)
    with pytest.raises(TypeError, match="federation must be a Federation"):
        MemoryClient(object(), principal="x")
