"""Bad input: every constructor fails at construction, naming the parameter and the value.

Nothing is clamped; a failed construction leaves a durable store untouched.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fedmem.dp import (
    Accountant,
    ApproxDpEvent,
    AttributeLedger,
    DurableStore,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    MetricLaplace,
    PureDpEvent,
)
from fedmem.dp.mechanisms import replace

NAN, INF = math.nan, math.inf

# (constructor, kwargs, parameter name expected in the message, value text expected)
BAD_VALUES = [
    (GaussianMechanism, dict(sigma=0.0), "sigma", "0.0"),
    (GaussianMechanism, dict(sigma=-1.0), "sigma", "-1.0"),
    (GaussianMechanism, dict(sigma=NAN), "sigma", "nan"),
    (GaussianMechanism, dict(sigma=INF), "sigma", "inf"),
    (GaussianMechanism, dict(sigma=1.0, l2_sensitivity=0), "l2_sensitivity", "0"),
    (GaussianMechanism.calibrate, dict(epsilon=0.0, delta=1e-5), "epsilon", "0.0"),
    (GaussianMechanism.calibrate, dict(epsilon=-2, delta=1e-5), "epsilon", "-2"),
    (GaussianMechanism.calibrate, dict(epsilon=NAN, delta=1e-5), "epsilon", "nan"),
    (GaussianMechanism.calibrate, dict(epsilon=1.0, delta=0.0), "delta", "0.0"),
    (GaussianMechanism.calibrate, dict(epsilon=1.0, delta=1.0), "delta", "1.0"),
    (GaussianMechanism.calibrate, dict(epsilon=1.0, delta=-1e-5), "delta", "-1e-05"),
    (GaussianMechanism.calibrate, dict(epsilon=1.0, delta=1e-5, l2_sensitivity=INF), "l2_sensitivity", "inf"),
    (GaussianMechanism.from_noise_multiplier, dict(noise_multiplier=0.0), "noise_multiplier", "0.0"),
    (LaplaceMechanism, dict(scale=0.0), "scale", "0.0"),
    (LaplaceMechanism, dict(scale=1.0, l1_sensitivity=-1.0), "l1_sensitivity", "-1.0"),
    (LaplaceMechanism.calibrate, dict(epsilon=INF), "epsilon", "inf"),
    (LaplaceMechanism.calibrate, dict(epsilon=-0.5), "epsilon", "-0.5"),
    (ExponentialMechanism, dict(epsilon=0.0, sensitivity=1.0), "epsilon", "0.0"),
    (ExponentialMechanism, dict(epsilon=1.0, sensitivity=NAN), "sensitivity", "nan"),
    (MetricLaplace, dict(epsilon=-1.0, dim=3), "epsilon", "-1.0"),
    (MetricLaplace, dict(epsilon=1.0, dim=0), "dim", "0"),
    (PureDpEvent, dict(epsilon=0.0), "epsilon", "0.0"),
    (ApproxDpEvent, dict(epsilon=1.0, delta=1.5), "delta", "1.5"),
    (ApproxDpEvent, dict(epsilon=NAN, delta=1e-6), "epsilon", "nan"),
    (Accountant, dict(kind="moments"), "kind", "'moments'"),
    (Accountant, dict(budget=(0.0, 1e-6)), "budget epsilon", "0.0"),
    (Accountant, dict(budget=(1.0, 2.0)), "budget delta", "2.0"),
    (Accountant, dict(budget=(1.0,)), "budget", "(1.0,)"),
    (Accountant, dict(name=""), "name", "''"),
    (Accountant, dict(pld_discretization=-1e-4), "pld_discretization", "-0.0001"),
    (AttributeLedger, dict(caps={}), "caps", "{}"),
    (AttributeLedger, dict(caps={"a": 0.0}), "caps['a']", "0.0"),
    (AttributeLedger, dict(caps={"a": NAN}), "caps['a']", "nan"),
    (AttributeLedger, dict(caps={"": 1.0}), "caps keys", "''"),
    (DurableStore, dict(timeout_s=0), "timeout_s", "0"),
]


@pytest.mark.parametrize("ctor, kwargs, name, value", BAD_VALUES,
                         ids=[f"{c.__qualname__}-{n}-{v}" for c, _, n, v in BAD_VALUES])
def test_bad_value_raises_valueerror_naming_parameter_and_value(ctor, kwargs, name, value):
    with pytest.raises(ValueError) as info:
        ctor(**kwargs)
    msg = str(info.value)
    assert msg.startswith(name) or f" {name} " in msg or name in msg.split(" must")[0], msg
    assert "Found" in msg and value in msg, msg


BAD_TYPES = [
    (GaussianMechanism, dict(sigma="1.0"), "sigma"),
    (GaussianMechanism, dict(sigma=True), "sigma"),
    (LaplaceMechanism, dict(scale=None), "scale"),
    (MetricLaplace, dict(epsilon=1.0, dim=2.5), "dim"),
    (ExponentialMechanism, dict(epsilon=[1.0], sensitivity=1.0), "epsilon"),
]


@pytest.mark.parametrize("ctor, kwargs, name", BAD_TYPES, ids=[f"{c.__qualname__}-{n}" for c, _, n in BAD_TYPES])
def test_bad_type_raises_typeerror(ctor, kwargs, name):
    with pytest.raises(TypeError, match=name):
        ctor(**kwargs)


def test_replace_revalidates_frozen_records():
    mech = GaussianMechanism(sigma=1.0)
    with pytest.raises(ValueError, match="sigma"):
        replace(mech, sigma=-1.0)
    with pytest.raises(Exception):
        mech.sigma = 2.0  # frozen


# ----------------------------------------------------------------- call arguments
def test_release_rejects_non_finite_and_empty_values():
    mech = GaussianMechanism(sigma=1.0)
    rng = np.random.default_rng(0)
    for bad, found in ([1.0, NAN], "nan"), ([INF], "inf"), ([], "shape (0,)"):
        with pytest.raises(ValueError, match="value") as info:
            mech.release(bad, rng)
        assert found in str(info.value)
    with pytest.raises(TypeError, match="value"):
        mech.release(["a"], rng)


def test_shapes_are_checked():
    em = ExponentialMechanism(1.0, 1.0)
    with pytest.raises(ValueError, match=r"utilities must have 1 dimension\(s\). Found shape \(2, 2\)"):
        em.select([[0.0, 1.0], [1.0, 0.0]], np.random.default_rng(0))
    with pytest.raises(ValueError, match="utilities"):
        em.probabilities([])
    with pytest.raises(ValueError, match="n must be >= 1. Found 0"):
        MetricLaplace(1.0, 2).sample(np.random.default_rng(0), n=0)


def test_injected_rng_is_required():
    mech = LaplaceMechanism(scale=1.0)
    for bad in (None, 42, np.random.RandomState(0)):
        with pytest.raises(TypeError, match="rng"):
            mech.noise(3, bad)
    with pytest.raises(TypeError, match="rng"):
        ExponentialMechanism(1.0, 1.0).select([0.0, 1.0], None)
    with pytest.raises(TypeError, match="rng"):
        MetricLaplace(1.0, 2).sample(np.random.default_rng)


def test_epsilon_query_validates_delta():
    with pytest.raises(ValueError, match="delta"):
        GaussianMechanism(sigma=1.0).epsilon(0.0)
    with pytest.raises(ValueError, match="delta"):
        Accountant().spent(1.0)


def test_ledger_charge_validates_epsilon_before_writing():
    led = AttributeLedger({"a": 1.0})
    for bad in (0.0, -0.1, NAN, INF):
        with pytest.raises(ValueError, match="epsilon"):
            led.try_charge(["a"], bad)
    assert led.history() == [] and led.spent("a") == 0.0


# ------------------------------------------------------- no state change on failure
def _rows(path) -> dict:
    con = sqlite3.connect(path)
    try:
        return {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("ledger_caps", "ledger_charges", "accountant_meta", "accountant_events")}
    finally:
        con.close()


def test_failed_construction_writes_nothing(tmp_path):
    path = tmp_path / "s.sqlite"
    store = DurableStore(path)
    empty = _rows(path)
    with pytest.raises(ValueError):
        AttributeLedger({"a": 1.0, "b": -1.0}, store=store, name="x")
    with pytest.raises(ValueError):
        Accountant("rdp", store=store, name="y", budget=(1.0, 0.0))
    with pytest.raises(ValueError):
        Accountant("pld", store=store, name="z", pld_discretization=0.0)
    assert _rows(path) == empty == dict.fromkeys(empty, 0)
    # The names are still free: valid objects can be created afterwards.
    AttributeLedger({"a": 1.0, "b": 2.0}, store=store, name="x")
    Accountant("rdp", store=store, name="y", budget=(1.0, 1e-6))
    assert _rows(path)["ledger_caps"] == 2 and _rows(path)["accountant_meta"] == 1


def test_refused_booking_of_unsupported_event_writes_nothing(tmp_path):
    import dp_accounting

    path = tmp_path / "t.sqlite"
    acc = Accountant("rdp", store=DurableStore(path), name="t")
    with pytest.raises(TypeError):
        acc.book(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)))
    assert _rows(path)["accountant_events"] == 0


# ------------------------------------------------------------------ scenario name (run folder)
@pytest.mark.parametrize("name, message", [
    ("../../x", "must not contain a path separator"),
    ("a/b", "must not contain a path separator"),
    ("a\\\\b", "must not contain a path separator"),
    (".", "must not be '.' or '..'"),
    ("..", "must not be '.' or '..'"),
    ("x\\u0000y", "must not contain a NUL character"),
])
def test_scenario_name_must_stay_inside_runs(name, message):
    from pathlib import Path

    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    demo = Path(__file__).resolve().parents[2] / "scenarios" / "dp_demo.toml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(demo, [f'name="{name}"', "seed=-1"])
    problems = dict(info.value.problems)
    assert problems[f"{demo}: name"].startswith(message), problems
    assert f"{demo}: seed" in problems  # every problem at once


@pytest.mark.parametrize("name", ["run-1", "my.run", "..x", "a..b", "\u00e9t\u00e9 2026"])
def test_ordinary_scenario_names_accepted(name):
    from pathlib import Path

    from fedmem.registry import load_scenario

    demo = Path(__file__).resolve().parents[2] / "scenarios" / "dp_demo.toml"
    assert load_scenario(demo, [f'name="{name}"']).name == name


# ---------------------------------------------------------------- one source of truth for a kind's knobs
GATEWAY_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "support_leak_40_gateway.toml"
FEDERATION_BAD = [("shards", 0), ("threshold", 2.0), ("gateway", "yes"), ("epsilon_budget", NAN),
                  ("delta", 1.5), ("mpc", "garbled"), ("sigma", -1.0), ("max_batch", 2.5)]


@pytest.mark.parametrize("name, value", FEDERATION_BAD)
def test_federation_config_and_scenario_reject_alike(name, value):
    """FederationConfig and the scenario's [federation] section read the same knob: the same value is
    refused by both with the same message (naming the key and the value)."""
    from fedmem.errors import ScenarioError
    from fedmem.federation.config import FederationConfig
    from fedmem.registry import load_scenario

    with pytest.raises(ValueError) as api:
        FederationConfig(**{name: value})
    msg = str(api.value)
    assert msg.startswith(f"{name} ") and repr(value) in msg
    with pytest.raises(ScenarioError) as sc:
        load_scenario(GATEWAY_SCENARIO, [f"federation.{name}={value!r}".replace("'", '"')])
    assert f"federation.{name}: {msg[len(name) + 1:]}" in str(sc.value)


def test_federation_scenario_section_is_derived_from_the_dataclass():
    from fedmem.experiments.support_leak import FEDERATION_SCHEMA, SECURITY_KEYS
    from fedmem.federation.config import FederationConfig
    from fedmem.params import params_of

    knobs = params_of(FederationConfig)
    assert set(FEDERATION_SCHEMA) == set(knobs)
    for name, p in FEDERATION_SCHEMA.items():
        assert p.check is knobs[name].check and p.choices == knobs[name].choices
        assert p.required == (name in SECURITY_KEYS)
        if not p.required:
            assert p.default == getattr(FederationConfig(), name)


def test_federation_cross_field_rules_are_shared():
    from fedmem.errors import ScenarioError
    from fedmem.federation.config import FederationConfig
    from fedmem.registry import load_scenario

    with pytest.raises(ValueError, match="k_local=60 exceeds records_per_shard=50"):
        FederationConfig(k_local=60)
    with pytest.raises(ScenarioError, match="federation.k_local: k_local=60 exceeds records_per_shard=50"):
        load_scenario(GATEWAY_SCENARIO, ["federation.k_local=60"])


@pytest.mark.parametrize("name, value", [("r", 0.0), ("T", 0), ("epsilon", INF), ("delta", 1.0), ("kappa", -1.0)])
def test_brace_params_and_scenario_reject_alike(name, value):
    """BraceParams' knobs are the brace.synthetic [mechanism] keys: same value refused, same message."""
    from fedmem.agent.brace.params import BraceParams
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    base = dict(r=0.8, T=5, epsilon=128.0, delta=1e-5, d=2, kappa=0.003)
    with pytest.raises(ValueError) as api:
        BraceParams(**{**base, name: value})
    msg = str(api.value)
    assert msg.startswith(f"{name} ")
    path = Path(__file__).resolve().parents[2] / "scenarios" / "brace_synthetic.toml"
    with pytest.raises(ScenarioError) as sc:
        load_scenario(path, [f"mechanism.{name}={value!r}"])
    assert f"mechanism.{name}: {msg[len(name) + 1:]}" in str(sc.value)


# ------------------------------------------------------------------ scenario values that overflow later, sizes that cannot fit
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("scenario, override, key", [
    ("dp_demo.toml", "data.clip=1e308", "data.clip"),
    ("dp_demo.toml", "release.budget_epsilon=1e300", "release.budget_epsilon"),
    ("support_leak_40.toml", "federation.clip=1e200", "federation.clip"),
    ("support_leak_40.toml", "federation.shards=1000000000", "federation.shards"),
    ("support_leak_40.toml", "federation.records_per_shard=1000000000", "federation.records_per_shard"),
    ("support_leak_40.toml", "attack.queries=1000000000000", "attack.queries"),
])
def test_scenario_values_that_cannot_run_are_named_by_key(scenario, override, key):
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    with pytest.raises(ScenarioError) as info:
        load_scenario(SCENARIOS / scenario, [override])
    locs = [loc for loc, _ in info.value.problems]
    assert len(locs) == 1 and locs[0].endswith(f": {key}"), info.value.problems
    msg = info.value.problems[0][1]
    assert "inf" not in msg.replace("inf where", "")          # real sizes, never inf


def test_infinite_budgets_and_normal_sizes_still_load():
    from fedmem.registry import load_scenario

    sc = load_scenario(SCENARIOS / "support_leak_40.toml", ["federation.epsilon_budget=inf",
                                                            "federation.shards=10000"])
    assert sc.config.federation.epsilon_budget == INF and sc.config.federation.shards == 10000
