"""The static kind list of the registry matches what every family module registers."""

import pytest

from fedmem import registry
from fedmem.scenario import read_toml


@pytest.mark.parametrize("family", sorted(registry.FAMILIES))
def test_static_kinds_match_modules(family):
    experiments = registry.family_experiments(family)
    assert sorted(experiments) == sorted(registry.KINDS[family])
    for kind, exp in experiments.items():
        assert exp.kind == kind
        assert exp.description


def test_unknown_kind_raises_keyerror():
    with pytest.raises(KeyError):
        registry.get_experiment("federation.nope")
    with pytest.raises(KeyError):
        registry.get_experiment("nofamily.x")


def test_every_shipped_scenario_names_a_known_kind_and_has_a_description():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.toml"))
    assert files
    for f in files:
        data = read_toml(f)
        assert data.get("kind") in registry.known_kinds(), f
        assert data.get("description"), f
