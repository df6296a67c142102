"""The import-linter contracts of pyproject.toml (docs/architecture.md, issue 23).

``make test`` runs ``lint-imports`` before pytest; this test runs the same contracts on the
tree (they must be kept) and, so that it can fail, on a copy of ``fedmem/`` with one
deliberately added back edge of each kind (each must be reported as broken).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize("module, line, contract", [
    # a library layer importing experiment wiring (a layers back edge)
    ("federation/config.py", "import fedmem.experiments.support_leak", "fedmem layers"),
    # the federation engine importing benchmark content (forbidden: content is injected)
    ("federation/engine.py", "import fedmem.bench.shards", "benchmark content is injected"),
])
def test_a_new_back_edge_breaks_the_contract(tmp_path, module, line, contract):
    root = _copy(tmp_path)
    path = root / "fedmem" / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately added back edge\n")
    out = _lint(root)
    assert out.returncode != 0, out.stdout
    assert "0 broken" not in out.stdout and contract in out.stdout.split("Broken contracts")[-1], out.stdout
