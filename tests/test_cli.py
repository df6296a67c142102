"""The ``fedmem`` CLI, run as a real subprocess (``python -m fedmem.cli``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "scenarios" / "dp_demo.toml"


def fedmem(*args, timeout=300, columns="200") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS=columns)
    env.pop("FEDMEM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fedmem.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


fedmem_cli = fedmem  # the name used where `fedmem` (the package) is imported too


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
    assert err.startswith("fedmem: 13 problems in scenario:")
    expected = ["release.budget_epsilon: missing required key", "selection.cap: missing required key",
                "selection.epsilon: missing required key", "colour: unknown key", "seed: must be non-negative",
                "data.records: must be positive",
                "data.dim: must be an integer", "release.epsilon: must be finite",
                "release.delta: must be in the open interval (0, 1)", "release.attempts: must be positive",
                "release.sampling: must be one of", "selection.turn: unknown key", "--set nonsense"]
    for e in expected:
        assert err.count(e) == 1, (e, err)
    assert err.count(str(bad)) == 12  # every file problem names the file
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


# ------------------------------------------------------------------ version, provenance
def test_version_matches_pyproject():
    import tomllib

    import fedmem

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert fedmem.__version__ == declared
    res = fedmem_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"fedmem {declared}"
    assert (REPO / "fedmem" / "py.typed").is_file()


def test_results_json_has_provenance_end_to_end(demo_runs):
    folder, payload = demo_runs[0]
    prov = json.loads((folder / "results.json").read_text())["provenance"]
    assert prov == payload["provenance"]
    assert prov["seed"] == 7 and prov["fedmem"] == "0.1.0" and len(prov["scenario_sha256"]) == 64
    assert prov["packages"]["dp-accounting"] == "0.6.0"
    assert prov["machine"]["cpu_count"] >= 1
    assert demo_runs[1][1]["provenance"]["scenario_sha256"] == prov["scenario_sha256"]
    report = (folder / "report.md").read_text()
    for name in ("results.json", "report.md", "scenario.resolved.toml", "ledger.sqlite"):
        assert f"- `{name}`: " in report


# ------------------------------------------------------------------ --out and --resume
def test_non_empty_out_is_refused_unless_resume(tmp_path):
    out = tmp_path / "run"
    first = fedmem_cli("run", DEMO, "--out", out, "--json")
    assert first.returncode == 0, first.stderr
    m = json.loads(first.stdout)["metrics"]
    assert (m["released"], m["refused"]) == (13, 1)     # PLD: 13 releases fit (RDP: 11)
    ledger = (out / "ledger.sqlite").read_bytes()

    again = fedmem_cli("run", DEMO, "--out", out, "--json")
    assert again.returncode == 2 and again.stdout == ""
    err = again.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"fedmem: --out {out} is not empty") and "--resume" in err
    assert "budgets already spent stay spent" in err
    assert (out / "ledger.sqlite").read_bytes() == ledger  # nothing ran

    resumed = fedmem_cli("run", DEMO, "--out", out, "--json", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    payload = json.loads(resumed.stdout)
    m2 = payload["metrics"]
    assert m2["released"] == 0 and m2["released"] + m2["refused"] == 14   # the budget stays spent
    assert payload["provenance"]["resumed"] is True
    assert "resumed:" in (out / "report.md").read_text()


def test_resume_usage_errors(tmp_path):
    res = fedmem_cli("run", DEMO, "--resume")
    assert res.returncode == 2 and res.stderr.strip() == "fedmem: --resume needs --out <the run folder to continue>"
    f = tmp_path / "file"
    f.write_text("x")
    res = fedmem_cli("run", DEMO, "--out", f)
    assert res.returncode == 2 and "is a file" in res.stderr and "Traceback" not in res.stderr
    res = fedmem_cli("run", "--help")
    assert res.returncode == 0 and "--resume" in res.stdout and "stay spent" in " ".join(res.stdout.split())


def test_name_with_path_separator_refused(tmp_path):
    res = fedmem_cli("run", DEMO, "--set", 'name="../../x"', "--out", tmp_path / "o")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{DEMO}: name: must not contain a path separator" in res.stderr
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ run failures: one line, exit 1
def _fake_demo(monkeypatch, run):
    import dataclasses

    from fedmem.experiments import dp_demo

    exp = dp_demo.EXPERIMENTS["dp.demo"]
    monkeypatch.setitem(dp_demo.EXPERIMENTS, "dp.demo", dataclasses.replace(exp, run=run))


def _raise(exc):
    def run(cfg, ctx):
        raise exc

    return run


@pytest.mark.parametrize("exc, expected", [
    (MemoryError(), "fedmem: run failed: out of memory (MemoryError) - reduce sizes such as data.records=1000"),
    (OverflowError("math range error"),
     "fedmem: run failed: a number grew too large (OverflowError: math range error) - check extreme values such as "
     "data.records=1000"),
    (RecursionError("maximum recursion depth exceeded"),
     "fedmem: run failed: recursion too deep (RecursionError: maximum recursion depth exceeded)"),
    (KeyError("shards"), "fedmem: run failed: internal error KeyError: 'shards'"),
    (ValueError("sigma must be positive. Found 0"), "fedmem: run failed: ValueError: sigma must be positive. Found 0"),
], ids=["memory", "overflow", "recursion", "bug", "value"])
def test_run_failures_exit_1_with_one_line(monkeypatch, capsys, tmp_path, exc, expected):
    from fedmem import cli

    monkeypatch.delenv("FEDMEM_DEBUG", raising=False)
    _fake_demo(monkeypatch, _raise(exc))
    assert cli.main(["run", str(DEMO), "--out", str(tmp_path / "o")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(expected), err
    assert err.rstrip().endswith("(FEDMEM_DEBUG=1 shows the traceback)")


def test_debug_shows_the_original_exception(monkeypatch, tmp_path):
    from fedmem import cli

    monkeypatch.setenv("FEDMEM_DEBUG", "1")
    _fake_demo(monkeypatch, _raise(MemoryError()))
    with pytest.raises(cli.RunFailed) as info:
        cli.main(["run", str(DEMO), "--out", str(tmp_path / "o")])
    assert isinstance(info.value.__cause__, MemoryError)


def test_interrupt_exits_130(monkeypatch, capsys, tmp_path):
    from fedmem import cli

    _fake_demo(monkeypatch, _raise(KeyboardInterrupt()))
    assert cli.main(["run", str(DEMO), "--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err == "fedmem: interrupted\n"


# ------------------------------------------------------------------ tables at 80 columns
def _render(width, *args, **kwargs):
    import io

    from rich.console import Console

    from fedmem.cli import print_table

    buf = io.StringIO()
    mode = print_table(Console(width=width, file=buf, highlight=False), *args, **kwargs)
    return mode, buf.getvalue()


WIDE_COLUMNS = ["attack", "success rate", "AUC", "AUC 95% CI", "TPR@1%FPR", "TPR@5%FPR",
                "empirical eps (CP lower)", "booked eps / query", "verdict"]


def test_wide_table_at_80_columns_cuts_no_number():
    from fedmem.report import _fmt

    rows = [["reconstruction", _fmt(1.4123456), "[0.5012, 0.7543]", _fmt(0.93817), _fmt(3.2719e-05),
             _fmt(-float("inf")), _fmt(12345.678), _fmt(4.25), "LEAK (support exposed)"],
            ["differencing", _fmt(0.5), "[0.4321, 0.5678]", _fmt(0.50001), _fmt(0.0), _fmt(float("nan")),
             _fmt(1e-300), _fmt(1.0), "ok"]]
    mode, text = _render(80, "Attack metrics", WIDE_COLUMNS, rows, note="note")
    assert mode == "groups"
    assert "\u2026" not in text and "..." not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for row in rows:
        for cell in row:
            assert cell in text, (cell, text)
    for header_word in " ".join(WIDE_COLUMNS).split():
        assert header_word in text


def test_file_names_are_never_cut():
    long_name = "support_leak_40_gateway_rerun_with_a_very_long_name-20261130-120000.toml"
    rows = [[long_name, "federation.support_leak", "papers/003 defended by the gateway: " * 3],
            ["dp_demo.toml", "dp.demo", "Tour of the DP core"]]
    mode, text = _render(80, "scenarios in /somewhere", ["file", "kind", "description"], rows, keep=(0, 1))
    assert long_name in text and "federation.support_leak" in text and "\u2026" not in text
    # Narrower than the file name itself: one "column: value" line each, never cut.
    mode, text = _render(40, "scenarios", ["file", "kind", "description"], rows, keep=(0, 1))
    assert mode == "list" and f"- file: {long_name}" in text and "    kind: federation.support_leak" in text


def test_random_tables_keep_every_cell_intact():
    from fedmem.report import _fmt

    gen = np.random.default_rng(80)
    for _ in range(40):
        ncol = int(gen.integers(1, 12))
        width = int(gen.integers(30, 140))
        columns = [f"col {j} " + "x" * int(gen.integers(0, 12)) for j in range(ncol)]
        rows = []
        for _ in range(int(gen.integers(1, 5))):
            name = "".join(gen.choice(list("abcdefghij_-."), size=int(gen.integers(1, 50)))) + ".toml"
            nums = [_fmt(float(v)) for v in gen.normal(size=ncol - 1) * 10.0 ** gen.integers(-8, 9, size=ncol - 1)]
            rows.append([name, *nums])
        mode, text = _render(width, "random", columns, rows)
        assert "\u2026" not in text
        if mode != "list":
            assert max(len(line) for line in text.splitlines()) <= width, (width, text)
        for row in rows:
            for cell in row:
                assert cell in text, (mode, width, cell, text)


def test_list_at_80_columns_shows_whole_file_names():
    env_res = fedmem_cli("list", columns="80")
    assert env_res.returncode == 0, env_res.stderr
    assert "\u2026" not in env_res.stdout
    for f in (REPO / "scenarios").glob("*.toml"):
        assert f.name in env_res.stdout
