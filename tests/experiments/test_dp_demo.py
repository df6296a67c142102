"""dp.demo refuses impossible sizes and epsilons up front, and stops when the budget is spent."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedmem import cli

DEMO = Path(__file__).resolve().parents[2] / "scenarios" / "dp_demo.toml"


def test_huge_sizes_and_epsilons_are_refused_before_running(tmp_path, capsys):
    assert cli.main(["run", str(DEMO), "--set", "data.records=1000000000000", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "data.records" in err and "GiB" in err and "Traceback" not in err
    assert cli.main(["run", str(DEMO), "--set", "release.epsilon=1e300", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "release.epsilon" in err and "Traceback" not in err


def test_attempts_stop_when_the_budget_is_spent(tmp_path, capsys):
    t0 = time.perf_counter()
    assert cli.main(["run", str(DEMO), "--set", "release.attempts=1000000000", "--json",
                     "--out", str(tmp_path / "c")]) == 0
    assert time.perf_counter() - t0 < 60
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert m["released"] == 13 and m["released"] + m["refused"] == 1_000_000_000


def test_brace_extreme_epsilon_is_a_scenario_error(tmp_path, capsys):
    scen = DEMO.parent / "brace_synthetic.toml"
    assert cli.main(["run", str(scen), "--set", "mechanism.epsilon=1e308", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "mechanism.epsilon" in err and "Traceback" not in err


def test_float_low_bits_audit_catches_the_fast_sampler_and_passes_the_secure_one(tmp_path, capsys):
    """The demo's audit row: the same float low-bit attack and verdict rule on both samplers."""
    assert cli.main(["run", str(DEMO), "--set", "release.sampling=\"fast\"", "--set", "audit.trials=60",
                     "--set", "release.attempts=2", "--json", "--out", str(tmp_path / "f")]) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert m["sampler"] == "not DP (float sampler)"
    fast, secure = m["float_bits"]["fast"], m["float_bits"]["secure"]
    assert fast["label"] == "LEAK" and fast["auc"] > 0.8, fast
    assert secure["label"] == "within booked" and secure["power"] >= secure["eps_booked"], secure
    assert m["verdict"] == "LEAK"
