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
# data series: the seven Okabe-Ito colours, then Tol's wine, teal and olive (distinct from them and
# from each other); black is reserved for reference lines (DP ceiling)
SERIES = PALETTE[:7] + ("#882255", "#44AA99", "#999933")
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


LINE_STYLES = ("-", "--", "-.", ":")


def series_style(i: int) -> tuple[str, str]:
    """(colour, line style) of the ``i``-th data series: both change from one series to the next
    (10 colours, 4 styles), so no two of the first 20 series look alike (black stays for reference lines)."""
    return SERIES[int(i) % len(SERIES)], LINE_STYLES[int(i) % len(LINE_STYLES)]


def estimable(n_neg: int, fpr: float) -> bool:
    """Whether ``n_neg`` negatives can estimate a TPR at false-positive rate ``fpr``: the smallest
    non-zero FPR they resolve, 1/n_neg, must not exceed it."""
    return n_neg > 0 and 1.0 / n_neg <= fpr + 1e-12


def _dense_roc(fpr: np.ndarray, tpr: np.ndarray, k: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """The ROC polyline with each sloped segment (a group of tied scores moves both rates at once)
    sampled linearly, so that on log axes it is drawn as the straight line it is in ROC space
    (all scores tied: the diagonal), not as a step."""
    xs, ys = [fpr[:1]], [tpr[:1]]
    for f0, t0, f1, t1 in zip(fpr[:-1], tpr[:-1], fpr[1:], tpr[1:]):
        t = np.linspace(0.0, 1.0, k if f1 > f0 and t1 > t0 else 2)[1:]
        xs.append(f0 + t * (f1 - f0))
        ys.append(t0 + t * (t1 - t0))
    return np.concatenate(xs), np.concatenate(ys)


def _fmt_eps(eps: float) -> str:
    return "inf" if not math.isfinite(eps) else f"{eps:.3g}"


def roc_figure(ctx, curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], name: str, *,
               epsilon: float | None = None, delta: float = 0.0, title: str = "Membership ROC",
               caption: str = "", bookings: Mapping[str, tuple[float, float]] | None = None):
    """Log-log ROC curves of ``curves`` (label -> (member scores, non-member scores)).

    ``bookings`` (label -> (epsilon, delta) that curve's trials booked) draws one panel per distinct
    booking, each with its own DP ceiling; without it every curve is drawn against the one
    ``(epsilon, delta)`` ceiling (when ``epsilon`` is finite). TPR at FPR 0.1% and 1% is marked
    (and stated in the legend) only where the curve's negatives can estimate it (1/n_neg <= FPR;
    else the legend says n/a and why, and the FPR line is greyed). Tied scores are drawn as the
    straight ROC segment they are (all tied: the diagonal). Every series has its own colour and
    line style; the legend sits below the panels. Writes ``<name>_points.csv`` (series, fpr,
    tpr) and ``<name>_scores.csv`` (series, member, score). Returns the saved PNG's path (None
    when no curve has data).
    """
    from fedmem.attacks import audit  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    plt = pyplot()
    usable = {k: (np.asarray(p, dtype=float), np.asarray(n, dtype=float)) for k, (p, n) in curves.items()}
    usable = {k: v for k, v in usable.items() if v[0].size and v[1].size}
    if not usable:
        ctx.note_figure_skipped(name, "no attack produced member and non-member scores")
        return None
    if bookings:
        book = {k: tuple(bookings.get(k, (epsilon, delta))) for k in usable}
    else:
        book = {k: (epsilon, delta) for k in usable}
    keys = []
    for k in usable:
        b = (round(float(book[k][0]), 6) if book[k][0] is not None else None, float(book[k][1] or 0.0))
        if b not in keys:
            keys.append(b)
    panel_of = {k: keys.index((round(float(book[k][0]), 6) if book[k][0] is not None else None,
                               float(book[k][1] or 0.0))) for k in usable}
    npan = len(keys)
    fig, axes = plt.subplots(1, npan, figsize=(4.4 * npan + 0.8, 5.0), squeeze=False, sharey=True)
    axes = axes[0]
    points_rows, score_rows = [], []
    floors = [1.0] * npan
    unresolved = [set() for _ in range(npan)]
    for i, (label, (pos, neg)) in enumerate(usable.items()):
        ax = axes[panel_of[label]]
        fpr, tpr = roc_points(pos, neg)
        points_rows += [(label, float(f), float(t)) for f, t in zip(fpr, tpr)]
        score_rows += [(label, 1, float(v)) for v in pos] + [(label, 0, float(v)) for v in neg]
        lo = 0.5 / neg.size                       # an FPR of 0 is drawn at half the smallest non-zero FPR
        floors[panel_of[label]] = min(floors[panel_of[label]], lo)
        c, ls = series_style(i)
        xs, ys = _dense_roc(fpr, tpr)
        marks, parts = [], []
        for x in LOW_FPRS:
            if estimable(neg.size, x):
                m = tpr_at(fpr, tpr, x)
                marks.append((x, m))
                parts.append(f"TPR@{x:.1%}".replace(".0%", "%") + f" {m:.3f}")
            else:
                unresolved[panel_of[label]].add(x)
                parts.append(f"TPR@{x:.1%}".replace(".0%", "%") + f" n/a ({neg.size} negatives resolve FPR >= "
                             f"{1 / neg.size:.2%})")
        ax.plot(np.maximum(xs, lo), np.maximum(ys, lo), color=c, ls=ls,
                label=f"{label}: AUC {audit.roc_auc(pos, neg):.2f}, " + ", ".join(parts))
        if marks:
            ax.plot([max(x, lo) for x, _ in marks], [max(m, lo) for _, m in marks], ls="none", marker="o", ms=4,
                    color=c, markeredgecolor="white", markeredgewidth=0.5)
    for j, (ax, (eps, dl)) in enumerate(zip(axes, keys)):
        floor = floors[j]
        grid = np.logspace(math.log10(floor), 0, 400)
        if eps is not None and math.isfinite(eps) and eps > 0:
            ax.plot(grid, audit.dp_roc_ceiling(grid, eps, dl), ls=(0, (5, 2)), color=CEILING_COLOUR, lw=1.2,
                    label=f"DP ceiling of booked (eps={eps:.3g}, delta={dl:.1g})" if npan == 1 else
                    "DP ceiling of the panel's booking")
        ax.plot(grid, grid, ls=":", color=CHANCE_COLOUR, lw=1, label="chance" if j == 0 else "_chance")
        for x in LOW_FPRS:
            greyed = x in unresolved[j]
            ax.axvline(x, color=CHANCE_COLOUR, lw=0.6, ls=":" if greyed else "-", alpha=0.35 if greyed else 0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(floor, 1)
        ax.set_ylim(floor, 1.05)
        ax.set_xlabel("false positive rate (log)")
        if j == 0:
            ax.set_ylabel("true positive rate (log)")
        if npan > 1:
            ax.set_title(f"booked eps {_fmt_eps(eps) if eps is not None else '?'}"
                         + (f", delta {dl:.1g}" if dl else ""), fontsize=9)
    fig.suptitle(title)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    refs = [i for i, lab in enumerate(labels) if lab.startswith(("DP ceiling", "chance"))]   # reference lines last
    order = [i for i in range(len(labels)) if i not in refs] + refs
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    # below the panels, outside every axes (constrained layout reserves its room: PNG and PDF alike)
    fig.legend(handles, labels, loc="outside lower center", fontsize=7, ncol=1)
    _write_csv(ctx, f"{name}_points.csv", ["series", "fpr", "tpr"], points_rows,
               f"raw ROC points of {name}.png (every threshold; series, fpr, tpr)")
    _write_csv(ctx, f"{name}_scores.csv", ["series", "member", "score"], score_rows,
               f"per-trial attack scores behind {name}.png (member 1 = the record was in the data)")
    return save(ctx, fig, name, caption or f"{title}: log-log ROC with TPR@0.1%/1% marked where the negatives "
                                           "can estimate it and the booked DP ceiling")


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
