"""Experiment registry: ``kind = "<family>.<name>"``; a family maps to one module.

Each family module defines ``EXPERIMENTS: dict[str, fedmem.scenario.Experiment]``.
Modules are imported only when a scenario of their family runs, so ``fedmem list`` and
validation errors stay fast and do not start Ray, torch or CrypTen.
"""

from __future__ import annotations

import importlib

FAMILIES: dict[str, str] = {
    "dp": "fedmem.experiments.dp_demo",
    "federation": "fedmem.federation.experiment",
    "brace": "fedmem.agent.brace.experiment",
    "dpmind": "fedmem.agent.dpmind.experiment",
    "memview": "fedmem.agent.memview.experiment",
}


def _module_experiments(family: str) -> dict:
    module = importlib.import_module(FAMILIES[family])
    return dict(getattr(module, "EXPERIMENTS"))


def get_experiment(kind: str):
    family = kind.split(".", 1)[0]
    if family not in FAMILIES:
        raise KeyError(kind)
    try:
        experiments = _module_experiments(family)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(FAMILIES[family]):
            raise KeyError(kind) from None
        raise
    if kind not in experiments:
        raise KeyError(kind)
    return experiments[kind]


def known_kinds() -> list[str]:
    kinds = []
    for family, module in FAMILIES.items():
        try:
            kinds += sorted(_module_experiments(family))
        except ModuleNotFoundError as exc:
            if not (exc.name and module.startswith(exc.name)):
                raise
    return kinds
