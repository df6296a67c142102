"""Experiment registry: ``kind = "<family>.<name>"``; a family maps to one module.

Each family module defines ``EXPERIMENTS: dict[str, fedmem.scenario.Experiment]``.
Modules are imported only when a scenario of their family runs, so ``fedmem list`` and
validation errors stay fast and do not start Ray, torch or CrypTen. ``KINDS`` names
every kind without importing anything (for error messages); ``tests/test_registry.py``
checks that it matches what the modules define.

:func:`load_scenario` (read a scenario file, apply overrides, look its kind up, validate) lives
here, above ``fedmem.scenario`` (moved from there: the scenario layer no longer imports the
registry, so there is no scenario -> registry -> experiments -> scenario cycle).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from fedmem.errors import ScenarioError
from fedmem.scenario import Config, Scenario, apply_overrides, full_schema, memory_problems, read_toml, validate_data

FAMILIES: dict[str, str] = {
    "dp": "fedmem.experiments.dp_demo",
    "federation": "fedmem.experiments.support_leak",
    "brace": "fedmem.experiments.brace",
    "dpmind": "fedmem.experiments.dpmind",
    "memview": "fedmem.experiments.memview",
    "flower": "fedmem.experiments.flower",
    "agents": "fedmem.experiments.agents",
    "audit": "fedmem.experiments.audit",
}

KINDS: dict[str, tuple[str, ...]] = {
    "dp": ("dp.demo",),
    "federation": ("federation.support_leak",),
    "brace": ("brace.synthetic", "brace.digits"),
    "dpmind": ("dpmind.niah",),
    "memview": ("memview.table2", "memview.table3", "memview.table4"),
    "flower": ("flower.support_leak",),
    "agents": ("agents.session",),
    "audit": ("audit.tightness",),
}


def family_experiments(family: str) -> dict:
    """Import one family's module and return its ``EXPERIMENTS``."""
    module = importlib.import_module(FAMILIES[family])
    return dict(getattr(module, "EXPERIMENTS"))


def get_experiment(kind: str):
    """The registered experiment of ``kind``; ``KeyError`` if there is none."""
    family = kind.split(".", 1)[0]
    if family not in FAMILIES or kind not in KINDS[family]:
        raise KeyError(kind)
    return family_experiments(family)[kind]


def known_kinds() -> list[str]:
    return [k for kinds in KINDS.values() for k in kinds]


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override, validate. Raises ScenarioError listing every problem."""
    path = Path(path)
    overrides = list(overrides or [])
    data = read_toml(path)
    problems: list[tuple[str, str]] = []
    apply_overrides(data, overrides, problems)
    kind = data.get("kind")
    if not isinstance(kind, str):
        problems.append(("kind", f"missing or not a string (one of: {', '.join(known_kinds())})"))
        raise ScenarioError([(f"{path}: {loc}", msg) for loc, msg in problems])
    try:
        experiment = get_experiment(kind)
    except KeyError:
        problems.append(("kind", f"unknown experiment {kind!r} (one of: {', '.join(known_kinds())})"))
        raise ScenarioError([(f"{path}: {loc}", msg) for loc, msg in problems]) from None
    out: dict = {}
    validate_data(data, full_schema(experiment), "", problems, out)
    if not problems and experiment.cross_checks is not None:
        problems.extend(experiment.cross_checks(Config(out)))
    if not problems and experiment.memory is not None:
        problems.extend(memory_problems(experiment.memory(Config(out))))
    if problems:
        raise ScenarioError([(loc if loc.startswith("--set") else f"{path}: {loc}", msg) for loc, msg in problems])
    return Scenario(path=path, experiment=experiment, config=Config(out), overrides=overrides)
