"""Run folders: ``results.json``, ``report.md``, PNG plots and the resolved scenario.

An experiment's run function receives a :class:`RunContext` (seeded RNG streams,
progress bars, figure saving, logging) and returns a :class:`Result` (metrics, tables,
free-form report sections). :func:`write_run` turns the result into the run folder.
"""

from __future__ import annotations

import hashlib
import json
import math
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
    """Services an experiment gets: seeded RNG streams, progress, figures, log."""

    def __init__(self, out_dir: Path, seed: int, *, show_progress: bool = True,
                 ray_address: str | None = None, quiet: bool = False):
        self.out_dir = Path(out_dir)
        self.seed = int(seed)
        self.ray_address = ray_address
        self.show_progress = show_progress
        self.quiet = quiet
        self.figures: list[Path] = []
        self.log_lines: list[str] = []
        self.out_dir.mkdir(parents=True, exist_ok=True)

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

    def save_figure(self, fig, name: str) -> Path:
        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
        self.figures.append(path)
        return path

    def log(self, message: str) -> None:
        self.log_lines.append(message)
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)


def write_run(scenario, ctx: RunContext, result: Result, wall_s: float) -> dict:
    from fedmem.scenario import dump_toml

    cfg = scenario.config.to_dict()
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
        "config": cfg,
    }
    payload = to_jsonable(payload)
    (ctx.out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    (ctx.out_dir / "scenario.resolved.toml").write_text(
        f"# resolved from {scenario.path} with overrides {scenario.overrides}\n" + dump_toml(cfg))
    md = [f"# {scenario.name}", "", f"*{cfg.get('description') or scenario.experiment.description}*", "",
          f"- kind: `{scenario.experiment.kind}`", f"- scenario: `{scenario.path}`",
          f"- seed: {ctx.seed}", f"- wall time: {wall_s:.1f} s", ""]
    for t in result.tables:
        md += [t.markdown(), ""]
    for heading, body in result.sections:
        md += [f"## {heading}", "", body, ""]
    for p in ctx.figures:
        md += [f"![{p.stem}]({p.name})", ""]
    if ctx.log_lines:
        md += ["## Log", "", "```", *ctx.log_lines, "```", ""]
    (ctx.out_dir / "report.md").write_text("\n".join(md))
    return payload
