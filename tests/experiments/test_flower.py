"""The ``flower.support_leak`` scenario kind (fedmem.experiments.flower, fedmem.experiments.flower_ray_engine):
its keys are validated with their names, and the Ray-engine column runs on the same data.

Moved from tests/test_flower.py (which now is tests/flower/test_gateway.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedmem.flower import SecAggGrid  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the scenario kind: keys and the Ray column
def test_scenario_keys_are_validated_with_their_names(tmp_path):
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    path = ROOT / "scenarios" / "flower_support_leak.toml"
    sc = load_scenario(path)
    assert list(sc.config.federation.dp) == ["fedmem", "flower"] and sc.config.ray_engine.enabled
    for override, key in (('federation.dp=["magic"]', "federation.dp"), ("faults.dropout_clients=20",
                                                                        "faults.dropout_clients"),
                          ('ray_engine.mpc="nope"', "ray_engine.mpc"), ("faults.deadline_s=0", "faults.deadline_s")):
        with pytest.raises(ScenarioError, match=key.replace(".", r"\.")):
            load_scenario(path, [override])
    # the budgets decide what the audit sees: a file without them is refused, naming the key
    import tomllib

    import tomli_w

    data = tomllib.loads(path.read_text())
    del data["federation"]["epsilon_budget"]
    cut = tmp_path / "cut.toml"
    cut.write_text(tomli_w.dumps(data))
    with pytest.raises(ScenarioError, match=r"federation\.epsilon_budget"):
        load_scenario(cut)


def test_ray_engine_column_same_data_exact_receipts_leak_noised_ones_are_booked(ray_local):
    from types import SimpleNamespace as NS

    from fedmem.attacks.support import membership_report, reconstruction_report
    from fedmem.bench.shards import sample_queries
    from fedmem.flower.apps import build_world, world_spec
    from fedmem.experiments.flower import _eps_of, _truths
    from fedmem.experiments.flower_ray_engine import run_ray_engine

    f = NS(shards=6, records_per_shard=12, key_dim=16, value_dim=8, clip=1.0, k_local=5, threshold=0.5, sigma=1.2,
           delta=1e-6, num_cpus=2)
    r = NS(mpc="plaintext", receipt_sigma=4.0, hosts=2)
    world = world_spec(seed=3, shards=6, records_per_shard=12, key_dim=16, value_dim=8, clip=1.0, clusters=4,
                       spread=0.35, targets=1)
    data, targets = build_world(world)
    qs = sample_queries(data, 6, np.random.default_rng(5))
    out = run_ray_engine(f, r, data, targets, qs, 8, rng_for=lambda *k: np.random.default_rng(len(k)),
                         log=lambda *_: None)
    # the same selection as the Flower ClientApps: identical contributing-shard counts
    flower_truths = _truths(world, [{"query": q, "world": 0, "target": -1} for q in qs], 5, 0.5, SecAggGrid(8.0), 6)
    und, dfd = out["undefended"], out["defended"]
    assert und["truths"] == flower_truths == dfd["truths"]
    # undefended: exact receipts give the exact cardinality and separate the worlds perfectly
    assert reconstruction_report(und["estimates"], und["truths"], 0).rate == 1.0
    assert min(und["pos"]) > max(und["neg"])
    assert max(und["booked"]) == pytest.approx(_eps_of(1.2, 1e-6))         # only the value is booked
    # defended: value and noised receipts booked (more than the value alone), every answer admitted
    assert dfd["refused"] == 0 and min(dfd["booked"]) > _eps_of(1.2, 1e-6) + 1e-3
    rep = membership_report(dfd["pos"], dfd["neg"], delta=1e-6, rng=np.random.default_rng(0),
                            epsilon_claim=max(dfd["booked"]))
    assert rep.ceiling_violations == 0


# ---------------------------------------------------------------- the hostile-ClientApp rows (issue 37)
def test_malicious_client_rows_hold_for_the_wrappers_and_catch_the_broken_variants():
    """The scenario's hostile-ClientApp table (fedmem.experiments.flower._malicious_rows) on a small run:
    every wrapper row holds, every broken-variant row is caught (the same Row.holds)."""
    from fedmem.errors import ScenarioError
    from fedmem.experiments.flower import _malicious_rows
    from fedmem.registry import load_scenario

    path = ROOT / "scenarios" / "flower_support_leak.toml"
    cfg = load_scenario(path, ["malicious.trials=40",
                               'malicious.attacks=["range_limit_oracle", "out_of_contract_norm"]']).config

    class _Ctx:
        def rng(self, *names):
            return np.random.default_rng(11)

        def log(self, msg):
            pass

    metrics: dict = {}
    table = _malicious_rows(cfg, _Ctx(), metrics)
    assert metrics["malicious_client_holds"] and metrics["malicious_client_broken_caught"], metrics
    assert len(table.rows) == 6 and [r[-1] for r in table.rows] == ["holds", "holds", "FAILS"] * 2
    with pytest.raises(ScenarioError, match=r"malicious\.attacks"):
        load_scenario(path, ['malicious.attacks=["nope"]'])
