"""Run folders: ``results.json``, ``report.md``, PNG plots and the resolved scenario.

An experiment's run function receives a :class:`RunContext` (seeded RNG streams,
progress bars, figure saving, logging) and returns a :class:`Result` (metrics, tables,
free-form report sections). :func:`write_run` turns the result into the run folder:
``results.json`` (with a ``provenance`` object: versions, git commit, scenario hash,
machine), ``scenario.resolved.toml`` and ``report.md`` (which lists every file of the
folder with what it is).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np


@dataclass
class Table:
    title: str
    columns: Sequence[str]
    rows: list[Sequence[Any]]
    note: str = ""

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        out.append("| " + " | ".join(map(str, self.columns)) + " |")
        out.append("|" + "---|" * len(self.columns))
        for row in self.rows:
            out.append("| " + " | ".join(_fmt(v) for v in row) + " |")
        if self.note:
            out += ["", self.note]
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows],
                "note": self.note}


@dataclass
class Result:
    """What an experiment returns. ``metrics`` must be JSON-serialisable (numpy ok)."""

    metrics: dict
    tables: list[Table] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, markdown)
    ok: bool = True


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Path):
        return str(obj)
    return obj


class RunContext:
    """Services an experiment gets: seeded RNG streams, progress, figures, log.

    ``resumed`` is true when the run continues in a folder that already held a run
    (``fedmem run --resume``): durable ledgers/accountants there keep what they spent.
    """

    def __init__(self, out_dir: Path, seed: int, *, show_progress: bool = True,
                 ray_address: str | None = None, quiet: bool = False, resumed: bool = False):
        self.out_dir = Path(out_dir)
        self.seed = int(seed)
        self.ray_address = ray_address
        self.show_progress = show_progress
        self.quiet = quiet
        self.resumed = bool(resumed)
        self.figures: list[Path] = []
        self.figures_skipped: list[tuple[str, str]] = []  # (name, reason)
        self.file_notes: dict[str, str] = {}  # file name (relative to out_dir) -> what it is
        self.log_lines: list[str] = []
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._before = _snapshot(self.out_dir)  # files already there (a resumed folder)

    def rng(self, *stream: str | int) -> np.random.Generator:
        """An independent generator per named stream, derived from the scenario seed."""
        words = [self.seed]
        for s in stream:
            h = hashlib.sha256(str(s).encode()).digest()
            words.append(int.from_bytes(h[:4], "little"))
        return np.random.default_rng(np.random.SeedSequence(words))

    def progress(self, iterable: Iterable, total: int | None = None, description: str = "") -> Iterator:
        """Iterate with a progress bar on stderr (none in --json mode or when not a TTY-less quiet run)."""
        if not self.show_progress:
            yield from iterable
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn
        from rich.console import Console

        if total is None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task(description or "running", total=total)
            for item in iterable:
                yield item
                bar.advance(task)

    def save_figure(self, fig, name: str, caption: str = "") -> Path | None:
        """Save ``fig`` as ``<name>.png`` and close it; ``caption`` describes it in report.md.

        A figure none of whose axes shows data (see :func:`figure_has_data`) is not saved: it is closed and recorded as
        skipped ("no data to plot"), and ``None`` is returned.
        """
        import matplotlib.pyplot as plt

        if not figure_has_data(fig):
            plt.close(fig)
            self.note_figure_skipped(name, "no data to plot")
            return None
        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.figures.append(path)
        if caption:
            self.file_notes[path.name] = f"plot: {caption}"
        return path

    def note_figure_skipped(self, name: str, reason: str) -> None:
        """Record that figure ``name`` was not drawn and why; report.md says so in its place.

        Use it instead of saving an empty plot, e.g.
        ``ctx.note_figure_skipped("epsilon", "no attack produced an empirical epsilon")``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string. Found {name!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"reason must be a non-empty string. Found {reason!r}")
        self.figures_skipped.append((name, reason.strip()))

    def describe_file(self, name: str, what: str) -> None:
        """One line on what file ``name`` (relative to the run folder) is, for report.md."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string. Found {name!r}")
        self.file_notes[name] = str(what)

    def log(self, message: str) -> None:
        self.log_lines.append(message)
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)


def figure_has_data(fig) -> bool:
    """Whether any axes of ``fig`` shows data: a line or collection with points, an image, a patch."""
    from matplotlib.collections import PathCollection

    for ax in getattr(fig, "axes", []):
        if len(ax.images) or len(ax.patches):
            return True
        if any(len(line.get_xdata(orig=True)) > 0 for line in ax.lines):
            return True
        for c in ax.collections:
            if isinstance(c, PathCollection):  # scatter: one marker path, the points are offsets
                if len(c.get_offsets()) > 0:
                    return True
            elif any(len(path.vertices) > 0 for path in c.get_paths()):
                return True
    return False


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(folder).as_posix()] = (st.st_mtime_ns, st.st_size)
    return out


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
    root = Path(__file__).resolve().parent.parent
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


def provenance(*, scenario_sha256: str, seed: int, metrics: dict | None = None, resumed: bool = False) -> dict:
    """What produced a run: fedmem version and git commit, library versions, scenario hash,
    seed, machine, and the experiment's per-phase wall times (``metrics["phase_seconds"]``)."""
    from fedmem import __version__

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
}
_SQLITE_SIDECARS = ("-wal", "-shm", "-journal")  # transient; gone when the database is closed
_EXT_NOTES = {".png": "plot", ".csv": "table (CSV) written by the experiment",
              ".json": "JSON written by the experiment", ".sqlite": "SQLite database written by the experiment"}


def _file_lines(ctx: RunContext, written: Iterable[str]) -> list[tuple[str, str]]:
    """(name, what it is) for every file of the run folder, sorted by name."""
    figures = {p.name: p.stem for p in ctx.figures}
    now = _snapshot(ctx.out_dir)
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


def write_run(scenario, ctx: RunContext, result: Result, wall_s: float) -> dict:
    from fedmem.scenario import dump_toml

    cfg = scenario.config.to_dict()
    toml_text = dump_toml(cfg)
    sha = hashlib.sha256(toml_text.encode("utf-8")).hexdigest()
    written = ["results.json", "scenario.resolved.toml", "report.md"]
    files = _file_lines(ctx, written)
    payload = {
        "scenario": str(scenario.path),
        "kind": scenario.experiment.kind,
        "name": scenario.name,
        "seed": ctx.seed,
        "overrides": scenario.overrides,
        "wall_s": round(wall_s, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "ok": result.ok,
        "metrics": result.metrics,
        "tables": [t.to_dict() for t in result.tables],
        "figures": [p.name for p in ctx.figures],
        "figures_skipped": [{"name": n, "reason": r} for n, r in ctx.figures_skipped],
        "files": [{"name": n, "what": w} for n, w in files],
        "config": cfg,
        "provenance": provenance(scenario_sha256=sha, seed=ctx.seed, metrics=result.metrics, resumed=ctx.resumed),
    }
    payload = to_jsonable(payload)
    (ctx.out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    header = _comment_safe(f"# resolved from {scenario.path} with overrides {scenario.overrides}")
    (ctx.out_dir / "scenario.resolved.toml").write_text(header + "\n" + toml_text, encoding="utf-8")
    md = [f"# {scenario.name}", "", f"*{cfg.get('description') or scenario.experiment.description}*", "",
          f"- kind: `{scenario.experiment.kind}`", f"- scenario: `{scenario.path}`",
          f"- seed: {ctx.seed}", f"- wall time: {wall_s:.1f} s"]
    if ctx.resumed:
        md.append("- resumed: this run continued the durable ledgers/accountants already in this folder "
                  "(budgets spent by earlier runs stay spent)")
    md.append("")
    for t in result.tables:
        md += [t.markdown(), ""]
    for heading, body in result.sections:
        md += [f"## {heading}", "", body, ""]
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
