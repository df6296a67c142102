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
from fedmem.registry import load_scenario

SMALL = ["audit.trials=20000", "audit.broken_trials=4000", "aggregator.deployed=50", "audit.plots=false",
         "flower.enabled=false", "brace.enabled=false",
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


# ------------------------------------------------------------------ Flower rounds and one BRACE step
def _section(tmp_path, fn, extra):
    sc = load_scenario("scenarios/audit_tightness.toml", SMALL + extra)
    ctx = RunContext(tmp_path / "run", sc.config["seed"], show_progress=False, quiet=True)
    book = AU.Book(sc.config.audit.alpha / 8, sc.config.audit.delta)
    rows: list = []
    fn(sc.config, ctx, book, rows)
    return book.mechanisms, rows


def test_flower_rounds_audited_broken_wrappers_caught(tmp_path):
    """Both Flower wrappers through fedmem.flower.harness (20 deployed rounds per world, the rest batched
    from the same sampler): the correct ones stay within what they book, half the noise and a sensitivity
    off by 2 are caught by the same GDP-fit test. Sized: 20k releases per world on the correct rows put the
    GDP lower bound at ~0.5-0.75 of booked and the broken ones 1.1-1.9x above (seconds)."""
    mech, rows = _section(tmp_path, AU.audit_flower, ["flower.deployed=20"])
    assert set(mech) == {"flower.fedmem", "flower.fedmem/half_noise", "flower.fedmem/sensitivity_off_by_2",
                         "flower.flower", "flower.flower/half_noise",
                         "flower.flower/default_sensitivity_clipping_norm"}
    for name, m in mech.items():
        assert m["method"] == "gdp_fit" and m["deployed_vs_batched_ks_p"] > 1e-3, (name, m)
        if m["broken"]:
            assert m["caught"] and m["eps_lower"] > m["eps_booked"], (name, m)
        else:
            assert not m["caught"] and 0 < m["eps_lower"] <= m["eps_pair"] <= m["eps_booked"], (name, m)
    # what dp='flower' books without a sensitivity: the clipping norm, half the replace-one change
    assert mech["flower.flower/default_sensitivity_clipping_norm"]["eps_booked"] < 0.6 * mech["flower.flower"][
        "eps_booked"]
    assert any(r[0] == "flower" and "chosen" in r[4] for r in rows)


def test_brace_step_search_and_audit(tmp_path):
    """One BRACE step: the search keeps the gate whose certificate sits at its floor (a plain Gaussian, the
    largest exact epsilon), the correct step stays within booked (the zCDP conversion leaves eps_pair
    ~0.83 of it), half the noise is caught by the same GDP fit."""
    mech, rows = _section(tmp_path, AU.audit_brace, ["brace.trials=20000"])
    ok, bad = mech["brace.step"], mech["brace.step/half_noise"]
    chosen = [r for r in rows if r[0] == "brace" and "chosen" in r[4]]
    assert len(chosen) == 1 and chosen[0][1].startswith("4000 at q")
    assert ok["method"] == "gdp_fit" and not ok["caught"] and 0 < ok["eps_lower"] <= ok["eps_pair"] < ok["eps_booked"]
    assert 0.75 < ok["eps_pair"] / ok["eps_booked"] < 0.9
    assert bad["caught"] and bad["eps_lower"] > bad["eps_booked"]
    assert min(ok["deployed_vs_batched_ks_p"], bad["deployed_vs_batched_ks_p"]) > 1e-3


def test_projected_gaussian_epsilon_matches_gdp_and_the_projection_bound():
    from fedmem.attacks import tight as T

    # far from the ball's edge: the plain Gaussian pair (mu = 1)
    assert AU.projected_gaussian_epsilon(0.5, -0.5, 1.0, 1e3, 1e-6) == pytest.approx(T.gdp_epsilon(1.0, 1e-6),
                                                                                       rel=1e-3)
    # a binding projection bounds the loss by the atom's ratio (pure DP): mean +-1, std 1, ball radius 2
    from scipy.stats import norm

    atom = math.log(norm.sf(1.0) / norm.sf(3.0))
    e = AU.projected_gaussian_epsilon(1.0, -1.0, 1.0, 2.0, 1e-12)
    assert e <= atom + 1e-6 and e > 0.95 * atom
