"""Run folders: ``results.json``, ``report.md``, PNG plots and the resolved scenario.

An experiment's run function receives a :class:`RunContext` (seeded RNG streams,
progress bars, figure saving, logging) and returns a :class:`Result` (metrics, tables,
free-form report sections). :func:`write_run` turns the result into the run folder:
``results.json`` (with a ``provenance`` object: versions, git commit, scenario hash,
machine), ``scenario.resolved.toml`` and ``report.md`` (which lists every file of the
folder with what it is).

The package (``fedmem.report``; every name below is importable from it):

- ``__init__``: writing the run folder (:func:`write_run`, :func:`resolved_text`, report.md's
  file list) and the provenance of results.json (versions, git commit, machine).
- :mod:`fedmem.report.results`: :class:`Table`, :class:`Result`, :func:`format_value`,
  :func:`to_jsonable`, the results.json schema, :func:`load_results`.
- :mod:`fedmem.report.context`: :class:`RunContext`, :func:`figure_has_data`.
- :mod:`fedmem.report.state`: phase state and the run manifest (``run.json``).
- :mod:`fedmem.report.ledgers`: durable ledgers, this run vs the folder's total.
- :mod:`fedmem.report.compare`: :func:`compare_runs` (``fedmem compare``).
- :mod:`fedmem.report.console`: terminal tables that never truncate (:func:`print_table`).

:func:`provenance` (and ``_package_version``, which tests replace on this module) stays here
with :func:`write_run`, its caller, so that no submodule imports the package.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

from fedmem import __version__
from fedmem.report.compare import HEADLINE_KEYS, compare_runs
from fedmem.report.console import SHORT_CELL, make_console, print_result_tables, print_table
from fedmem.report.context import FIGURE_DPI, RunContext, figure_has_data, snapshot_files
from fedmem.report.ledgers import COMPOSE_LIMIT, count_bookings, ledger_markdown, ledger_marks, ledger_summary
from fedmem.report.results import RESULTS_SCHEMA, Result, Table, format_value, load_results, results_schema, \
    to_jsonable
from fedmem.report.state import MANIFEST, merge_metrics, plain_state, read_manifest, revive_state, stable_json, \
    write_manifest

_fmt = format_value  # its name before the split (tests import it)

__all__ = [
    "COMPOSE_LIMIT", "FIGURE_DPI", "FILE_NOTES", "HEADLINE_KEYS", "MANIFEST", "PROVENANCE_PACKAGES", "RESOLVED_HEADER",
    "RESULTS_SCHEMA", "SHORT_CELL", "Result", "RunContext", "Table", "compare_runs", "count_bookings",
    "figure_has_data", "format_value", "git_commit", "headline_lines", "ledger_markdown", "ledger_marks", "ledger_summary",
    "load_results", "machine_info", "make_console", "merge_metrics", "plain_state", "print_result_tables",
    "print_table", "provenance", "read_manifest", "resolved_text", "results_schema", "revive_state",
    "snapshot_files", "stable_json", "to_jsonable", "total_memory_bytes", "write_manifest", "write_run", "_fmt",
]


# ---------------------------------------------------------------- provenance
PROVENANCE_PACKAGES = ("torch", "crypten", "ray", "flwr", "dp-accounting", "numpy")


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except Exception:  # PackageNotFoundError, or broken metadata: provenance never fails a run
        return None


@functools.lru_cache(maxsize=1)
def git_commit() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout fedmem runs from; (None, None) when not one.

    Only the package's own repository counts (its parent folder must hold ``.git``), so
    an installed copy inside some other repository reports None. Never raises.
    """
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / ".git").exists():
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, stdin=subprocess.DEVNULL)
        if head.returncode != 0 or not head.stdout.strip():
            return None, None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return head.stdout.strip(), dirty
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, None


def total_memory_bytes() -> int | None:
    """Physical memory in bytes (os.sysconf, else /proc/meminfo); None when unknown."""
    try:
        n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if n > 0:
            return int(n)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"cpu_count": os.cpu_count(), "cpus_usable": usable, "memory_bytes": total_memory_bytes(),
            "platform": platform.platform(), "python": platform.python_version()}


def provenance(*, scenario_sha256: str, seed: int, metrics: dict | None = None, resumed: bool = False,
               argv: Sequence[str] | None = None, ray_address: str | None = None) -> dict:
    """What produced a run: fedmem version and git commit, library versions, scenario hash,
    seed, the command line (``argv``), the Ray address attached to (None: a private local
    instance), machine, and the experiment's per-phase wall times (``metrics["phase_seconds"]``).

    ``scenario_sha256`` is the SHA-256 of ``scenario.resolved.toml`` exactly as written
    (``sha256sum scenario.resolved.toml`` prints it).
    """
    commit, dirty = git_commit()
    phases = (metrics or {}).get("phase_seconds")
    return {
        "fedmem": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": {name: _package_version(name) for name in PROVENANCE_PACKAGES},
        "scenario_sha256": scenario_sha256,
        "seed": int(seed),
        "resumed": bool(resumed),
        "argv": list(sys.argv if argv is None else argv),
        "ray_address": ray_address or os.environ.get("RAY_ADDRESS") or None,
        "machine": machine_info(),
        "phase_seconds": dict(phases) if isinstance(phases, dict) else None,
    }


# ---------------------------------------------------------------- run folder
FILE_NOTES = {
    "results.json": "machine-readable results: metrics, tables, figures, config and provenance",
    "report.md": "this report",
    "scenario.resolved.toml": "the scenario with every default and override filled in; "
                              "`fedmem run` it to repeat this run",
    "ledger.sqlite": "durable privacy ledgers and accountants (SQLite): every budget booked in this folder; "
                     "`fedmem run --resume --out` this folder continues from them",
    MANIFEST: "the run folder's identity (kind, scenario hash, status, completed phases); "
              "`fedmem run --resume` checks it and continues after the completed phases",
}
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")  # transient; gone when the database is closed
_EXT_NOTES = {".png": "plot", ".pdf": "plot (vector PDF)", ".csv": "table (CSV) written by the experiment",
              ".json": "JSON written by the experiment", ".sqlite": "SQLite database written by the experiment"}


def _file_lines(ctx: RunContext, written: Iterable[str]) -> list[tuple[str, str]]:
    """(name, what it is) for every file of the run folder, sorted by name."""
    figures = {p.name: p.stem for p in ctx.figures}
    now = snapshot_files(ctx.out_dir)
    names = set(now) | set(written)
    names = {n for n in names if not (n.endswith(_SQLITE_SIDECARS) and n.rsplit("-", 1)[0] in names)}
    rows = []
    for name in sorted(names):
        if name in ctx.file_notes:
            what = ctx.file_notes[name]
        elif name in FILE_NOTES:
            what = FILE_NOTES[name]
        elif name in figures:
            what = f"plot: {figures[name]}"
        else:
            what = _EXT_NOTES.get(Path(name).suffix, "written by the experiment")
        known = name in written or name in figures or name in ctx.file_notes or name in FILE_NOTES
        if not known and name in ctx._before and now.get(name) == ctx._before[name]:
            what += " (left from an earlier run in this folder; not written by this run)"
        rows.append((name, what))
    return rows


def _comment_safe(text: str) -> str:
    """Text a TOML comment may hold: control characters (except tab) escaped."""
    return "".join(c if c == "\t" or (c >= " " and c != "\x7f") else f"\\x{ord(c):02x}" for c in text)


RESOLVED_HEADER = ("# fedmem resolved scenario: every default and override filled in; the source file and the "
                   "overrides are in results.json.\n# scenario_sha256 in results.json is the SHA-256 of this file "
                   "as written (sha256sum).\n")


def resolved_text(scenario) -> tuple[str, str, dict]:
    """(text of scenario.resolved.toml, its SHA-256, the resolved config). The resolved scenario
    keeps the run's name (a file with ``name = ""`` gets its file stem), so re-running the
    resolved file reproduces the run folder's name and hash; the text does not depend on the
    source path, so the same scenario has the same hash wherever it was loaded from."""
    from fedmem.scenario import dump_toml  # lazy: ~38 ms, no heavy package

    cfg = scenario.config.to_dict()
    cfg["name"] = scenario.name
    text = RESOLVED_HEADER + dump_toml(cfg)
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest(), cfg


def _config_delta(cfg: dict) -> float | None:
    """The scenario's first ``delta`` key (depth first), to state accountants' epsilon at it."""
    for k, v in cfg.items():
        if k == "delta" and isinstance(v, float) and 0 < v < 1:
            return v
    for v in cfg.values():
        if isinstance(v, dict):
            d = _config_delta(v)
            if d is not None:
                return d
    return None


def _leak_label(d) -> str | None:
    for key in ("label", "verdict"):
        v = d.get(key)
        if isinstance(v, str) and v.startswith(("LEAK", "EXCEEDS")):
            return v
    return None


def _leaks(metrics: dict) -> list[tuple[str, dict]]:
    """(name, its metrics) of every attack / audit row whose verdict is LEAK or EXCEEDS (a budget),
    from ``metrics["attacks"]`` and the top-level metric dicts (one level down too: dp.demo's
    ``float_bits.fast``); each name once."""
    found: dict[str, dict] = {}

    def visit(name, d, depth):
        if not isinstance(d, dict):
            return
        if _leak_label(d):
            found.setdefault(name, d)
        elif depth:
            for k, v in d.items():
                visit(f"{name}.{k}" if name else k, v, depth - 1)

    for k, v in (metrics.get("attacks") or {}).items():
        visit(k, v, 0)
    for k, v in metrics.items():
        if k != "attacks" and k not in found:
            visit(k, v, 1)
    return list(found.items())


def _num(x) -> str:
    if isinstance(x, str) and x in ("inf", "-inf"):   # results.json's infinities
        return x
    return format_value(float(x)) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def headline_lines(metrics: dict, ledgers: list[dict], status: str = "complete") -> list[str]:
    """report.md's first three lines: the overall verdict, what leaked (each LEAK row's epsilon
    lower bound vs what it booked), the total booked."""
    verdict = metrics.get("verdict")
    if status != "complete":
        first = f"**Status: {status.upper()}**" + (f" (verdict of the completed phases: {verdict})" if verdict else "")
    elif isinstance(verdict, str) and verdict:
        first = f"**Verdict: {verdict}**"
    else:
        first = "**Verdict: none** (this experiment states no privacy verdict)"
    parts = []
    # rows shown for comparison only (dp.demo's other sampler) do not make a run whose verdict is not LEAK leak
    overall_leaks = not isinstance(verdict, str) or verdict.startswith(("LEAK", "EXCEEDS"))
    for name, d in (_leaks(metrics) if overall_leaks else []):
        text = d.get("verdict") if isinstance(d.get("verdict"), str) else _leak_label(d)
        head, _, reason = text.partition(" (")
        if "eps_lower" in d and "eps_booked" in d:
            what = f"eps >= {_num(d['eps_lower'])} proven vs {_num(d['eps_booked'])} booked"
        elif "epsilon_seen" in d:
            what = f"eps seen {_num(d.get('epsilon_seen'))}, total budget {_num(d.get('total_epsilon_budget'))}"
        elif "eps_booked" in d:
            what = f"{_num(d['eps_booked'])} booked"
        else:
            what = ""
        why = reason.rstrip(")").split(";")[0] if reason else head
        parts.append(f"{name} ({'; '.join(x for x in (why, what) if x)})")
    second = "**What leaked:** " + ("; ".join(parts) if parts else "nothing beyond what was booked") + "."
    total = next((metrics[k] for k in ("epsilon_spent_total", "epsilon_spent") if
                  isinstance(metrics.get(k), (int, float)) and not isinstance(metrics.get(k), bool)), None)
    n_book = sum(int(r.get("bookings_total") or 0) for r in ledgers)
    stores = f"{n_book:,} bookings in {len(ledgers)} top-level accountant(s)/ledger(s) (ledger.sqlite)"
    if total is not None:
        at = next((r["delta"] for r in ledgers if r.get("delta")), None)
        third = f"**Total booked:** eps {_num(total)}" + (f" at delta {at:g}" if at else "") + \
            f" on the run's main stream; {stores}."
    elif ledgers:
        top = max(ledgers, key=lambda r: (r.get("epsilon_total") is not None, r.get("epsilon_total") or 0))
        third = (f"**Total booked:** {stores}; the largest: {top['name']}, eps {_num(top.get('epsilon_total'))}"
                 + (f" at delta {top['delta']:g}" if top.get("delta") else "") + ".")
    else:
        third = "**Total booked:** nothing (no durable ledger in this folder)."
    return [first, second, third]


def write_run(scenario, ctx: RunContext, result: Result | None, wall_s: float, *, status: str = "complete",
              error: str | None = None, argv: Sequence[str] | None = None) -> dict:
    """Write results.json, scenario.resolved.toml, run.json and report.md.

    ``status`` is ``"complete"``, or ``"interrupted"`` / ``"failed"`` (then ``result`` may be
    None: the metrics are those of the phases completed so far, and report.md is short and says
    how to resume).
    """
    toml_text, sha, cfg = resolved_text(scenario)
    (ctx.out_dir / "scenario.resolved.toml").write_text(toml_text, encoding="utf-8")
    manifest = read_manifest(ctx.out_dir) or {}
    manifest.update(kind=scenario.experiment.kind, name=scenario.name, scenario_sha256=sha, status=status,
                    phases_completed=list(ctx.phases_completed))
    if status == "complete":
        manifest["phases"] = {}   # a completed run is not continued phase by phase: a resume starts a new run
    write_manifest(ctx.out_dir, manifest)
    if result is None:
        metrics: dict = {}
        for name in ctx.phases_completed:
            merge_metrics(metrics, revive_state(ctx._saved_phases.get(name, {}).get("metrics", {})))
        result = Result(metrics=metrics, ok=False)
    ledgers = ledger_summary(ctx.out_dir, ctx.ledger_marks, _config_delta(cfg))
    written = ["results.json", "scenario.resolved.toml", "report.md", MANIFEST]
    files = _file_lines(ctx, written)
    payload = {
        "status": status,
        "scenario": str(scenario.path),
        "kind": scenario.experiment.kind,
        "name": scenario.name,
        "seed": ctx.seed,
        "overrides": scenario.overrides,
        "wall_s": round(wall_s, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "ok": bool(result.ok) and status == "complete",
        "error": error,
        "phases_completed": list(ctx.phases_completed),
        "phases_restored": list(ctx.phases_restored),
        "metrics": result.metrics,
        "ledgers": ledgers,
        "tables": [t.to_dict() for t in result.tables],
        "figures": [p.name for p in ctx.figures],
        "figures_skipped": [{"name": n, "reason": r} for n, r in ctx.figures_skipped],
        "files": [{"name": n, "what": w} for n, w in files],
        "config": cfg,
        "provenance": provenance(scenario_sha256=sha, seed=ctx.seed, metrics=result.metrics, resumed=ctx.resumed,
                                 argv=argv, ray_address=ctx.ray_address),
    }
    payload = to_jsonable(payload)
    (ctx.out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    md = [f"# {scenario.name}", "", *[line + "  " for line in headline_lines(result.metrics, ledgers, status)], "",
          f"*{cfg.get('description') or scenario.experiment.description}*", "", f"- kind: `{scenario.experiment.kind}`", f"- scenario: `{scenario.path}`",
          f"- seed: {ctx.seed}", f"- wall time: {wall_s:.1f} s"]
    if status != "complete":
        done = ", ".join(ctx.phases_completed) or "none"
        md.append(f"- status: **{status.upper()}**" + (f" ({error})" if error else "") +
                  f"; phases completed: {done}. Continue with `fedmem run {scenario.path} --out {ctx.out_dir} "
                  "--resume` (completed phases are not run again; budgets spent stay spent)")
    if ctx.resumed:
        md.append("- resumed: this run continued the durable ledgers/accountants already in this folder "
                  "(budgets spent by earlier runs stay spent)")
    if ctx.phases_restored:
        md.append(f"- phases restored from the interrupted run in this folder (not run again): "
                  f"{', '.join(ctx.phases_restored)}")
    md.append("")
    for t in result.tables:
        md += [t.markdown(), ""]
    for heading, body in result.sections:
        md += [f"## {heading}", "", body, ""]
    if ledgers:
        md += ["## Privacy ledger: this run vs ledger total across resumes", "",
               ledger_markdown(ledgers, ctx.resumed), ""]
    for p in ctx.figures:
        md += [f"![{p.stem}]({p.name})", ""]
    for name, reason in ctx.figures_skipped:
        md += [f"*No figure `{name}`: {reason.rstrip('.')}.*", ""]
    if ctx.log_lines:
        md += ["## Log", "", "```", *ctx.log_lines, "```", ""]
    md += ["## Files in this folder", ""]
    md += [f"- `{name}`: {what}" for name, what in files]
    md.append("")
    (ctx.out_dir / "report.md").write_text("\n".join(md))
    return payload
