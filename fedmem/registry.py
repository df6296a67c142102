"""Experiment registry: ``kind = "<family>.<name>"``; a family maps to one module.

Each family module defines ``EXPERIMENTS: dict[str, fedmem.scenario.Experiment]``.
Modules are imported only when a scenario of their family runs, so ``fedmem list`` and
validation errors stay fast and do not start Ray, torch or CrypTen. ``KINDS`` names
every kind without importing anything (for error messages); ``tests/test_registry.py``
checks that it matches what the modules define.
"""

from __future__ import annotations

import importlib

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
