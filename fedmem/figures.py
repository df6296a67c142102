"""Figures for papers: one style, one colour-blind-safe palette, ROC curves the field reads.

Every experiment draws through these helpers (wiring layer, like :mod:`fedmem.report`):

- :func:`pyplot` returns matplotlib's pyplot on the Agg backend with :data:`STYLE` applied
  (readable font sizes, the Okabe-Ito palette as the colour cycle, no top/right spines).
- :func:`save` saves through :meth:`fedmem.report.RunContext.save_figure`: a 300 dpi PNG and
  a vector PDF of every figure.
- :func:`roc_figure` draws membership ROC curves on **log-log** axes (the regime that matters
  is TPR at low FPR), marks TPR at FPR 0.1% and 1% on every curve, draws the DP trade-off
  ceiling of the booked ``(eps, delta)`` (Kairouz et al. 2015) and writes the raw ROC points
  and the per-trial scores as CSV next to the plot.
- :func:`grouped_barh` draws grouped horizontal bars: long category names stay readable
  (no overlapping tick labels).

Okabe, M. and Ito, K. (2008), "Color Universal Design": the palette below stays distinct
under the common colour-vision deficiencies.
"""

from __future__ import annotations

import csv
import math
from typing import Mapping, Sequence

import numpy as np

# Okabe-Ito: blue, orange, bluish green, vermillion, reddish purple, sky blue, yellow, black.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
SERIES = PALETTE[:7]  # data series; black is reserved for reference lines (DP ceiling)
CEILING_COLOUR = "#000000"
CHANCE_COLOUR = "#999999"
LOW_FPRS = (0.001, 0.01)  # TPR@0.1% and TPR@1% are marked on every ROC curve

STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "legend.fontsize": 8, "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "lines.linewidth": 1.6,
    "figure.constrained_layout.use": True, "savefig.dpi": 300, "pdf.fonttype": 42, "ps.fonttype": 42,
}


def colour(i: int) -> str:
    """The ``i``-th colour of :data:`PALETTE` (cycling)."""
    return PALETTE[int(i) % len(PALETTE)]


def pyplot():
    """matplotlib.pyplot on the Agg backend with :data:`STYLE` and the palette applied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    matplotlib.rcParams.update(STYLE)
    matplotlib.rcParams["axes.prop_cycle"] = cycler(color=list(PALETTE))
    return plt


def save(ctx, fig, name: str, caption: str = ""):
    """Save ``fig`` in the run folder as ``name``.png (300 dpi) and ``name``.pdf (see RunContext.save_figure)."""
    return ctx.save_figure(fig, name, caption)


def tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Largest TPR of an ROC point whose FPR is <= ``target`` (attainable points only)."""
    fpr = np.asarray(fpr, dtype=float)
    tpr = np.asarray(tpr, dtype=float)
    ok = fpr <= target + 1e-12
    return float(np.max(tpr[ok])) if ok.any() else 0.0


def roc_points(pos, neg) -> tuple[np.ndarray, np.ndarray]:
    from fedmem.attacks import audit  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    return audit.roc_curve(pos, neg)


def roc_figure(ctx, curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], name: str, *,
               epsilon: float | None = None, delta: float = 0.0, title: str = "Membership ROC",
               caption: str = ""):
    """Log-log ROC curves of ``curves`` (label -> (member scores, non-member scores)).

    Marks TPR at FPR 0.1% and 1% on each curve (the legend states them), draws the
    ``(epsilon, delta)``-DP ceiling when ``epsilon`` is finite, and writes
    ``<name>_points.csv`` (series, fpr, tpr) and ``<name>_scores.csv`` (series, member, score).
    Returns the saved PNG's path (None when no curve has data).
    """
    from fedmem.attacks import audit  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    points_rows, score_rows = [], []
    floor = 1.0
    for i, (label, (pos, neg)) in enumerate(curves.items()):
        pos = np.asarray(pos, dtype=float)
        neg = np.asarray(neg, dtype=float)
        if pos.size == 0 or neg.size == 0:
            continue
        fpr, tpr = roc_points(pos, neg)
        points_rows += [(label, float(f), float(t)) for f, t in zip(fpr, tpr)]
        score_rows += [(label, 1, float(v)) for v in pos] + [(label, 0, float(v)) for v in neg]
        lo = 0.5 / neg.size                       # an FPR of 0 is drawn at half the smallest non-zero FPR
        floor = min(floor, lo)
        c = SERIES[i % len(SERIES)]                 # black is kept for the DP ceiling
        ls = ("-", "-.", ":")[(i // len(SERIES)) % 3]
        marks = [tpr_at(fpr, tpr, x) for x in LOW_FPRS]
        ax.step(np.maximum(fpr, lo), np.maximum(tpr, lo), where="post", color=c, ls=ls,
                label=f"{label}: AUC {audit.roc_auc(pos, neg):.2f}, TPR@0.1% {marks[0]:.3f}, TPR@1% {marks[1]:.3f}")
        ax.plot([max(x, lo) for x in LOW_FPRS], [max(m, lo) for m in marks], ls="none", marker="o", ms=4,
                color=c, markeredgecolor="white", markeredgewidth=0.5)
    if not points_rows:
        plt.close(fig)
        ctx.note_figure_skipped(name, "no attack produced member and non-member scores")
        return None
    grid = np.logspace(math.log10(floor), 0, 400)
    if epsilon is not None and math.isfinite(epsilon):
        ax.plot(grid, audit.dp_roc_ceiling(grid, epsilon, delta), ls="--", color=CEILING_COLOUR, lw=1.2,
                label=f"DP ceiling of booked (eps={epsilon:.3g}, delta={delta:.1g})")
    ax.plot(grid, grid, ls=":", color=CHANCE_COLOUR, lw=1, label="chance")
    for x in LOW_FPRS:
        ax.axvline(x, color=CHANCE_COLOUR, lw=0.6, ls="-", alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1.05)
    ax.set_xlabel("false positive rate (log)")
    ax.set_ylabel("true positive rate (log)")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7)   # below the axes: never on a curve
    _write_csv(ctx, f"{name}_points.csv", ["series", "fpr", "tpr"], points_rows,
               f"raw ROC points of {name}.png (every threshold; series, fpr, tpr)")
    _write_csv(ctx, f"{name}_scores.csv", ["series", "member", "score"], score_rows,
               f"per-trial attack scores behind {name}.png (member 1 = the record was in the data)")
    return save(ctx, fig, name, caption or f"{title}: log-log ROC with TPR@0.1%/1% marked and the booked DP ceiling")


def _write_csv(ctx, fname: str, header: Sequence[str], rows, what: str) -> None:
    with open(ctx.out_dir / fname, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    ctx.describe_file(fname, what)


def grouped_barh(ax, categories: Sequence[str], series: Mapping[str, Sequence[float]], *, xlabel: str = "",
                 wrap: int = 28) -> None:
    """Grouped horizontal bars (one group per category, one bar per series, palette colours).

    Category names are wrapped at ``wrap`` characters and drawn on the y axis, so long names
    never overlap. Non-finite values are drawn as 0 and labelled "n/a" / "inf".
    """
    import textwrap

    n = len(series)
    y = np.arange(len(categories))
    h = 0.8 / max(n, 1)
    for i, (label, values) in enumerate(series.items()):
        vals = np.asarray([float(v) if v is not None else math.nan for v in values], dtype=float)
        shown = np.where(np.isfinite(vals), vals, 0.0)
        pos = y - 0.4 + h * (i + 0.5)
        ax.barh(pos, shown, h, color=colour(i), label=label)
        for p, v in zip(pos, vals):
            if not math.isfinite(v):
                ax.text(0, p, " inf" if v == math.inf else " n/a", va="center", fontsize=7)
    ax.set_yticks(y, [textwrap.fill(str(c).replace("_", " "), wrap) for c in categories])
    ax.invert_yaxis()
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.legend(loc="best")


def integer_ticks(ax, axis: str = "x") -> None:
    """Only integer tick labels on ``axis`` (steps, counts)."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def compare_figure(ctx_or_dir, runs: Sequence[str], metrics: Mapping[str, Sequence[float | None]],
                   name: str = "compare"):
    """One figure comparing runs: a panel per metric, one bar per run (``fedmem compare``).

    ``ctx_or_dir`` is a RunContext or a folder; returns the PNG path (a PDF is written too).
    """
    from pathlib import Path

    plt = pyplot()
    keys = list(metrics)[:6]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 0.35 * len(runs) * rows + 1.6 * rows), squeeze=False)
    for ax, key in zip(axes.ravel(), keys):
        vals = np.asarray([math.nan if v is None else float(v) for v in metrics[key]], dtype=float)
        y = np.arange(len(runs))
        ax.barh(y, np.where(np.isfinite(vals), vals, 0.0), color=[colour(i) for i in range(len(runs))])
        for yi, v in zip(y, vals):
            ax.text(0 if not math.isfinite(v) else v, yi, f" {v:.3g}" if math.isfinite(v) else " n/a",
                    va="center", fontsize=7)
        ax.set_yticks(y, runs)
        ax.invert_yaxis()
        ax.set_title(key, fontsize=9)
    for ax in axes.ravel()[len(keys):]:
        ax.set_visible(False)
    if hasattr(ctx_or_dir, "save_figure"):
        return save(ctx_or_dir, fig, name, "headline metrics of the compared runs")
    out = Path(ctx_or_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=300, bbox_inches="tight")
    fig.savefig(out / f"{name}.pdf", bbox_inches="tight")
    plt.close(fig)
    return out / f"{name}.png"
