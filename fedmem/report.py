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
                 ray_address: str | None = None, quiet: bool = False, resumed: bool = False,
                 phases: dict | None = None):
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
        # Phases (resume_phase / phase_done): saved states of phases an interrupted earlier run
        # completed in this folder; a resumed run restores them instead of running them again.
        self._saved_phases: dict = dict(phases or {})
        self._phase_marks: dict = {}
        self.phases_completed: list[str] = []   # completed by this run or restored, in order
        self.phases_restored: list[str] = []    # restored from an earlier run, not run again
        self.ledger_marks = ledger_marks(self.out_dir)  # last booking id per durable store at the start
        # Called at every phase and progress bar (the CLI re-installs its SIGINT/SIGTERM handlers
        # there, since starting Ray replaces them with absl's stack-dumping handler).
        self.signal_hook = None

    def _hook(self) -> None:
        if self.signal_hook is not None:
            self.signal_hook()

    def rng(self, *stream: str | int) -> np.random.Generator:
        """An independent generator per named stream, derived from the scenario seed."""
        words = [self.seed]
        for s in stream:
            h = hashlib.sha256(str(s).encode()).digest()
            words.append(int.from_bytes(h[:4], "little"))
        return np.random.default_rng(np.random.SeedSequence(words))

    def progress(self, iterable: Iterable, total: int | None = None, description: str = "") -> Iterator:
        """Iterate with a progress bar on stderr (none in --json mode or when not a TTY-less quiet run)."""
        self._hook()
        if total is None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        if not self.show_progress or not sys.stderr.isatty():
            # --json runs and logs/pipes (where a live bar cannot draw): a plain line on stderr at most
            # every heartbeat_s seconds, so a long phase is never silent; stdout stays clean.
            yield from self._heartbeat(iterable, total, description or "running")
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn
        from rich.console import Console

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task(description or "running", total=total)
            for item in iterable:
                yield item
                bar.advance(task)

    # ------------------------------------------------------------ phases (resume)
    def resume_phase(self, name: str, metrics: dict, *lists: list) -> bool:
        """Start phase ``name``, or restore it when an interrupted earlier run in this folder completed it.

        Returns True when the phase was restored: its entries of ``metrics`` (merged in place),
        what it appended to each of ``lists`` (rows, tables), its figures and file notes are back,
        and the caller skips it. Otherwise returns False and remembers where the phase starts,
        so that :meth:`phase_done` can save what it added.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string. Found {name!r}")
        self._hook()
        saved = self._saved_phases.get(name)
        if saved is not None:
            _merge_metrics(metrics, _revive(saved.get("metrics", {})))
            for lst, items in zip(lists, saved.get("lists", [])):
                lst.extend(_revive(items))
            for fig in saved.get("figures", []):
                if (self.out_dir / fig).is_file() and self.out_dir / fig not in self.figures:
                    self.figures.append(self.out_dir / fig)
            self.file_notes.update(saved.get("file_notes", {}))
            self.phases_completed.append(name)
            self.phases_restored.append(name)
            self.log(f"phase {name}: restored from the interrupted run in this folder (not run again)")
            return True
        self._phase_marks[name] = ({k: _stable(v) for k, v in metrics.items()}, [len(x) for x in lists],
                                   len(self.figures), dict(self.file_notes))
        return False

    def phase_done(self, name: str, metrics: dict, *lists: list) -> None:
        """Record that phase ``name`` completed: what it added is saved in ``run.json``, so a
        run interrupted later resumes after it (``fedmem run --resume``)."""
        if name not in self._phase_marks:
            raise ValueError(f"phase_done({name!r}) without resume_phase({name!r}) first")
        before, lengths, nfig, notes = self._phase_marks.pop(name)
        changed = {k: v for k, v in metrics.items() if k not in before or _stable(v) != before[k]}
        state = {"metrics": _plain_state(changed),
                 "lists": [_plain_state(lst[n:]) for lst, n in zip(lists, lengths)],
                 "figures": [p.name for p in self.figures[nfig:]],
                 "file_notes": {k: v for k, v in self.file_notes.items() if notes.get(k) != v}}
        self._saved_phases[name] = state
        self.phases_completed.append(name)
        manifest = read_manifest(self.out_dir) or {}
        manifest.setdefault("phases", {})[name] = state
        manifest["phases_completed"] = list(self.phases_completed)
        write_manifest(self.out_dir, manifest)

    heartbeat_s = 30.0  # seconds between plain progress lines when no live bar is drawn

    def _heartbeat(self, iterable: Iterable, total: int | None, description: str) -> Iterator:
        start = last = time.monotonic()
        done = 0
        for item in iterable:
            yield item
            done += 1
            now = time.monotonic()
            if now - last >= self.heartbeat_s:
                last = now
                of = f"/{total}" if total else ""
                eta = ""
                if total:
                    rate = done / max(now - start, 1e-9)
                    eta = f", {done / total:.1%}, about {(total - done) / rate:.0f} s left"
                print(f"[fedmem] {description}: {done}{of} after {now - start:.0f} s{eta}", file=sys.stderr,
                      flush=True)

    def save_figure(self, fig, name: str, caption: str = "") -> Path | None:
        """Save ``fig`` as ``<name>.png`` (300 dpi) and ``<name>.pdf`` (vector) and close it;
        ``caption`` describes it in report.md.

        A figure none of whose axes shows data (see :func:`figure_has_data`) is not saved: it is closed and recorded as
        skipped ("no data to plot"), and ``None`` is returned.
        """
        import matplotlib.pyplot as plt

        if not figure_has_data(fig):
            plt.close(fig)
            self.note_figure_skipped(name, "no data to plot")
            return None
        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight")
        fig.savefig(path.with_suffix(".pdf"), bbox_inches="tight")
        plt.close(fig)
        self.figures.append(path)
        if caption:
            self.file_notes[path.name] = f"plot: {caption}"
        self.file_notes[path.with_suffix(".pdf").name] = f"the same plot as {path.name}, as a vector PDF (for papers)"
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


FIGURE_DPI = 300


def _stable(v) -> str:
    return json.dumps(_plain_state(v), sort_keys=True, allow_nan=True)


def _plain_state(obj):
    """JSON-ready copy of phase state: numpy to Python, tables tagged, inf/nan kept as floats."""
    if isinstance(obj, Table):
        return {"__table__": _plain_state(obj.to_dict())}
    if isinstance(obj, dict):
        return {str(k): _plain_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain_state(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain_state(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _revive(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__table__"}:
            return Table(**obj["__table__"])
        return {k: _revive(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_revive(v) for v in obj]
    return obj


def _merge_metrics(metrics: dict, saved: dict) -> None:
    """Merge ``saved`` into ``metrics`` in place (nested dicts updated, so aliases stay valid)."""
    for k, v in saved.items():
        if isinstance(v, dict) and isinstance(metrics.get(k), dict):
            _merge_metrics(metrics[k], v)
        else:
            metrics[k] = v


# ---------------------------------------------------------------- run manifest (run.json)
MANIFEST = "run.json"


def read_manifest(out_dir: Path) -> dict | None:
    """The run folder's ``run.json`` (kind, scenario hash, status, completed phases), or None."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(out_dir: Path, data: dict) -> None:
    """Write ``run.json`` atomically (a crash leaves the old or the new one, never half)."""
    path = Path(out_dir) / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(_plain_state(data), indent=1, allow_nan=True) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- durable ledgers: this run vs total
def _ro(path: Path):
    import sqlite3

    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def ledger_marks(folder: Path) -> dict[str, dict[str, int]]:
    """For every SQLite store under ``folder``: the last accountant-event and ledger-charge id."""
    import sqlite3

    marks = {}
    for p in sorted(Path(folder).rglob("*.sqlite")):
        try:
            conn = _ro(p)
            try:
                names = _tables(conn)
                m = {}
                for table in ("accountant_events", "ledger_charges"):
                    if table in names:
                        m[table] = int(conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0])
                if m:
                    marks[p.relative_to(folder).as_posix()] = m
            finally:
                conn.close()
        except sqlite3.Error:
            continue
    return marks


def count_bookings(folder: Path, marks: dict | None = None) -> int:
    """Bookings in the stores under ``folder`` made after ``marks`` (all of them when None)."""
    now = ledger_marks(folder)
    total = 0
    for f, m in now.items():
        for table, last in m.items():
            total += max(0, last - ((marks or {}).get(f, {}).get(table, 0)))
    return total


COMPOSE_LIMIT = 2000  # events per accountant composed for the report (beyond: counts only)


def _compose(kind: str, events: list[str], delta: float) -> float:
    from fedmem.dp import Accountant
    from fedmem.dp.accountant import event_from_dict

    acc = Accountant(kind, name="report")
    for ev in events:
        acc.book(event_from_dict(json.loads(ev)))
    return acc.spent(delta)


def ledger_summary(folder: Path, marks: dict, delta: float | None = None, limit: int = 50) -> list[dict]:
    """Per accountant / ledger of every store under ``folder``: bookings and epsilon of this run
    (after ``marks``) next to the total across every run in the folder (resumes included).

    Accountants report epsilon at their budget's delta, else at ``delta`` (None: counts only);
    pure ledgers report the largest per-attribute spend. At most ``limit`` rows.
    """
    import sqlite3

    rows: list[dict] = []
    for f in sorted(ledger_marks(folder)):
        start = marks.get(f, {})
        try:
            conn = _ro(Path(folder) / f)
        except sqlite3.Error:
            continue
        try:
            names = _tables(conn)
            if "accountant_events" in names and "accountant_meta" in names:
                meta = {a: (k, bd) for a, k, bd in conn.execute(
                    "SELECT accountant, kind, budget_delta FROM accountant_meta ORDER BY accountant")}
                for acc_name, (kind, bdelta) in meta.items():
                    evs = conn.execute("SELECT id, event FROM accountant_events WHERE accountant=? ORDER BY id",
                                       (acc_name,)).fetchall()
                    mine = [e for i, e in evs if i > start.get("accountant_events", 0)]
                    at = bdelta if bdelta is not None else delta
                    row = {"store": f, "type": "accountant", "name": acc_name, "kind": kind,
                           "bookings_this_run": len(mine), "bookings_total": len(evs),
                           "delta": at, "epsilon_this_run": None, "epsilon_total": None}
                    if at is not None and 0 < at < 1 and len(evs) <= COMPOSE_LIMIT:
                        try:
                            row["epsilon_total"] = _compose(kind, [e for _, e in evs], at)
                            row["epsilon_this_run"] = (_compose(kind, mine, at) if len(mine) != len(evs)
                                                       else row["epsilon_total"])
                        except Exception:  # noqa: BLE001 - a summary never fails a run
                            pass
                    rows.append(row)
            if "ledger_charges" in names:
                for (lname,) in conn.execute("SELECT DISTINCT ledger FROM ledger_charges ORDER BY ledger"):
                    tot: dict = {}
                    run: dict = {}
                    n_all = n_mine = 0
                    for i, attrs, eps in conn.execute(
                            "SELECT id, attrs, epsilon FROM ledger_charges WHERE ledger=? ORDER BY id", (lname,)):
                        n_all += 1
                        new = i > start.get("ledger_charges", 0)
                        n_mine += new
                        for a in json.loads(attrs):
                            tot[a] = tot.get(a, 0.0) + eps
                            if new:
                                run[a] = run.get(a, 0.0) + eps
                    rows.append({"store": f, "type": "ledger (pure eps, largest attribute)", "name": lname,
                                 "kind": "pure", "bookings_this_run": n_mine, "bookings_total": n_all,
                                 "delta": None, "epsilon_this_run": max(run.values(), default=0.0),
                                 "epsilon_total": max(tot.values(), default=0.0)})
        except (sqlite3.Error, ValueError):
            pass
        finally:
            conn.close()
        if len(rows) >= limit:
            break
    return rows[:limit]


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


def provenance(*, scenario_sha256: str, seed: int, metrics: dict | None = None, resumed: bool = False,
               argv: Sequence[str] | None = None, ray_address: str | None = None) -> dict:
    """What produced a run: fedmem version and git commit, library versions, scenario hash,
    seed, the command line (``argv``), the Ray address attached to (None: a private local
    instance), machine, and the experiment's per-phase wall times (``metrics["phase_seconds"]``).

    ``scenario_sha256`` is the SHA-256 of ``scenario.resolved.toml`` exactly as written
    (``sha256sum scenario.resolved.toml`` prints it).
    """
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


RESOLVED_HEADER = ("# fedmem resolved scenario: every default and override filled in; the source file and the "
                   "overrides are in results.json.\n# scenario_sha256 in results.json is the SHA-256 of this file "
                   "as written (sha256sum).\n")


def resolved_text(scenario) -> tuple[str, str, dict]:
    """(text of scenario.resolved.toml, its SHA-256, the resolved config). The resolved scenario
    keeps the run's name (a file with ``name = ""`` gets its file stem), so re-running the
    resolved file reproduces the run folder's name and hash; the text does not depend on the
    source path, so the same scenario has the same hash wherever it was loaded from."""
    from fedmem.scenario import dump_toml

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


def _ledger_md(rows: list[dict], resumed: bool) -> str:
    def e(x):
        return "-" if x is None else f"{x:.4g}"

    lines = ["| store | accountant / ledger | bookings this run | bookings total | eps this run | eps total "
             "| at delta |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        at = "-" if r["delta"] is None else f"{r['delta']:g}"
        lines.append(f"| {r['store']} | {r['name']} ({r['kind']}) | {r['bookings_this_run']} | "
                     f"{r['bookings_total']} | {e(r['epsilon_this_run'])} | {e(r['epsilon_total'])} | {at} |")
    lines += ["", "This run: bookings made (and epsilon composed) by this run only. Total: every booking in the "
              "store, across " + ("the earlier runs resumed here and this one" if resumed else
                                  "every run in this folder (only this one)") +
              ". Epsilon of accountants is composed at their budget's delta, else at the scenario's delta "
              "(- when neither is known or there are too many events); pure ledgers show the largest "
              "per-attribute spend."]
    return "\n".join(lines)


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
            _merge_metrics(metrics, _revive(ctx._saved_phases.get(name, {}).get("metrics", {})))
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
    md = [f"# {scenario.name}", "", f"*{cfg.get('description') or scenario.experiment.description}*", "",
          f"- kind: `{scenario.experiment.kind}`", f"- scenario: `{scenario.path}`",
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
        md += ["## Privacy ledger: this run vs ledger total across resumes", "", _ledger_md(ledgers, ctx.resumed), ""]
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


# ---------------------------------------------------------------- results.json schema
RESULTS_SCHEMA = Path(__file__).resolve().parent / "schemas" / "results.schema.json"


def results_schema() -> dict:
    """The JSON Schema (draft 2020-12) of results.json, shipped in the package."""
    return json.loads(RESULTS_SCHEMA.read_text())


# ---------------------------------------------------------------- comparing run folders
HEADLINE_KEYS = ("status", "kind", "name", "seed", "overrides", "scenario_sha256", "wall_s", "verdict",
                 "ledger bookings (this run)")


def _scalars(d: dict, prefix: str = "", depth: int = 3) -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if depth > 1:
                out.update(_scalars(v, key + ".", depth - 1))
        elif isinstance(v, bool) or v is None:
            out[key] = v
        elif isinstance(v, (int, float)):
            out[key] = v
        elif isinstance(v, str) and len(v) <= 60:
            out[key] = v
    return out


def load_results(run_dir: Path) -> dict:
    """The ``results.json`` of a run folder (ValueError naming the folder when missing or unreadable)."""
    path = Path(run_dir) / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"run_dir must be a fedmem run folder holding results.json. Found {str(run_dir)!r} "
                         "(no results.json)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"results.json of {str(run_dir)!r} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"results.json of {str(run_dir)!r} must hold a JSON object. Found {type(data).__name__}.")
    return data


def compare_runs(run_dirs: Sequence[Path], *, all_metrics: bool = False, limit: int = 40) -> dict:
    """Headline metrics and verdicts of several run folders side by side.

    Returns ``{"runs": [labels], "rows": [[key, value per run...]], "numeric": {key: [values]},
    "omitted": n}``. Rows: the run's identity (status, kind, name, seed, overrides, scenario
    hash, wall time), every verdict, the bookings this run made, then the metrics (flattened
    to ``a.b.c``): those that differ between runs first, at most ``limit`` unless ``all_metrics``.
    """
    datas = [load_results(d) for d in run_dirs]
    labels = []
    for d, data in zip(run_dirs, datas):
        label = Path(d).name or str(d)
        n = 2
        while label in labels:
            label = f"{Path(d).name} ({n})"
            n += 1
        labels.append(label)
    head, metr = [], []
    for data in datas:
        m = data.get("metrics") or {}
        flat = _scalars(m)
        ledgers = data.get("ledgers") or []
        head.append({
            "status": data.get("status", "complete (older run folder)"), "kind": data.get("kind"),
            "name": data.get("name"), "seed": data.get("seed"), "overrides": " ".join(data.get("overrides") or []) or "-",
            "scenario_sha256": str((data.get("provenance") or {}).get("scenario_sha256") or "-")[:12],
            "wall_s": data.get("wall_s"),
            "verdict": m.get("verdict", "-"),
            "ledger bookings (this run)": sum(int(r.get("bookings_this_run") or 0) for r in ledgers) if ledgers else "-",
        })
        metr.append(flat)
    rows = [[k, *[h.get(k) for h in head]] for k in HEADLINE_KEYS]
    keys = []
    for flat in metr:
        keys += [k for k in flat if k not in keys]
    keys = [k for k in keys if f"attacks.{k}" not in keys]   # metrics[name] mirrors metrics["attacks"][name]
    verdicts = [k for k in keys if k.endswith("verdict") and k != "verdict"]
    rest = [k for k in keys if k not in verdicts and k != "verdict"]

    def differs(k):
        vals = [json.dumps(f.get(k), sort_keys=True, default=str) for f in metr]
        return len(set(vals)) > 1

    rest.sort(key=lambda k: (not differs(k), keys.index(k)))
    shown = rest if all_metrics else rest[:limit]
    for k in verdicts + shown:
        rows.append([k, *[f.get(k, "-") for f in metr]])
    numeric = {}
    for k in ["wall_s"] + shown:
        vals = [h.get(k) if k == "wall_s" else f.get(k) for h, f in zip(head, metr)]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals if v is not None) and \
                sum(v is not None for v in vals) >= 1 and any(v is not None for v in vals):
            numeric[k] = vals
    # the figure: headline metrics (epsilon, AUC, rates, errors) shared by most runs and differing
    # between them first; bookkeeping (phase times, budgets) last, wall time at the end
    words = ("eps", "auc", "tpr", "rate", "mse", "rmse", "spent", "released", "refused", "error", "subem", "f1")

    def rank(k):
        present = sum(v is not None for v in numeric[k])
        book = k.startswith(("phase_seconds.", "budgets.")) or k == "wall_s"
        return (book, -present, not any(w in k.lower() for w in words), not differs(k), keys.index(k)
                if k in keys else len(keys))

    numeric = {k: numeric[k] for k in sorted(numeric, key=rank)}
    return {"runs": labels, "rows": rows, "numeric": numeric, "omitted": len(rest) - len(shown)}
