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
    if not roc:
        return
    F.roc_figure(ctx, roc, "membership_roc", epsilon=eps, delta=delta, title="Membership ROC (per attack)",
                 caption="membership ROC per attack on log-log axes, TPR@0.1%/1% marked, DP ceiling of the "
                         "booked epsilon per query")


def _plot_eps(ctx, eps_rows):
    plt = _plt()
    names = [r[0] for r in eps_rows]
    fig, ax = plt.subplots(figsize=(6, 0.55 * len(names) + 1.4))
    booked = [r[1] for r in eps_rows]
    F.grouped_barh(ax, names, {"booked per query": booked, "empirical lower bound (CP)": [r[2] for r in eps_rows]},
                   xlabel="epsilon")
    ax.set_title("Booked vs empirical epsilon")
    F.save(ctx, fig, "epsilon", "booked epsilon per query vs the empirical lower bound of each attack")
