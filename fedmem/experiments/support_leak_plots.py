"""Plots of the ``federation.support_leak`` report (matplotlib, Agg backend)."""

from __future__ import annotations

import math

import numpy as np

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_reconstruction(ctx, records, tol):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    tru = np.array([r.true_n for r in records], dtype=float)
    est = np.array([r.estimate for r in records], dtype=float)
    ok = np.isfinite(est)
    jitter = np.random.default_rng(0).uniform(-0.25, 0.25, size=tru.size)   # display only: overlapping points
    ax.scatter(tru[ok] + jitter[ok], est[ok] + jitter[::-1][ok], s=8, alpha=0.35,
               label=f"released ({int(ok.sum())}, jittered)")
    if (~ok).any():
        ax.scatter(tru[~ok], np.zeros((~ok).sum()), s=10, marker="x", color="grey", label="rejected / no channel")
    hi = max(1.0, float(np.nanmax(np.r_[tru, est[ok]])) if ok.any() else float(tru.max()))
    xs = np.linspace(0, hi, 2)
    ax.plot(xs, xs, "k-", lw=1)
    ax.fill_between(xs, xs - tol, xs + tol, color="green", alpha=0.15, label=f"+-{tol}")
    ax.set_xlabel("true contributing shards")
    ax.set_ylabel("reconstructed")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Cardinality reconstruction")
    ctx.save_figure(fig, "reconstruction")


def _plot_roc(ctx, roc, eps, delta):
    from fedmem.attacks import audit

    if not roc:
        return
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    for name, (pos, neg) in roc.items():
        fpr, tpr = audit.roc_curve(pos, neg)
        ax.plot(fpr, tpr, label=f"{name} (AUC {audit.roc_auc(pos, neg):.2f})")
    grid = np.linspace(0, 1, 201)
    if math.isfinite(eps):
        ax.plot(grid, audit.dp_roc_ceiling(grid, eps, delta), "r--", label=f"DP ceiling eps={eps:.2f}")
    ax.plot(grid, grid, "k:", lw=1, label="chance")
    ax.set_xlabel("FPR")
    ax.set_ylabel("TPR")
    ax.set_title("Membership ROC")
    ax.legend(fontsize=8)
    ctx.save_figure(fig, "membership_roc")


def _plot_eps(ctx, eps_rows):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = [r[0] for r in eps_rows]
    x = np.arange(len(names))
    booked = [r[1] if math.isfinite(r[1]) else 0.0 for r in eps_rows]
    ax.bar(x - 0.2, booked, 0.4, label="booked / query")
    ax.bar(x + 0.2, [r[2] for r in eps_rows], 0.4, label="empirical lower bound")
    ax.set_xticks(x, names)
    ax.set_ylabel("epsilon")
    ax.legend(fontsize=8)
    ax.set_title("Booked vs empirical epsilon")
    ctx.save_figure(fig, "epsilon")
