"""Hostile-shard attacks on the Ray engine (fedmem.attacks.hostile_shard), judged by the shared verdict rule.

Each game: 120 single queries per world (plaintext parties, fresh principal per trial). Power: against
the broken variant (the configuration's ring-range check removed, so the adversary's clip 1.1 * 2^45
is accepted and the ring sum wraps exactly when the target is present) the released mean's first
coordinate moves by ~2.9 noise sds while a Gaussian release at multiplier 1.2 books mu = 0.83: the
GDP audit's lower bound exceeds it in every seed tried (LEAK); the defended run stays within booked.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.attacks import hostile_shard as H
from fedmem.attacks.verdict import LEAK
from fedmem.dp import Accountant
from fedmem.federation import config as C
from fedmem.federation.config import FederationConfig
from fedmem.federation.engine import Federation


@pytest.fixture(scope="module")
def plain_parties():
    from fedmem.federation.mpc import PlaintextParties

    return PlaintextParties(2)


def _row(variant, parties, trials=120):
    def new_fed(c, d, acc, rng):
        return Federation(c, d, accountant=acc, rng=rng, parties=parties)

    return H.run_hostile_shard(variant, FederationConfig(mpc="plaintext"), new_fed,
                               lambda w: Accountant("rdp", name=f"hostile-{w}"), trials=trials,
                               rng=np.random.default_rng(7))


@pytest.mark.parametrize("broken", [False, True])
def test_near_limit_ring_wrap(ray_local, plain_parties, monkeypatch, broken):
    if broken:   # the companion broken variant: no public range check, the adversary's clip is accepted
        monkeypatch.setattr(C, "_range_problems", lambda c, selection, cap: [])
    row = _row("near_limit", plain_parties)
    assert row["answered"] == {"with": 120, "without": 120}
    verdict = row["attacks"]["value"]["verdict"]
    if broken:
        assert row["clip"] == H.NEAR_LIMIT_CLIP
        assert verdict == LEAK, row
    else:
        assert row["clip"] < H.NEAR_LIMIT_CLIP
        assert verdict != LEAK, row


@pytest.mark.parametrize("variant", ["error_text", "nonfinite", "huge", "float32"])
def test_out_of_contract_records_neutralised(ray_local, plain_parties, variant):
    row = _row(variant, plain_parties, trials=60)
    # every query answered in both worlds (no record fails the federation or the query) ...
    assert row["answered"] == {"with": 60, "without": 60}, row
    # ... and nothing separates the worlds beyond the booking
    for name, a in row["attacks"].items():
        assert a["verdict"] != LEAK, (name, row)
