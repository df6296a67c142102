"""The adaptive adversary (fedmem.attacks.adaptive) against a synthetic engine: it probes every family, then
refines; it is deterministic given its rng and re-queries a refused family once, as a declared retry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fedmem.attacks.adaptive import AdaptiveAdversary


@dataclass(frozen=True)
class Resp:
    value: np.ndarray
    count: float | None = None
    receipts: np.ndarray | None = None


# ------------------------------------------------------------------ adversary
def _fake_engine(centres, shards=40):
    """Support grows as the query approaches a centre: n = #shards with cos > 0.5 ... synthetic."""
    owners = np.arange(shards) % len(centres)

    def answer(q):
        sims = centres @ q
        radius = np.clip((sims[owners] - 0.2) * 1.4, 0, 1)
        tallies = (radius > np.linspace(0.05, 0.95, shards)).astype(int)
        return Resp(np.zeros(8), float(tallies.sum()), tallies)

    return answer


def test_adaptive_adversary_probes_then_refines(rng):
    d = 16
    centres = rng.normal(size=(4, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    engine = _fake_engine(centres)
    adv = AdaptiveAdversary(centres + 0.1 * rng.normal(size=centres.shape), np.random.default_rng(1),
                            shards=40, k_local=5)
    seen = []
    for _ in range(60):
        p = adv.next_query()
        assert p.q.shape == (d,) and np.isclose(np.linalg.norm(p.q), 1.0)
        seen.append(adv.observe(p, engine(p.q)))
    assert [adv.log[i][1] for i in range(4)] == [f"family-{i}" for i in range(4)]  # probe pass
    assert len(set(seen)) > 5                      # it explores a range of supports
    # deterministic given the injected rng
    adv2 = AdaptiveAdversary(centres + 0.0, np.random.default_rng(1), shards=40, k_local=5)
    adv3 = AdaptiveAdversary(centres + 0.0, np.random.default_rng(1), shards=40, k_local=5)
    for _ in range(10):
        a, b = adv2.next_query(), adv3.next_query()
        assert np.array_equal(a.q, b.q)
        adv2.observe(a, engine(a.q)), adv3.observe(b, engine(b.q))


def test_adaptive_adversary_requeries_rejected_family_as_declared_retry(rng):
    centres = np.eye(3)
    adv = AdaptiveAdversary(centres, np.random.default_rng(2), shards=10, k_local=2)
    first = adv.next_query()
    adv.observe(first, None)                     # refused by the gateway
    retry = adv.next_query()
    assert retry.retry_of == first.index and retry.family == first.family
    adv.observe(retry, None)
    nxt = adv.next_query()
    assert nxt.retry_of is None                  # retried once only
    silent = AdaptiveAdversary(centres, np.random.default_rng(2), shards=10, k_local=2, declare_retries=False)
    f = silent.next_query()
    silent.observe(f, None)
    assert silent.next_query().retry_of is None


def test_adaptive_adversary_validates():
    with pytest.raises(TypeError, match="rng"):
        AdaptiveAdversary(np.eye(3), 0, shards=3, k_local=1)
    with pytest.raises(ValueError, match="explore"):
        AdaptiveAdversary(np.eye(3), np.random.default_rng(0), shards=3, k_local=1, explore=2.0)
    with pytest.raises(ValueError, match="anchors"):
        AdaptiveAdversary(np.ones(3), np.random.default_rng(0), shards=3, k_local=1)
