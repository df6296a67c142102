""":class:`RunContext`: the services an experiment gets (seeded RNG streams, progress, figure
saving, phases to resume, log), and :func:`figure_has_data`."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from fedmem.report.ledgers import ledger_marks
from fedmem.report.state import merge_metrics, plain_state, read_manifest, revive_state, stable_json, write_manifest


class RunContext:
    """Services an experiment gets: seeded RNG streams, progress, figures, log.

    ``resumed`` is true when the run continues in a folder that already held a run
    (``fedmem run --resume``): durable ledgers/accountants there keep what they spent.
    """

    def __init__(self, out_dir: Path, seed: int, *, show_progress: bool = True,
                 ray_address: str | None = None, quiet: bool = False, resumed: bool = False,
                 phases: dict | None = None, figures: bool = True):
        self.out_dir = Path(out_dir)
        self.draw_figures = bool(figures)
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
        self._before = snapshot_files(self.out_dir)  # files already there (a resumed folder)
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
            merge_metrics(metrics, revive_state(saved.get("metrics", {})))
            for lst, items in zip(lists, saved.get("lists", [])):
                lst.extend(revive_state(items))
            for fig in saved.get("figures", []):
                if (self.out_dir / fig).is_file() and self.out_dir / fig not in self.figures:
                    self.figures.append(self.out_dir / fig)
            self.file_notes.update(saved.get("file_notes", {}))
            self.phases_completed.append(name)
            self.phases_restored.append(name)
            self.log(f"phase {name}: restored from the interrupted run in this folder (not run again)")
            return True
        self._phase_marks[name] = ({k: stable_json(v) for k, v in metrics.items()}, [len(x) for x in lists],
                                   len(self.figures), dict(self.file_notes))
        return False

    def phase_done(self, name: str, metrics: dict, *lists: list) -> None:
        """Record that phase ``name`` completed: what it added is saved in ``run.json``, so a
        run interrupted later resumes after it (``fedmem run --resume``)."""
        if name not in self._phase_marks:
            raise ValueError(f"phase_done({name!r}) without resume_phase({name!r}) first")
        before, lengths, nfig, notes = self._phase_marks.pop(name)
        changed = {k: v for k, v in metrics.items() if k not in before or stable_json(v) != before[k]}
        state = {"metrics": plain_state(changed),
                 "lists": [plain_state(lst[n:]) for lst, n in zip(lists, lengths)],
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

        A figure none of whose axes shows data (see :func:`figure_has_data`), or any figure of a run
        whose scenario says ``figures = false``, is not saved: it is closed and recorded as skipped
        (with the reason), and ``None`` is returned.
        """
        import matplotlib.pyplot as plt

        if not self.draw_figures:
            plt.close(fig)
            self.note_figure_skipped(name, "figures = false in the scenario")
            return None
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


def snapshot_files(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(folder).as_posix()] = (st.st_mtime_ns, st.st_size)
    return out
