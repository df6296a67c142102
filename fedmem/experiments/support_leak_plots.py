"""Plots of the ``federation.support_leak`` report, drawn with :mod:`fedmem.figures`
(one palette, PDF + 300 dpi PNG, log-log ROC with TPR at low FPR and the booked DP ceiling)."""

from __future__ import annotations


import numpy as np

from fedmem import figures as F


def _plt():
    return F.pyplot()


def _plot_reconstruction(ctx, records, tol):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    tru = np.array([r.true_n for r in records], dtype=float)
    est = np.array([r.estimate for r in records], dtype=float)
    ok = np.isfinite(est)
    jitter = np.random.default_rng(0).uniform(-0.25, 0.25, size=tru.size)   # display only: overlapping points
    ax.scatter(tru[ok] + jitter[ok], est[ok] + jitter[::-1][ok], s=8, alpha=0.35, color=F.colour(0),
               label=f"released ({int(ok.sum())}, jittered)")
    if (~ok).any():
        ax.scatter(tru[~ok], np.zeros((~ok).sum()), s=12, marker="x", color=F.colour(3),
                   label="rejected / no channel")
    hi = max(1.0, float(np.nanmax(np.r_[tru, est[ok]])) if ok.any() else float(tru.max()))
    xs = np.linspace(0, hi, 2)
    ax.plot(xs, xs, color="black", lw=1, label="exact")
    ax.fill_between(xs, xs - tol, xs + tol, color=F.colour(2), alpha=0.15, label=f"within +-{tol}")
    ax.set_xlabel("true contributing shards")
    ax.set_ylabel("reconstructed contributing shards")
    F.integer_ticks(ax, "x")
    ax.legend(loc="upper left")
    ax.set_title("Cardinality reconstruction")
    F.save(ctx, fig, "reconstruction", "reconstructed vs true number of contributing shards per adaptive query")


def _plot_roc(ctx, roc, eps, delta):
    """One panel per distinct booking (each curve against the ceiling of what its trials booked)."""
    if not roc:
        return
    curves = {k: (v[0], v[1]) for k, v in roc.items()}
    bookings = {k: tuple(v[2]) for k, v in roc.items() if len(v) > 2}
    F.roc_figure(ctx, curves, "membership_roc", epsilon=eps, delta=delta, title="Membership ROC (per attack)",
                 bookings=bookings or None,
                 caption="membership ROC per attack on log-log axes, one panel per booking with its DP ceiling; "
                         "TPR@0.1%/1% marked where the negatives can estimate it")


VERDICT_COLOURS = {"LEAK": F.colour(3), "within booked": F.colour(2), "no leak seen": "#777777"}


def _plot_eps(ctx, eps_rows):
    """Booked vs empirical epsilon per attack: the bound each attack proved (Clopper-Pearson, or
    unbounded for an exact channel), what it booked (per trial of a membership game; over the
    whole adaptive stream for the reconstruction), each row's power (the largest bound its trials
    can prove) and its verdict. Every bar carries its value, zero included; a bar beyond the axis
    is cut at the edge and says so."""
    import math

    plt = _plt()
    rows = [list(r) + [None] * (8 - len(r)) for r in eps_rows]     # rows saved by older runs had 5 fields
    names = [str(r[0]).replace("_", " ") for r in rows]
    booked = np.array([float(r[1]) for r in rows])
    lower = np.array([float(r[2]) for r in rows])
    power = [None if r[5] is None else float(r[5]) for r in rows]
    labels = [r[6] or str(r[4]).split(" (")[0] for r in rows]
    unit = [r[7] or "trial" for r in rows]
    finite = [v for v in np.r_[booked[[u == "trial" for u in unit]], lower, [p for p in power if p is not None]]
              if math.isfinite(v)]
    xmax = 1.3 * max(finite + [1.0])
    y = np.arange(len(rows))
    h = 0.38
    fig, ax = plt.subplots(figsize=(7.2, 0.62 * len(rows) + 1.9))
    for i in range(len(rows)):
        hatch = "//" if unit[i] == "stream" else None
        ax.barh(y[i] - h / 2, min(booked[i], xmax), h, color=F.colour(0), hatch=hatch, edgecolor="white", lw=0)
        shown_lower = xmax if not math.isfinite(lower[i]) else min(lower[i], xmax)
        ax.barh(y[i] + h / 2, shown_lower, h, color=F.colour(1), hatch="xx" if not math.isfinite(lower[i]) else None,
                edgecolor="white", lw=0)
        for yy, v, shown in ((y[i] - h / 2, booked[i], min(booked[i], xmax)), (y[i] + h / 2, lower[i], shown_lower)):
            if not math.isfinite(v):
                text = "unbounded (exact channel)"
            else:
                text = f"{v:.3g}" + (" (beyond the axis)" if v > xmax else "")
            inside = shown > 0.55 * xmax
            ax.text(shown - 0.01 * xmax if inside else shown + 0.01 * xmax, yy, text, va="center",
                    ha="right" if inside else "left", fontsize=7, color="black",
                    bbox={"facecolor": "white", "alpha": 0.85, "lw": 0, "pad": 0.8})
        if power[i] is not None and math.isfinite(power[i]):
            ax.plot([min(power[i], xmax)], [y[i] + h / 2], marker="|", ms=14, mew=2, color="black", ls="none")
        colour = next((c for k, c in VERDICT_COLOURS.items() if str(labels[i]).startswith(k)), "black")
        ax.text(1.01, y[i], str(labels[i]), transform=ax.get_yaxis_transform(), va="center", ha="left", fontsize=8,
                color=colour, fontweight="bold" if str(labels[i]).startswith("LEAK") else "normal")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, xmax)
    ax.set_xlabel("epsilon")
    ax.set_title("Booked vs empirical epsilon (verdict at the right)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=F.colour(0), label="booked for what one trial saw (its 1-4 queries)")]
    if "stream" in unit:
        handles.append(Patch(facecolor=F.colour(0), hatch="//", edgecolor="white",
                             label="booked over the whole adaptive stream (reconstruction)"))
    handles.append(Patch(color=F.colour(1), label="empirical lower bound (Clopper-Pearson, 95%)"))
    if any(not math.isfinite(v) for v in lower):
        handles.append(Patch(facecolor=F.colour(1), hatch="xx", edgecolor="white",
                             label="exact channel: no finite epsilon bounds it"))
    if any(p is not None for p in power):
        handles.append(Line2D([], [], marker="|", ms=10, mew=2, color="black", ls="none",
                              label="power: the largest bound these trials can prove"))
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncol=2)
    F.save(ctx, fig, "epsilon", "per attack: booked epsilon (per trial; reconstruction over the stream) vs the "
                                "empirical lower bound, with each row's power and verdict")
