"""The ``audit.tightness`` experiment kind at a small size (seconds).

The same run audits the correct mechanisms and their broken variants: every broken
variant must come out with a lower bound above what it books (caught), and no correct
mechanism may (a false LEAK). The federation part runs on the shared Ray fixture with a
few canaries.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedmem.experiments import audit as AU
from fedmem.registry import get_experiment
from fedmem.report import RunContext
from fedmem.scenario import load_scenario

SMALL = ["audit.trials=20000", "audit.broken_trials=4000", "aggregator.deployed=50", "audit.plots=false",
         "memview.max_candidates=64", "dpmind.trials=4000"]


def _run(tmp_path, extra):
    sc = load_scenario("scenarios/audit_tightness.toml", SMALL + extra)
    ctx = RunContext(tmp_path / "run", sc.config["seed"], show_progress=False, quiet=True)
    return get_experiment("audit.tightness").run(sc.config, ctx)


def test_kind_is_registered():
    assert get_experiment("audit.tightness").kind == "audit.tightness"


def test_small_audit_catches_every_broken_variant_and_no_correct_one(tmp_path):
    res = _run(tmp_path, ["federation.enabled=false"])
    mech = res.metrics["mechanisms"]
    expected = {"aggregator.gaussian", "aggregator.laplace", "aggregator.receipts", "memview.em",
                "aggregator.gaussian/half_noise", "aggregator.gaussian/sensitivity_off_by_2",
                "aggregator.gaussian/fast_float_sampler", "aggregator.laplace/half_noise",
                "aggregator.receipts/missing_charge", "memview.em/sensitivity_off_by_2", "dpmind.token",
                "dpmind.token/per_coordinate_laplace"}
    assert expected <= set(mech)
    for name, m in mech.items():
        assert set(m) >= {"eps_lower", "eps_booked", "tightness", "method", "trials", "broken"}
        if m["broken"]:
            assert m["caught"] and m["eps_lower"] > m["eps_booked"], (name, m)
        else:
            assert not m["caught"] and m["eps_lower"] <= m["eps_booked"], (name, m)
            assert m["eps_lower"] <= m["eps_pair"] + 1e-9
    # even at this size the value releases are audited tightly
    assert mech["aggregator.laplace"]["tightness"] >= 0.8
    assert mech["aggregator.gaussian"]["tightness"] >= 0.6
    assert res.ok and res.metrics["all_broken_caught"]


def test_neighbour_search_finds_the_booked_sensitivity():
    rng = np.random.default_rng(0)
    for noise in ("gaussian", "laplace"):
        s_in, s_out, rows, label, frac = AU.search_value_neighbours(1.0, 3, noise, rng, 3)
        assert frac == pytest.approx(1.0)
        assert label in ("axis e_0", "diagonal")
        if noise == "laplace":      # only the diagonal reaches the L1 sensitivity 2 C sqrt(d)
            assert label == "diagonal" and max(r[3] for r in rows if r[1].startswith("axis")) < 0.6
    u_in, u_out, rows, K, loss = AU.search_em_neighbours(4.0, 1.0, 256, 100_000, 0.05)
    assert K > 2 and loss > 0.9 * 4.0 and loss <= 4.0


def test_canary_federation_data_places_each_canary_against_its_victim():
    inc = np.array([True, False, True])
    d = AU.canary_federation_data(3, 1.0, inc)
    assert d.n_shards == 3 and d.value_dim == 3
    assert [v.shape[0] for v in d.values] == [2, 1, 2]
    assert d.values[1][0, 1] == -1.0 and d.values[0][1, 0] == 1.0


@pytest.mark.slow
def test_one_federated_retrieval_is_audited(tmp_path, ray_local):
    res = _run(tmp_path, ["federation.canaries=64", "federation.retrievals=40", "federation.broken_retrievals=40",
                          "audit.trials=2000", "audit.broken_trials=2000"])
    f, fb = res.metrics["mechanisms"]["federation.retrieve"], res.metrics["mechanisms"]["federation.retrieve/half_noise"]
    assert not f["caught"] and 0 < f["eps_lower"] <= f["eps_booked"]
    assert fb["caught"]
    assert "one_run" in f["estimators"] and math.isfinite(f["estimators"]["one_run"]["eps_lower"])
