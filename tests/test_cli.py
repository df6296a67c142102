"""The ``fedmem`` CLI, run as a real subprocess (``python -m fedmem.cli``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "scenarios" / "dp_demo.toml"


def fedmem(*args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS="200")
    env.pop("FEDMEM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fedmem.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Two runs of the demo with the same seed into two fresh folders."""
    base = tmp_path_factory.mktemp("runs")
    out = []
    for i in range(2):
        res = fedmem("run", DEMO, "--out", base / f"r{i}", "--json")
        assert res.returncode == 0, res.stderr
        out.append((base / f"r{i}", json.loads(res.stdout)))
    return out


def test_list_shows_every_scenario_with_description():
    res = fedmem("list")
    assert res.returncode == 0, res.stderr
    assert "dp_demo.toml" in res.stdout and "dp.demo" in res.stdout
    assert "Tour of the DP core" in res.stdout
    for f in (REPO / "scenarios").glob("*.toml"):
        assert f.name[:12] in res.stdout


def test_show_lists_keys_with_defaults():
    res = fedmem("show", "dp.demo")
    assert res.returncode == 0, res.stderr
    for key in ("release.epsilon", "release.sampling", "selection.cap", "seed"):
        assert key in res.stdout


def test_run_writes_run_folder(demo_runs):
    folder, payload = demo_runs[0]
    for name in ("results.json", "report.md", "scenario.resolved.toml"):
        assert (folder / name).is_file(), name
    on_disk = json.loads((folder / "results.json").read_text())
    assert on_disk["metrics"] == payload["metrics"]
    assert payload["kind"] == "dp.demo" and payload["seed"] == 7 and payload["ok"] is True
    m = payload["metrics"]
    assert m["released"] + m["refused"] == 14 and m["refused"] > 0  # the budget refuses some
    assert m["epsilon_spent"] <= 2.0
    report = (folder / "report.md").read_text()
    assert "Gaussian mean releases" in report and "| attempt |" in report


def test_same_seed_same_metrics(demo_runs):
    (_, a), (_, b) = demo_runs
    assert a["metrics"] == b["metrics"]
    assert a["tables"] == b["tables"]


def test_resolved_scenario_reruns_identically(demo_runs, tmp_path):
    folder, payload = demo_runs[0]
    res = fedmem("run", folder / "scenario.resolved.toml", "--out", tmp_path / "again", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["metrics"] == payload["metrics"]


def test_set_overrides_and_seed_changes_result(demo_runs, tmp_path):
    res = fedmem("run", DEMO, "--out", tmp_path / "o", "--json", "--set", "release.attempts=3",
                 "--set", 'release.sampling="secure"', "--set", "seed=8", "--set", "release.accountant=pld")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    cfg = payload["config"]
    assert cfg["release"]["attempts"] == 3 and cfg["release"]["sampling"] == "secure"
    assert cfg["release"]["accountant"] == "pld" and payload["seed"] == 8
    assert payload["metrics"]["released"] + payload["metrics"]["refused"] == 3
    assert payload["metrics"]["mean_rmse"] != demo_runs[0][1]["metrics"]["mean_rmse"]
    resolved = (tmp_path / "o" / "scenario.resolved.toml").read_text()
    assert "attempts = 3" in resolved and 'sampling = "secure"' in resolved


def test_invalid_scenario_lists_every_problem_once(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'kind = "dp.demo"\nseed = -3\ncolour = "red"\n'
        '[data]\nrecords = 0\ndim = "eight"\n'
        '[release]\nepsilon = nan\nsampling = "exact"\ndelta = 2.0\n'
        '[selection]\nturn = 3\n')
    res = fedmem("run", bad, "--set", "release.attempts=0", "--set", "nonsense")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and res.stdout == ""
    err = res.stderr
    assert err.startswith("fedmem: 10 problems in scenario:")
    expected = ["colour: unknown key", "seed: must be non-negative", "data.records: must be positive",
                "data.dim: must be an integer", "release.epsilon: must be finite",
                "release.delta: must be in the open interval (0, 1)", "release.attempts: must be positive",
                "release.sampling: must be one of", "selection.turn: unknown key", "--set nonsense"]
    for e in expected:
        assert err.count(e) == 1, (e, err)
    assert err.count(str(bad)) == 9  # every file problem names the file
    assert not (REPO / "runs").exists() or not any(p.name.startswith("bad-") for p in (REPO / "runs").iterdir())


@pytest.mark.parametrize("content, message", [
    ('kind = "dp.demo"\n[data\nrecords = 1\n', "not valid TOML"),
    # (A missing kind takes the same path as an unknown one; each lists every registered
    # kind, which imports every experiment family, so only one of them runs here.)
    ('kind = "dp.nope"\n', "unknown experiment 'dp.nope'"),
], ids=["malformed", "unknown-kind"])
def test_malformed_scenario_exit_2_no_traceback(tmp_path, content, message):
    f = tmp_path / "s.toml"
    f.write_text(content)
    res = fedmem("run", f)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and str(f) in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("fedmem: 1 problem in scenario:")


def test_missing_file_and_bad_usage_exit_2(tmp_path):
    res = fedmem("run", tmp_path / "nope.toml")
    assert res.returncode == 2 and "no such file" in res.stderr and "Traceback" not in res.stderr
    res = fedmem("frobnicate")
    assert res.returncode == 2 and "Traceback" not in res.stderr
