"""The import-linter contracts of pyproject.toml (docs/architecture.md, "Layers, held by import-linter").

``make test`` runs ``lint-imports`` before pytest; this test runs the same contracts on the
tree (they must be kept) and, so that it can fail, on a copy of ``fedmem/`` with one
deliberately added back edge of each kind and a deliberate cycle (each must be reported as broken).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed (the [test] extra)")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--no-cache", "--no-logo", "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "fedmem", tmp_path / "fedmem", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_contracts_are_kept_on_the_copy(tmp_path):
    out = _lint(_copy(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout


# Each deliberately added back edge, and the contract that must report it. Both edges go into ONE
# copy and one lint run (a lint run is ~4 s): each contract's own section of the report must name
# its edge's import, so a contract that missed its edge still fails this test. (The first edge also
# breaks the forbidden contract transitively, through experiments -> bench: that is why the check
# reads the edge's import in each section rather than just the list of broken contracts.)
BACK_EDGES = [
    # a library layer importing experiment wiring (a layers back edge)
    ("federation/config.py", "fedmem.experiments.support_leak", "fedmem layers"),
    # the federation engine importing benchmark content (forbidden: content is injected)
    ("federation/engine.py", "fedmem.bench.shards", "benchmark content is injected"),
]


# A cycle inside one package through an import inside a function (the acyclic contract; the
# layers contract cannot see it: both modules are in one layer). The engine imports the gateway.
CYCLE = ("federation/gateway.py", "fedmem.federation.engine", "no import cycle")


def test_a_new_back_edge_breaks_the_contract(tmp_path):
    root = _copy(tmp_path)
    for module, target, _ in BACK_EDGES:
        path = root / "fedmem" / module
        path.write_text(path.read_text() + f"\nimport {target}  # deliberately added back edge\n")
    path = root / "fedmem" / CYCLE[0]
    path.write_text(path.read_text() + f"\n\ndef _cycle():\n    import {CYCLE[1]}  # deliberately added cycle\n")
    out = _lint(root)
    assert out.returncode != 0, out.stdout
    assert "0 kept, 3 broken" in out.stdout, out.stdout
    report = out.stdout.split("Broken contracts")[-1]
    cycles = report[report.index(CYCLE[2]):]
    cycles = cycles[:min([cycles.index(c) for _, _, c in BACK_EDGES if c in cycles] or [len(cycles)])]
    assert "No cycles are allowed in fedmem.federation." in cycles, out.stdout
    report = report.replace(cycles, "")
    starts = sorted((report.index(contract), contract) for _, _, contract in BACK_EDGES)
    for module, target, contract in BACK_EDGES:
        i = [k for k, (_, c) in enumerate(starts) if c == contract][0]
        section = report[starts[i][0]:starts[i + 1][0] if i + 1 < len(starts) else len(report)]
        edge = f"fedmem.{module[:-3].replace('/', '.')} -> {target}"
        assert edge in section, (contract, edge, out.stdout)
