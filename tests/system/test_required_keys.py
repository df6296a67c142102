"""A truncated scenario file must never run on defaults for keys that decide its privacy.

Two checks per experiment kind:

* every key listed in ``PRIVACY_KEYS`` (the keys that decide what is released and what is
  booked) is *required* by the kind's schema: giving one a default makes this test fail;
* for every shipped scenario, deleting all its required keys at once is refused with one
  error that names each deleted key and the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from fedmem.errors import ScenarioError
from fedmem.registry import get_experiment
from fedmem.registry import load_scenario

SCEN = Path(__file__).resolve().parents[2] / "scenarios"

PRIVACY_KEYS = {
    "dp.demo": ["release.epsilon", "release.delta", "release.budget_epsilon", "selection.cap", "selection.epsilon"],
    "memview.table2": ["budget.cap", "budget.K", "run.methods"],
    "memview.table3": ["sweep.caps", "sweep.K_for_caps", "sweep.Ks", "sweep.cap_for_K", "run.methods"],
    "memview.table4": ["budget.cap", "budget.K", "run.methods"],
    "agents.session": ["federation.sigma", "federation.delta", "federation.epsilon_budget",
                       "federation.total_epsilon_budget", "memview.cap", "memview.K", "brace.epsilon", "brace.delta",
                       "brace.budget_epsilon", "brace.budget_delta", "dpmind.epsilon"],
    "dpmind.niah": ["privacy.mechanism", "privacy.epsilons"],
    "brace.synthetic": ["mechanism.epsilon", "mechanism.delta", "mechanism.gamma"],
    "brace.digits": ["grid.epsilons", "mechanism.delta", "mechanism.gamma"],
    "flower.support_leak": ["federation.dp", "federation.sigma", "federation.flower_sigma", "federation.flower_clip",
                            "federation.delta", "federation.epsilon_budget", "federation.total_epsilon_budget"],
    "federation.support_leak": ["federation.selection", "federation.calibration", "federation.receipts",
                                "federation.gateway", "federation.on_reject", "federation.epsilon_budget",
                                "federation.total_epsilon_budget", "federation.support_budget_bits",
                                "federation.total_support_budget_bits"],
}


def _param(schema, dotted):
    node = schema
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("kind", sorted(PRIVACY_KEYS))
def test_privacy_keys_are_required(kind):
    schema = get_experiment(kind).schema
    optional = [k for k in PRIVACY_KEYS[kind] if not _param(schema, k).required]
    assert not optional, f"{kind}: privacy-deciding keys with a default: {optional}"


def _required_paths(schema, prefix=""):
    for name, spec in schema.items():
        if isinstance(spec, dict):
            yield from _required_paths(spec, f"{prefix}{name}.")
        elif spec.required and name not in ("kind",):
            yield f"{prefix}{name}"


def _scenarios_of(kinds):
    out = []
    for p in sorted(SCEN.glob("*.toml")):
        kind = tomllib.loads(p.read_text())["kind"]
        if kind in kinds:
            out.append(p)
    return out


@pytest.mark.parametrize("path", _scenarios_of(PRIVACY_KEYS), ids=lambda p: p.name)
def test_truncated_shipped_scenario_names_every_missing_key(path, tmp_path):
    data = tomllib.loads(path.read_text())
    schema = get_experiment(data["kind"]).schema
    removed = []
    for dotted in _required_paths(schema):
        section, _, key = dotted.rpartition(".")
        table = data.get(section) if section else data
        if isinstance(table, dict) and key in table:
            del table[key]
            removed.append(dotted)
    assert set(PRIVACY_KEYS[data["kind"]]) <= set(removed), "a shipped scenario omits a privacy key"
    cut = tmp_path / path.name
    cut.write_bytes(tomli_w.dumps(data).encode())
    with pytest.raises(ScenarioError) as err:
        load_scenario(cut)
    text = str(err.value)
    assert str(cut) in text or cut.name in text
    for dotted in removed:
        assert f"{dotted}: missing required key" in text, dotted
