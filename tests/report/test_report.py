"""Run folders (fedmem/report.py): provenance, the resolved scenario, report.md's file list.

Everything here writes a run folder from a loaded scenario and a hand-made Result, so
no experiment runs; the end-to-end checks through the CLI are in tests/cli/test_cli.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedmem import report as R
from fedmem.report import Result, RunContext, Table, write_run
from fedmem.registry import load_scenario
from fedmem.scenario import dump_toml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scenarios" / "dp_demo.toml"
TRICKY = "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x1f\x7f\x80\x9f\"'\\\u00e9\u2028\u2029\ufeff\U0001f600[]{}=#"


def _write(tmp_path, overrides=(), metrics=None, name="run", before=None):
    sc = load_scenario(DEMO, list(overrides))
    out = tmp_path / name
    if before:
        out.mkdir(parents=True, exist_ok=True)
        before(out)
    ctx = RunContext(out, sc.config.seed, show_progress=False, quiet=True)
    res = Result(metrics=dict(metrics or {"released": 1}), tables=[Table("t", ["a", "b"], [[1, 0.5]])])
    return sc, ctx, res, out


# ------------------------------------------------------------------ provenance
def test_results_json_has_provenance(tmp_path):
    sc, ctx, res, out = _write(tmp_path, metrics={"phase_seconds": {"reconstruction": 1.25, "differencing": 0.5}})
    payload = write_run(sc, ctx, res, 2.0)
    prov = json.loads((out / "results.json").read_text())["provenance"]
    assert prov == payload["provenance"]
    import fedmem

    assert prov["fedmem"] == fedmem.__version__
    assert prov["seed"] == 7 and prov["resumed"] is False
    assert set(prov["packages"]) == {"torch", "crypten", "ray", "flwr", "dp-accounting", "numpy"}
    assert prov["packages"]["numpy"] == metadata.version("numpy") == np.__version__
    assert prov["phase_seconds"] == {"reconstruction": 1.25, "differencing": 0.5}
    assert json.loads((out / "results.json").read_text())["metrics"]["phase_seconds"]["differencing"] == 0.5
    # The hash is that of scenario.resolved.toml exactly as written (what `sha256sum` prints).
    assert prov["scenario_sha256"] == hashlib.sha256((out / "scenario.resolved.toml").read_bytes()).hexdigest()
    assert prov["argv"] and isinstance(prov["argv"], list) and "ray_address" in prov
    assert tomllib.loads((out / "scenario.resolved.toml").read_text())["name"] == "dp_demo"   # keeps its name
    m = prov["machine"]
    assert m["cpu_count"] >= 1 and m["python"].count(".") == 2 and m["platform"]
    assert m["memory_bytes"] is None or m["memory_bytes"] > 2**20
    commit = prov["git_commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit), commit
    if (REPO / ".git").exists() and commit is not None:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert commit == head.stdout.strip()


def test_provenance_without_phases_or_git(monkeypatch):
    def no_git(*a, **k):
        raise FileNotFoundError("git")

    R.git_commit.cache_clear()
    monkeypatch.setattr(R.subprocess, "run", no_git)
    monkeypatch.setattr(R, "_package_version", lambda name: None if name == "crypten" else "1.0")
    try:
        prov = R.provenance(scenario_sha256="ab", seed=3, metrics={"x": 1})
    finally:
        R.git_commit.cache_clear()
    assert prov["git_commit"] is None and prov["git_dirty"] is None
    assert prov["phase_seconds"] is None and prov["packages"]["crypten"] is None
    assert prov["packages"]["torch"] == "1.0" and prov["seed"] == 3


def test_missing_package_version_is_none():
    assert R._package_version("fedmem-no-such-package") is None
    assert R._package_version("numpy") == np.__version__


def test_total_memory_falls_back_to_proc_meminfo(monkeypatch):
    direct = R.total_memory_bytes()

    def broken(name):
        raise ValueError(name)

    monkeypatch.setattr(R.os, "sysconf", broken)
    fallback = R.total_memory_bytes()
    if Path("/proc/meminfo").is_file():
        assert fallback is not None and direct is not None
        assert abs(fallback - direct) <= 0.01 * direct  # the same memory, two sources
    else:
        assert fallback is None


def test_same_config_same_hash_whatever_the_path(tmp_path):
    sc, ctx, res, out = _write(tmp_path)
    first = write_run(sc, ctx, res, 1.0)["provenance"]["scenario_sha256"]
    again = load_scenario(out / "scenario.resolved.toml")
    ctx2 = RunContext(tmp_path / "again", again.config.seed, show_progress=False, quiet=True)
    second = write_run(again, ctx2, res, 1.0)["provenance"]["scenario_sha256"]
    assert first == second
    sc3, ctx3, _, _ = _write(tmp_path, ["seed=8"], name="other")
    assert write_run(sc3, ctx3, res, 1.0)["provenance"]["scenario_sha256"] != first


# ------------------------------------------------------------------ resolved scenario (TOML)
_text = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(TRICKY)), max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(a=_text, b=_text, key=_text.filter(bool), items=st.lists(_text, max_size=4))
def test_dump_toml_round_trips_any_string(a, b, key, items):
    data = {"name": a, "n": 3, "x": 1e-06, "flag": True,
            "section": {key: b, "list": items, "nested": {"deep": a + b, "nums": [1.5, -2.0]}}}
    assert tomllib.loads(dump_toml(data)) == data


def test_dump_toml_refuses_none_naming_the_key():
    with pytest.raises(TypeError, match=r"section\.k is None"):
        dump_toml({"section": {"k": None}})


def test_resolved_scenario_round_trips_fuzzed_strings(tmp_path):
    """Control characters, quotes, backslashes and unicode in scenario strings and in
    overrides survive scenario.resolved.toml: re-loading it gives the same config."""
    gen = np.random.default_rng(20261130)
    pool = list(TRICKY) + [chr(c) for c in range(0x20)] + ["a", "b", " ", "\u4e2d", "\u0301"]
    for i in range(25):
        s = "".join(gen.choice(pool, size=int(gen.integers(1, 30))))
        literal = '"' + "".join(f"\\u{ord(c):04x}" if c in '"\\\x7f' or c < " " else c for c in s) + '"'
        raw_override = "description=" + s  # a raw value: taken as a string when not a TOML literal
        overrides = [f"description={literal}", f"name=\"run{i}\""]
        if i % 2:
            overrides.append(raw_override)
        sc, ctx, res, out = _write(tmp_path, overrides, name=f"r{i}")
        assert sc.config.description == (raw_override.split("=", 1)[1].strip() if i % 2 else s)
        write_run(sc, ctx, res, 0.1)
        text = (out / "scenario.resolved.toml").read_text(encoding="utf-8")
        assert tomllib.loads(text) == sc.config.to_dict()
        again = load_scenario(out / "scenario.resolved.toml")
        assert again.config.to_dict() == sc.config.to_dict()


# ------------------------------------------------------------------ report.md: files and figures
def _figure(with_data: bool, kind: str = "plot"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    ax = axes[1]
    xs = [0, 1] if with_data else []
    if kind == "plot":
        ax.plot(xs, xs)
    elif kind == "scatter":
        ax.scatter(xs, xs)
    elif kind == "bar":
        ax.bar(xs, xs)
    elif kind == "fill":
        ax.fill_between(xs, xs, [x + 1 for x in xs])
    elif kind == "image":
        ax.imshow(np.zeros((2, 2)))
    return fig


@pytest.mark.parametrize("kind", ["plot", "scatter", "bar", "fill", "nothing"])
def test_figure_has_data(kind):
    import matplotlib.pyplot as plt

    assert not R.figure_has_data(empty := _figure(False, kind))
    plt.close(empty)
    if kind != "nothing":
        assert R.figure_has_data(full := _figure(True, kind))
        plt.close(full)
    assert R.figure_has_data(img := _figure(True, "image"))
    plt.close(img)


def test_report_lists_every_file_with_what_it_is(tmp_path):
    sc, ctx, res, out = _write(tmp_path)
    ctx.save_figure(_figure(True), "curve", caption="error against epsilon")
    (out / "queries.csv").write_text("a,b\n1,2\n")
    ctx.describe_file("queries.csv", "one row per adversary query")
    (out / "extra.bin").write_bytes(b"\x00")
    payload = write_run(sc, ctx, res, 0.5)
    report = (out / "report.md").read_text()
    assert "## Files in this folder" in report
    listing = report.split("## Files in this folder", 1)[1]
    lines = [ln for ln in listing.splitlines() if ln.startswith("- `")]
    on_disk = sorted(p.name for p in out.iterdir())
    assert [re.match(r"- `([^`]+)`", ln).group(1) for ln in lines] == on_disk
    assert all(re.match(r"- `[^`]+`: \S", ln) for ln in lines), lines
    assert "- `curve.png`: plot: error against epsilon" in lines
    assert "- `queries.csv`: one row per adversary query" in lines
    assert "- `extra.bin`: written by the experiment" in lines
    assert "- `report.md`: this report" in lines
    assert [f["name"] for f in payload["files"]] == on_disk
    assert "![curve](curve.png)" in report


def test_empty_figure_becomes_a_sentence(tmp_path):
    sc, ctx, res, out = _write(tmp_path)
    assert ctx.save_figure(_figure(False), "empty") is None
    ctx.note_figure_skipped("epsilon", "no attack produced an empirical epsilon.")
    payload = write_run(sc, ctx, res, 0.5)
    assert not (out / "empty.png").exists()
    report = (out / "report.md").read_text()
    assert "*No figure `empty`: no data to plot.*" in report
    assert "*No figure `epsilon`: no attack produced an empirical epsilon.*" in report
    assert "![empty]" not in report and payload["figures"] == []
    assert payload["figures_skipped"] == [{"name": "empty", "reason": "no data to plot"},
                                          {"name": "epsilon", "reason": "no attack produced an empirical epsilon."}]


def test_figures_false_skips_the_drawing_and_says_so(tmp_path):
    from fedmem.scenario import COMMON_SCHEMA

    assert COMMON_SCHEMA["figures"].default is True
    ctx = RunContext(tmp_path / "off", 0, show_progress=False, quiet=True, figures=False)
    assert ctx.save_figure(_figure(True), "curve") is None
    assert not (tmp_path / "off" / "curve.png").exists() and not (tmp_path / "off" / "curve.pdf").exists()
    assert ctx.figures == [] and ctx.figures_skipped == [("curve", "figures = false in the scenario")]


@pytest.mark.parametrize("name, reason, bad", [("", "why", "name"), ("fig", "  ", "reason"), ("fig", None, "reason")])
def test_note_figure_skipped_validates(tmp_path, name, reason, bad):
    ctx = RunContext(tmp_path, 0, show_progress=False, quiet=True)
    with pytest.raises(ValueError, match=f"^{bad} must be a non-empty string. Found"):
        ctx.note_figure_skipped(name, reason)


def test_resumed_folder_marks_files_this_run_did_not_write(tmp_path):
    def earlier(out):
        (out / "old_plot.png").write_bytes(b"png")
        (out / "results.json").write_text("{}")

    sc, _, res, out = _write(tmp_path, before=earlier)
    ctx = RunContext(out, 7, show_progress=False, quiet=True, resumed=True)
    payload = write_run(sc, ctx, res, 0.5)
    report = (out / "report.md").read_text()
    assert "- `old_plot.png`: plot (left from an earlier run in this folder; not written by this run)" in report
    assert "- `results.json`: machine-readable results" in report and "resumed:" in report
    assert payload["provenance"]["resumed"] is True


# ------------------------------------------------------------------ phases: an interrupted run resumes after them
def test_completed_phases_are_restored_not_rerun(tmp_path):
    ctx = RunContext(tmp_path, 0, show_progress=False, quiet=True)
    metrics, tables, rows = {"phase_seconds": {}}, [], []
    phases = metrics["phase_seconds"]
    assert ctx.resume_phase("one", metrics, tables, rows) is False
    metrics["auc"] = 0.75
    metrics["eps"] = float("inf")
    phases["one"] = 1.5
    tables.append(Table("t", ["a"], [[np.float64(0.5)]]))
    rows.append(["x", float("inf")])
    ctx.save_figure(_figure(True), "curve")
    ctx.phase_done("one", metrics, tables, rows)
    saved = R.read_manifest(tmp_path)
    assert saved["phases_completed"] == ["one"]
    again = RunContext(tmp_path, 0, show_progress=False, quiet=True, resumed=True, phases=saved["phases"])
    m2, t2, r2 = {"phase_seconds": {}}, [], []
    alias = m2["phase_seconds"]
    assert again.resume_phase("one", m2, t2, r2) is True
    assert m2["auc"] == 0.75 and m2["eps"] == float("inf") and alias == {"one": 1.5}   # merged in place
    assert t2[0].rows == [[0.5]] and isinstance(t2[0], Table) and r2 == [["x", float("inf")]]
    assert [p.name for p in again.figures] == ["curve.png"] and again.phases_restored == ["one"]
    assert again.resume_phase("two", m2, t2, r2) is False        # a phase never completed runs
    with pytest.raises(ValueError, match="without resume_phase"):
        again.phase_done("three", m2)


def test_ledger_summary_separates_this_run_from_the_total(tmp_path):
    from fedmem.dp import Accountant, AttributeLedger, DurableStore, GaussianMechanism

    ev = GaussianMechanism.calibrate(1.0, 1e-6, 1.0).event()
    store = DurableStore(tmp_path / "ledger.sqlite")
    acc = Accountant("rdp", store=store, name="main")
    led = AttributeLedger({"a": 5.0}, store=store, name="views")
    for _ in range(3):
        acc.book(ev)
    led.try_charge(["a"], 0.5)
    marks = R.ledger_marks(tmp_path)                      # a second run starts here
    acc.book(ev)
    led.try_charge(["a"], 0.25)
    rows = {r["name"]: r for r in R.ledger_summary(tmp_path, marks, delta=1e-6)}
    main = rows["main"]
    assert (main["bookings_this_run"], main["bookings_total"]) == (1, 4)
    one = Accountant("rdp", name="one")
    one.book(ev)
    assert main["epsilon_this_run"] == pytest.approx(one.spent(1e-6))
    assert main["epsilon_total"] == pytest.approx(acc.spent(1e-6)) and main["epsilon_total"] > main["epsilon_this_run"]
    views = rows["views"]
    assert (views["bookings_this_run"], views["bookings_total"]) == (1, 2)
    assert views["epsilon_this_run"] == 0.25 and views["epsilon_total"] == 0.75
    assert R.count_bookings(tmp_path, marks) == 2 and R.count_bookings(tmp_path) == 6


# ------------------------------------------------------------------ figures for papers
def test_every_figure_is_saved_as_pdf_and_300_dpi_png(tmp_path):
    import matplotlib.image as mpimg

    ctx = RunContext(tmp_path, 0, show_progress=False, quiet=True)
    fig = _figure(True)
    w, h = fig.get_size_inches()
    ctx.save_figure(fig, "curve")
    assert (tmp_path / "curve.pdf").read_bytes()[:4] == b"%PDF"
    img = mpimg.imread(tmp_path / "curve.png")
    assert img.shape[1] >= 0.8 * 300 * w and img.shape[1] <= 1.2 * 300 * w    # 300 dpi (tight bbox trims a bit)
    assert "curve.pdf" in ctx.file_notes


def test_roc_figure_is_log_log_with_low_fpr_marks_ceiling_and_raw_csv(tmp_path, monkeypatch):
    import csv

    from fedmem import figures as F

    ctx = RunContext(tmp_path, 0, show_progress=False, quiet=True)
    seen = {}
    real = ctx.save_figure

    def spy(fig, name, caption=""):
        ax = fig.axes[0]
        seen.update(x=ax.get_xscale(), y=ax.get_yscale(), labels=[ln.get_label() for ln in ax.lines],
                    colours={ln.get_color() for ln in ax.lines if ln.get_label().startswith(("a:", "b:"))})
        return real(fig, name, caption)

    monkeypatch.setattr(ctx, "save_figure", spy)
    g = np.random.default_rng(1)
    curves = {"a": (g.normal(1, 1, 500), g.normal(0, 1, 500)), "b": (g.normal(0.2, 1, 500), g.normal(0, 1, 500))}
    path = F.roc_figure(ctx, curves, "roc", epsilon=1.0, delta=1e-5)
    assert path.name == "roc.png" and (tmp_path / "roc.pdf").is_file()
    assert seen["x"] == "log" and seen["y"] == "log"
    assert any("DP ceiling" in lab and "eps=1" in lab for lab in seen["labels"])
    assert all("TPR@0.1%" in lab and "TPR@1%" in lab for lab in seen["labels"] if lab.startswith(("a:", "b:")))
    assert len(seen["colours"]) == 2 and seen["colours"] <= {c.lower() for c in F.PALETTE} | set(F.PALETTE)
    with open(tmp_path / "roc_points.csv") as fh:
        pts = list(csv.DictReader(fh))
    with open(tmp_path / "roc_scores.csv") as fh:
        scores = list(csv.DictReader(fh))
    assert {p["series"] for p in pts} == {"a", "b"} and len(scores) == 2000
    fpr, tpr = F.roc_points(*curves["a"])
    assert F.tpr_at(fpr, tpr, 0.01) == R_tpr(curves["a"], 0.01)
    assert "roc_points.csv" in ctx.file_notes and "roc_scores.csv" in ctx.file_notes


def R_tpr(curve, fpr):
    from fedmem.attacks import audit

    return audit.tpr_at_fpr(curve[0], curve[1], fpr)


def test_grouped_bars_keep_long_labels_apart(tmp_path):
    from fedmem import figures as F

    plt = F.pyplot()
    names = ["differencing", "noise_scale", "refusal_content", "admission_oracle", "timing", "retry_averaging",
             "near_duplicate"]
    fig, ax = plt.subplots(figsize=(6, 0.55 * len(names) + 1.4))
    F.grouped_barh(ax, names, {"booked": [1.0] * 7, "empirical": [0.2, float("inf"), 0.1, 0.0, 0.3, 0.4, 0.5]})
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_yticklabels()]
    assert len(boxes) == len(names)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)


# ------------------------------------------------------------------ report.md opens with the verdict
LEAKY = {"verdict": "LEAK", "epsilon_spent_total": 178.25,
         "attacks": {"reconstruction": {"rate": 1.0, "eps_booked": 178.25,
                                        "verdict": "LEAK (exact support channel, unbooked)"},
                     "differencing": {"eps_lower": 3.467, "eps_booked": 4.253, "label": "LEAK",
                                      "verdict": "LEAK (perfect separation: ROC above the DP ceiling; CP eps >= 3.47)"},
                     "timing": {"eps_lower": 0.0, "eps_booked": 4.253, "label": "within booked",
                                "verdict": "within booked (GDP mu >= 0.00 <= 0.83 booked)"}}}


def _first_lines(report: str) -> list[str]:
    return [ln.strip() for ln in report.splitlines()[2:5]]


def test_report_opens_with_verdict_what_leaked_and_total_booked(tmp_path):
    from fedmem.dp import Accountant, DurableStore, GaussianMechanism

    sc, ctx, res, out = _write(tmp_path, metrics=LEAKY)
    acc = Accountant("rdp", store=DurableStore(out / "ledger.sqlite"), name="main")
    acc.book(GaussianMechanism.calibrate(1.0, 1e-6, 1.0).event())
    write_run(sc, ctx, res, 0.5)
    first = _first_lines((out / "report.md").read_text())
    assert first[0] == "**Verdict: LEAK**"
    assert first[1].startswith("**What leaked:** reconstruction (exact support channel, unbooked; 178.2 booked); "
                               "differencing (perfect separation: ROC above the DP ceiling; eps >= 3.467 proven vs "
                               "4.253 booked)"), first[1]
    assert "timing" not in first[1]
    assert first[2].startswith("**Total booked:** eps 178.2 at delta 1e-06 on the run's main stream; 1 bookings in 1 "
                               "top-level"), first[2]


def test_report_without_a_leak_or_a_ledger_says_so(tmp_path):
    sc, ctx, res, out = _write(tmp_path, metrics={"verdict": "within booked", "released": 1})
    write_run(sc, ctx, res, 0.5)
    first = _first_lines((out / "report.md").read_text())
    assert first == ["**Verdict: within booked**", "**What leaked:** nothing beyond what was booked.",
                     "**Total booked:** nothing (no durable ledger in this folder)."]


def test_ledger_section_one_row_per_top_level_accountant_and_says_where_it_cuts(tmp_path):
    from fedmem.dp import Accountant, DurableStore, GaussianMechanism

    sc, ctx, res, out = _write(tmp_path)
    store = DurableStore(out / "ledger.sqlite")
    ev = GaussianMechanism.calibrate(1.0, 1e-6, 1.0).event()
    n_top = R.ledger_markdown.__defaults__[0] + 5
    for t in range(n_top):
        Accountant("rdp", store=store, name=f"target{t:02d}").book(ev)
        Accountant("rdp", store=store, name=f"target{t:02d}/principal/p-{t}").book(ev)
        Accountant("rdp", store=store, name=f"target{t:02d}/support/p-{t}")        # empty support ledger
    payload = write_run(sc, ctx, res, 0.5)
    assert [r["name"] for r in payload["ledgers"]] == [f"target{t:02d}" for t in range(n_top)]
    assert all(r["sub_ledgers"] == 2 for r in payload["ledgers"])
    report = (out / "report.md").read_text()
    section = report.split("## Privacy ledger", 1)[1].split("\n## ", 1)[0]
    assert "/support/" not in section and "/principal/" not in section
    assert "| 5 more (see ledger.sqlite) |" in section
    assert section.count("| ledger.sqlite | target") == n_top - 5
