"""The ``fedmem`` CLI.

Most checks call ``fedmem.cli.main(argv)`` in-process (stdout, stderr, exit code, cwd and
``COLUMNS`` as a process would see them): what they test is the command's output, not the
process boundary, and each child Python costs seconds of imports. A real ``python -m
fedmem.cli`` process is kept where the boundary is what is tested: the exit code and the absence
of a traceback of an actual process (``--version``, a missing file, bad usage, a malformed
scenario) and the signal handling of an interrupted run (SIGTERM/SIGINT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scenarios" / "dp_demo.toml"


def fedmem_process(*args, timeout=300, columns="200", cwd=REPO) -> subprocess.CompletedProcess:
    """A real ``python -m fedmem.cli`` process (for the checks of the process boundary)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", COLUMNS=columns)
    env.pop("FEDMEM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fedmem.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


def fedmem(*args, timeout=None, columns="200", cwd=REPO) -> subprocess.CompletedProcess:
    """``fedmem.cli.main(argv)`` in this process, answered like :func:`fedmem_process`: exit code
    (argparse's ``SystemExit`` included), captured stdout and stderr, run from ``cwd`` with
    ``COLUMNS`` set and ``FEDMEM_DEBUG`` unset; everything restored afterwards."""
    import contextlib
    import io

    from fedmem import cli

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in ("COLUMNS", "FEDMEM_DEBUG")}
    saved_cwd = os.getcwd()
    os.environ["COLUMNS"] = columns
    os.environ.pop("FEDMEM_DEBUG", None)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["fedmem", *argv], rc, out.getvalue(), err.getvalue())


fedmem_cli = fedmem  # the name used where `fedmem` (the package) is imported too


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Two runs of the demo with the same seed into two fresh folders: one from the file, one by the
    bundled scenario's name from a folder that has no scenarios/."""
    base = tmp_path_factory.mktemp("runs")
    out = []
    for i, (scenario, cwd) in enumerate([(DEMO, REPO), ("dp_demo", base)]):
        res = fedmem("run", scenario, "--out", base / f"r{i}", "--json", cwd=cwd)
        assert res.returncode == 0, res.stderr
        out.append((base / f"r{i}", json.loads(res.stdout)))
    return out


def test_list_shows_every_scenario_with_description():
    res = fedmem("list")
    assert res.returncode == 0, res.stderr
    assert "dp_demo" in res.stdout and "dp.demo" in res.stdout
    assert "Tour of the DP core" in res.stdout
    for f in (REPO / "scenarios").glob("*.toml"):
        assert f.stem in res.stdout


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
    res = fedmem_process("run", f)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and str(f) in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("fedmem: 1 problem in scenario:")


def test_missing_file_and_bad_usage_exit_2(tmp_path):
    res = fedmem_process("run", tmp_path / "nope.toml")
    assert res.returncode == 2 and "no such file" in res.stderr and "Traceback" not in res.stderr
    res = fedmem_process("frobnicate")
    assert res.returncode == 2 and "Traceback" not in res.stderr


# ------------------------------------------------------------------ version, provenance
def test_version_matches_pyproject():
    import tomllib

    import fedmem

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert fedmem.__version__ == declared
    res = fedmem_process("--version")
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
def test_non_empty_out_is_refused_unless_resume(demo_runs, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(demo_runs[0][0], out)       # a completed run of DEMO (the module's), not re-run here
    m = demo_runs[0][1]["metrics"]
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

    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    _fake_demo(monkeypatch, _raise(KeyboardInterrupt()))
    assert cli.main(["run", str(DEMO), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err.startswith("fedmem: interrupted (SIGINT); run folder") and err.count("\n") == 1
    assert f"fedmem run {DEMO} --out {tmp_path / 'o'} --resume" in err
    assert json.loads((tmp_path / "o" / "results.json").read_text())["status"] == "interrupted"
    # the handlers of the process are as they were before the run (tests, notebooks)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


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
    """A two-row table too wide for 80 columns is transposed (one column per row), never split
    into column groups; every number whole."""
    from fedmem.report import _fmt

    rows = [["reconstruction", _fmt(1.4123456), "[0.5012, 0.7543]", _fmt(0.93817), _fmt(3.2719e-05),
             _fmt(-float("inf")), _fmt(12345.678), _fmt(4.25), "LEAK (support exposed)"],
            ["differencing", _fmt(0.5), "[0.4321, 0.5678]", _fmt(0.50001), _fmt(0.0), _fmt(float("nan")),
             _fmt(1e-300), _fmt(1.0), "ok"]]
    mode, text = _render(80, "Attack metrics", WIDE_COLUMNS, rows, note="note")
    assert mode == "transposed"
    assert "\u2026" not in text and "..." not in text and " of 9)" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for row in rows:
        for cell in row:
            assert cell in text, (cell, text)


def _attack_rows(n):
    from fedmem.report import _fmt

    reasons = ["LEAK (perfect separation: ROC above the DP ceiling of eps 4.25, delta 1e-06 booked; CP eps >= 3.47)",
               "within booked (GDP mu >= 0.00 <= 0.83 booked, power mu 2.97; CP eps >= 0.00)", "EXCEEDS TOTAL BUDGET"]
    return [[f"attack number {i} (a label)", _fmt(0.5 + i / 97), "240/240", _fmt(0.5 + i / 50), "[0.462, 0.537]",
             _fmt(i / 7), _fmt(i / 3), _fmt(4.253 * (1 + i % 2)), _fmt(3.467), reasons[i % 3]] for i in range(n)]


def test_long_table_at_80_columns_is_compact_with_footnotes():
    """The attack table at 80 columns: attack, AUC, eps lower, booked, power and a one-word verdict whose
    reason is a footnote (each reason once); the secondary columns are named, never split into groups."""
    columns = ["attack", "success rate", "n pos/neg", "AUC", "AUC 95% CI", "TPR@1%FPR", "empirical eps (CP lower)",
               "booked eps (what it saw)", "power", "verdict"]
    rows = _attack_rows(10)
    mode, text = _render(80, "Attack metrics", columns, rows, note="Overall verdict: LEAK.", keep=())
    assert mode == "compact", text
    assert "columns" not in text.split("Columns:")[0] and " of 10)" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    body = text.split("\n[1] ")[0]
    for row in rows:
        for j in (3, 6, 7, 8):              # AUC, eps lower, booked, power: whole numbers in the table
            assert row[j] in body, (row[j], text)
    assert "LEAK [1]" in body and "within booked [2]" in body
    assert text.count("[1] LEAK (perfect separation") == 1 and text.count("[2] within booked (GDP") == 1
    assert "Not shown at this width: AUC 95% CI, n pos/neg, success rate, TPR@1%FPR" in " ".join(text.split())
    # wide enough: the whole table, as is
    mode, text = _render(260, "Attack metrics", columns, rows, keep=())
    assert mode == "table" and rows[0][-1] in text


def test_one_row_table_is_a_key_value_list():
    mode, text = _render(80, "Gateway and accounting", ["queries", "forwarded", "rejected", "forwarded support-leaky",
                                                          "forwarded with an uncovered channel", "bookings (this run)",
                                                          "booked eps (ledger total across resumes, at delta)"],
                         [["300", "0", "300", "0", "0", "0", "0"]], keep=())
    assert mode == "keyvalue" and "  forwarded with an uncovered channel: 0" in text
    assert "\u2503" not in text     # no box


def test_marked_rows_say_they_differ():
    mode, text = _render(80, "side by side", ["", "a", "b"], [["same", "1", "1"], ["other", "1", "2"]], keep=(),
                         mark=[False, True])
    assert "* other" in text and "  same" in text and "* the values differ" in text


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
        assert "(column" not in text
        if mode not in ("list", "keyvalue"):
            assert max(len(line) for line in text.splitlines()) <= width, (width, text)
        for row in rows:
            for cell in row:
                assert cell in text, (mode, width, cell, text)


def test_list_at_80_columns_shows_whole_file_names():
    env_res = fedmem_cli("list", columns="80")
    assert env_res.returncode == 0, env_res.stderr
    assert "\u2026" not in env_res.stdout and "(column" not in env_res.stdout
    assert max(len(line) for line in env_res.stdout.splitlines()) <= 80
    lines = env_res.stdout.splitlines()
    for f in (REPO / "scenarios").glob("*.toml"):
        assert any(line.split()[:1] == [f.stem] for line in lines), f.stem   # one line per scenario: name, kind


# ------------------------------------------------------------------ a run folder is one run
def _bytes(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_resume_refuses_another_kind_or_scenario(demo_runs):
    folder, _ = demo_runs[0]
    before = _bytes(folder)
    other = fedmem_cli("run", "support_leak_40", "--out", folder, "--resume", "--json")
    assert other.returncode == 2 and other.stdout == "" and "Traceback" not in other.stderr
    assert "holds a run of kind 'dp.demo'" in other.stderr and "'federation.support_leak'" in other.stderr
    changed = fedmem_cli("run", DEMO, "--out", folder, "--resume", "--set", "seed=8", "--set", "release.attempts=3")
    assert changed.returncode == 2, changed.stderr
    assert "holds a different scenario" in changed.stderr
    assert "seed: 7 there, 8 here" in changed.stderr and "release.attempts: 14 there, 3 here" in changed.stderr
    assert _bytes(folder) == before          # nothing written, nothing booked


def test_scenario_hash_is_sha256sum_of_the_resolved_file(demo_runs):
    import hashlib
    import tomllib

    folder, payload = demo_runs[0]
    resolved = folder / "scenario.resolved.toml"
    assert payload["provenance"]["scenario_sha256"] == hashlib.sha256(resolved.read_bytes()).hexdigest()
    assert tomllib.loads(resolved.read_text())["name"] == "dp_demo"
    assert demo_runs[1][1]["provenance"]["scenario_sha256"] == payload["provenance"]["scenario_sha256"]
    prov = payload["provenance"]
    assert prov["argv"][1:4] == ["run", str(DEMO), "--out"] and prov["ray_address"] is None
    manifest = json.loads((folder / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["scenario_sha256"] == prov["scenario_sha256"]


_KILLER = """
import os, signal, sys
from fedmem.experiments import dp_demo
def stop(*a, **k):
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    import time
    time.sleep(30)
dp_demo.selections_that_fit = stop      # runs after the 'releases' and 'selections' phases
from fedmem import cli
sys.exit(cli.main(["run", "dp_demo", "--out", sys.argv[1]]))
"""


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_writes_interrupted_folder_and_resume_continues_after_completed_phases(tmp_path, sig, code):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _KILLER, str(out), sig], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "*** SIGTERM" not in res.stderr
    assert f"interrupted ({sig})" in res.stderr and "--resume" in res.stderr
    payload = json.loads((out / "results.json").read_text())
    assert payload["status"] == "interrupted" and payload["ok"] is False
    assert payload["phases_completed"] == ["releases", "selections"] and payload["error"] == f"{sig} received"
    report = (out / "report.md").read_text()
    assert "INTERRUPTED" in report and "--resume" in report
    bookings = payload["ledgers"][0]["bookings_total"]
    assert bookings == 13       # the ledger is there (and resumable)
    _check_schema(payload)

    again = fedmem_cli("run", "dp_demo", "--out", out, "--resume", "--json")
    assert again.returncode == 0, again.stderr
    done = json.loads(again.stdout)
    assert done["status"] == "complete" and done["phases_restored"] == ["releases", "selections"]
    assert done["metrics"]["released"] == 13            # restored, not re-run against a spent budget
    demo = done["ledgers"][0]
    assert (demo["bookings_this_run"], demo["bookings_total"]) == (0, 13)
    assert demo["epsilon_this_run"] == 0 and demo["epsilon_total"] > 1
    assert "## Privacy ledger: this run vs ledger total across resumes" in (out / "report.md").read_text()


def test_failure_before_the_first_booking_leaves_no_ledger(monkeypatch, capsys, tmp_path):
    from fedmem import cli
    from fedmem.dp import DurableStore

    def fails_at_start(cfg, ctx):
        DurableStore(ctx.out_dir / "ledger.sqlite")     # the ledger is opened, nothing booked
        raise ConnectionError("could not reach the Ray cluster")

    _fake_demo(monkeypatch, fails_at_start)
    out = tmp_path / "o"
    assert cli.main(["run", str(DEMO), "--out", str(out)]) == 1
    assert not out.exists()
    out.mkdir()
    assert cli.main(["run", str(DEMO), "--out", str(out)]) == 1
    assert out.is_dir() and list(out.iterdir()) == []     # the same --out can be used again


def test_failure_after_a_booking_keeps_the_ledger_and_says_failed(monkeypatch, capsys, tmp_path):
    from fedmem import cli
    from fedmem.dp import Accountant, DurableStore, GaussianMechanism

    def fails_later(cfg, ctx):
        acc = Accountant("rdp", store=DurableStore(ctx.out_dir / "ledger.sqlite"), name="x")
        acc.book(GaussianMechanism.calibrate(1.0, 1e-6, 1.0).event())
        raise RuntimeError("worker died")

    _fake_demo(monkeypatch, fails_later)
    out = tmp_path / "o"
    assert cli.main(["run", str(DEMO), "--out", str(out)]) == 1
    payload = json.loads((out / "results.json").read_text())
    assert payload["status"] == "failed" and "worker died" in payload["error"]
    assert payload["ledgers"][0]["bookings_total"] == 1
    _check_schema(payload)


# ------------------------------------------------------------------ scenarios by name, validate, show
def test_validate_checks_without_running(tmp_path):
    ok = fedmem_cli("validate", "dp_demo", DEMO, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("ok ") == 2 and list(tmp_path.iterdir()) == []
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "dp.demo"\nseed = -1\n')
    res = fedmem_cli("validate", "dp_demo", bad, "--set", "data.clip=1e308")
    assert res.returncode == 2 and "Traceback" not in res.stdout + res.stderr
    assert "data.clip: 1e+308 is too large" in res.stdout
    assert "seed" in res.stdout and "release.epsilon" in res.stdout
    missing = fedmem_cli("validate", "dp_dem")
    assert missing.returncode == 2 and "did you mean dp_demo" in missing.stdout


def test_show_a_scenario_by_name():
    res = fedmem_cli("show", "dp_demo")
    assert res.returncode == 0, res.stderr
    assert "release.epsilon" in res.stdout and "dp.demo" in res.stdout
    res = fedmem_cli("show", "no_such_thing")
    assert res.returncode == 2 and "neither an experiment kind" in res.stderr


@pytest.mark.parametrize("scenario, override, key", [
    ("support_leak_40", "federation.shards=1000000000", "federation.shards"),
    ("support_leak_40", "attack.queries=1000000000000", "attack.queries"),
    ("support_leak_40", "federation.clip=1e308", "federation.clip"),
    ("dp_demo", "data.clip=1e308", "data.clip"),
])
def test_sizes_and_overflowing_values_named_by_key_before_anything_runs(scenario, override, key, tmp_path):
    res = fedmem_cli("run", scenario, "--set", override, "--out", tmp_path / "o", timeout=120)
    assert res.returncode == 2, res.stderr
    assert f": {key}: " in res.stderr and "Traceback" not in res.stderr
    assert "=inf" not in res.stderr and "inf GiB" not in res.stderr      # real sizes in the hint, never inf
    assert not (tmp_path / "o").exists()


def test_resource_hint_names_real_sizes_never_inf():
    from fedmem.cli import _largest_settings

    cfg = {"federation": {"shards": 40, "epsilon_budget": float("inf"), "total_epsilon_budget": float("inf"),
                          "records_per_shard": 50}, "seed": 10**9}
    assert _largest_settings(cfg) == "federation.records_per_shard=50, federation.shards=40"


def test_long_phases_print_progress_without_a_terminal(tmp_path, capsys):
    from fedmem.report import RunContext

    ctx = RunContext(tmp_path, 0, show_progress=False, quiet=True)
    ctx.heartbeat_s = 0.0
    assert list(ctx.progress(range(3), description="adaptive queries")) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "[fedmem] adaptive queries: 1/3" in err and "about" in err


# ------------------------------------------------------------------ compare and the results.json schema
def _check_schema(payload):
    jsonschema = pytest.importorskip("jsonschema")
    from fedmem.report import results_schema

    schema = results_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(payload)


def test_results_json_matches_the_shipped_schema(demo_runs):
    for folder, payload in demo_runs:
        _check_schema(json.loads((folder / "results.json").read_text()))
    broken = dict(demo_runs[0][1], status="done")
    with pytest.raises(Exception, match="done"):
        _check_schema(broken)                  # the schema can fail


def test_compare_puts_runs_side_by_side(demo_runs, tmp_path):
    (a, _), (b, _) = demo_runs
    res = fedmem_cli("compare", a, b, "--out", tmp_path / "cmp", columns="120")
    assert res.returncode == 0, res.stderr
    for word in ("status", "verdict", "released", "scenario_sha256", a.name, b.name):
        assert word in res.stdout, word
    for name in ("compare.md", "compare.csv", "compare.png", "compare.pdf"):
        assert (tmp_path / "cmp" / name).is_file(), name
    as_json = json.loads(fedmem_cli("compare", a, b, "--out", tmp_path / "cmp2", "--json").stdout)
    rows = {r[0]: r[1:] for r in as_json["rows"]}
    assert rows["status"] == ["complete", "complete"] and rows["released"] == [13, 13]
    bad = fedmem_cli("compare", a, tmp_path)
    assert bad.returncode == 2 and "no results.json" in bad.stderr


def test_readme_documentation_table_lists_every_docs_page():
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Documentation", 1)[1]
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"`docs/{page.name}`" in table, page.name
    for command in ("fedmem validate", "fedmem compare", "fedmem run support_leak_40", "fedmem show dp_demo"):
        assert command in readme, command


def test_demo_at_80_columns_has_no_split_table(monkeypatch):
    """`make demo` at COLUMNS=80: each setup's attack table and the side-by-side comparison fit,
    never in column groups ("columns N-M of")."""
    import re

    from fedmem import cli
    from fedmem.report import Result, Table

    columns = ["attack", "success rate", "n pos/neg", "AUC", "AUC 95% CI", "TPR@1%FPR", "empirical eps (CP lower)",
               "booked eps (what it saw)", "power", "verdict"]
    table = Table("Attack metrics (what the adversary got vs what was booked for it)", columns,
                  [[r[0], *r[1:]] for r in _attack_rows(10)], note="Overall verdict: LEAK. One rule decides.")
    metrics = {"forwarded": 300, "rejected": 0, "verdict": "LEAK", "reconstruction": {"rate": 1.0, "chance_rate": 0.42},
               "differencing": {"auc": 1.0, "eps_lower": 3.47, "eps_booked": 4.25, "label": "LEAK",
                                "verdict": "LEAK (perfect separation: ROC above the DP ceiling of eps 4.25)"},
               "attacks": {"differencing": {"verdict": "LEAK (perfect separation)"}}, "epsilon_spent_total": 178.3}
    monkeypatch.setattr(cli, "run_scenario", lambda path, *a, **k: (
        {"metrics": metrics}, Result(metrics=metrics, tables=[table]), Path("runs") / Path(path).stem))
    res = fedmem("demo", columns="80")
    assert res.returncode == 0, res.stderr
    assert not re.search(r"columns? \d+(-\d+)? of \d+", res.stdout), res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert "LEAK [1]" in res.stdout and "What the adversary got" in res.stdout
