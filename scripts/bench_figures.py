"""What the ``figures`` scenario key saves: one membership ROC figure as a run draws it
(``fedmem.figures.roc_figure``: 8 attack curves of 60 + 60 scores, log-log, DP ceiling, CSVs)
with ``figures = true`` (300-dpi PNG + vector PDF) against ``figures = false`` (the same call:
CSVs written, the drawing skipped), interleaved in one process, medians over repeats, and
the ratio. Nothing is asserted.

    .venv/bin/python scripts/bench_figures.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fedmem.figures import roc_figure  # noqa: E402
from fedmem.report.context import RunContext  # noqa: E402


def one(figures: bool, curves, out: Path) -> float:
    ctx = RunContext(out, 0, show_progress=False, quiet=True, figures=figures)
    t0 = time.perf_counter()
    roc_figure(ctx, curves, "roc", epsilon=1.0, delta=1e-6)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    curves = {f"attack {i}": (rng.normal(0.3 * i, 1, 60), rng.normal(0, 1, 60)) for i in range(8)}
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        one(True, curves, Path(tmp) / "warm")           # imports, font cache
        for r in range(a.repeats):
            for figures in (True, False):
                times[figures].append(one(figures, curves, Path(tmp) / f"{figures}-{r}"))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; medians of {a.repeats}")
    print(f"figures = true  (PNG 300 dpi + PDF): {on:.3f} s per ROC figure  {[round(t, 3) for t in times[True]]}")
    print(f"figures = false (CSVs only):         {off:.3f} s                {[round(t, 3) for t in times[False]]}")
    print(f"drawing costs {on - off:.3f} s per figure; figures = false is {on / off:.1f}x faster for this call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
