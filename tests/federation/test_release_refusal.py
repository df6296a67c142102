"""Fail closed without values: an error inside a release surfaces as the uniform refusal, byte-identical
on neighbouring worlds (type, str, repr, args, attributes, exception chain) and equal to an ordinary
refusal; nothing booked; the operator's log keeps a value-free reason.

The hostile inputs: compute parties that open a private-data-derived sum beyond the secure sampler's
range (world w: 2^40 * (w + 1)) or a count that does not fit the public plan (k + 1 + w). The companion
broken variant (data errors not converted, so the aggregator's ValueError reaches the caller with its
text) is caught by the same assertion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedmem.attacks.hostile_shard import full_chain
from fedmem.bench.shards import make_clustered_shards
from fedmem.dp import Accountant
from fedmem.errors import SupportPrivacyViolation
from fedmem.federation import compute
from fedmem.federation.config import FederationConfig
from fedmem.federation.engine import RELEASE_FAILED, Federation
from fedmem.federation.gateway import refusal
from fedmem.federation.mpc import PlaintextParties
from fedmem.federation.sharing import Revealed

CFG = FederationConfig(shards=4, records_per_shard=6, key_dim=8, value_dim=8, k_local=2, k=3, hosts=2,
                       mpc="plaintext", epsilon_budget=math.inf, total_epsilon_budget=math.inf)


class HostileParties(PlaintextParties):
    """Opens a tampered aggregate: ``how`` = "sum" (beyond the sampler's range) or "count"."""

    def __init__(self, how: str, world: int):
        super().__init__(2)
        self.how, self.world = how, world

    def run(self, packets, spec, *, run_id=None, impl="auto"):
        r = super().run(packets, spec, run_id=run_id, impl=impl)
        s, c = r.sum.copy(), r.count.copy()
        if self.how == "sum":
            s[:, 0] = 2.0**40 * (self.world + 1)
        else:
            c[:] = CFG.k + 1 + self.world
        return Revealed(sum=s, count=c, tallies=r.tallies, stats=r.stats, shard_ids=r.shard_ids)


def _observe(how: str, world: int):
    data = make_clustered_shards(CFG.shards, CFG.records_per_shard, CFG.key_dim, CFG.value_dim, CFG.clip,
                                 np.random.default_rng(0))
    q = np.ones(CFG.key_dim)
    with Federation(CFG, data, accountant=Accountant("rdp", name=f"rr-{how}-{world}"),
                    rng=np.random.default_rng(1), parties=HostileParties(how, world)) as fed:
        client = fed.connect()
        try:
            client.retrieve(q)
            return None, fed
        except Exception as exc:  # noqa: BLE001 - the observable is whatever is raised
            assert client.epsilon_spent == 0.0     # nothing booked
            return exc, fed


def _assert_uniform(how):
    seen = []
    for world in (0, 1):
        exc, fed = _observe(how, world)
        assert exc is not None
        seen.append(full_chain(exc))
        assert type(exc) is SupportPrivacyViolation
        assert exc.__cause__ is None and exc.__context__ is None
        assert full_chain(exc) == full_chain(refusal(exc.query_id))
        assert fed.audit[-1].decision == "fault" and RELEASE_FAILED in fed.audit[-1].reasons
        assert fed.audit[-1].booking_ids == ()
        for line in fed.fault_details:        # the operator's details: stage and type only
            assert "Found" not in line and "2199023255552" not in line and "1099511627776" not in line
    assert seen[0] == seen[1]


@pytest.mark.parametrize("how", ["sum", "count"])
def test_release_errors_are_the_uniform_refusal(ray_local, how):
    _assert_uniform(how)


@pytest.mark.parametrize("how", ["sum", "count"])
def test_broken_variant_is_caught(ray_local, monkeypatch, how):
    monkeypatch.setattr(compute, "DATA_ERRORS", ())   # data errors escape with their text
    with pytest.raises(AssertionError):
        _assert_uniform(how)
