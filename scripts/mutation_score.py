"""Mutation score of ``fedmem hunt``: each privacy mutant (fedmem.testing.mutants) applied to a temporary
copy of the tree, the same fixed hunt run on it, and the false-alarm rate on the unmutated tree.

    .venv/bin/python scripts/mutation_score.py [--budget-s 30] [--clean-seeds 3] [--only N]

Last line exactly: ``mutation score: C/T caught, false alarms: F/R``. A mutant whose snippet does not
apply is reported as ERROR and not counted as caught (it counts in T).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedmem.testing.mutants import MUTANTS, MutantError, apply  # noqa: E402

SCENARIOS = ("scenarios/support_leak_40_noised.toml", "scenarios/flower_support_leak.toml")


def _copy_tree(dst: Path) -> None:
    for name in ("fedmem", "scenarios"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))


def _hunt(tree: Path, budget: float, seed: int) -> list[str]:
    verdicts = []
    for sc in SCENARIOS:
        out = tree / f"run-{Path(sc).stem}-{seed}"
        code = ("import sys; from fedmem.cli import main; sys.exit(main(sys.argv[1:]))")
        r = subprocess.run([sys.executable, "-c", code, "hunt", str(tree / sc), "--budget-s", str(budget),
                            "--seed", str(seed), "--out", str(out)], cwd=tree, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(tree)), timeout=budget * 4 + 120)
        try:
            verdicts.append(json.loads((out / "results.json").read_text())["verdict"])
        except (OSError, ValueError, KeyError):
            verdicts.append(f"ERROR (rc {r.returncode}: {r.stderr.strip().splitlines()[-1:]})")
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=30.0)
    ap.add_argument("--clean-seeds", type=int, default=3)
    ap.add_argument("--only", type=int, default=None, help="run only the first N mutants")
    a = ap.parse_args()
    muts = MUTANTS[: a.only] if a.only else MUTANTS
    caught, t0 = 0, time.time()
    for m in muts:
        with tempfile.TemporaryDirectory() as d:
            tree = Path(d)
            _copy_tree(tree)
            try:
                apply(tree, m)
            except MutantError as exc:
                print(f"ERROR {exc}", flush=True)
                continue
            v = _hunt(tree, a.budget_s, 0)
        hit = any(x == "LEAK" for x in v)
        caught += hit
        print(f"{'CAUGHT' if hit else 'missed'}  {m.name}: {v}  ({time.time() - t0:.0f} s)", flush=True)
    alarms = 0
    for seed in range(a.clean_seeds):
        with tempfile.TemporaryDirectory() as d:
            tree = Path(d)
            _copy_tree(tree)
            v = _hunt(tree, a.budget_s, seed)
        alarms += any(x == "LEAK" for x in v)
        print(f"clean seed {seed}: {v}", flush=True)
    print(f"mutation score: {caught}/{len(muts)} caught, false alarms: {alarms}/{a.clean_seeds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
