"""Plots of the audit: the log-log ROC of every audited mechanism with its booked DP ceiling.
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.attacks import tight as T
from fedmem.attacks.audit import dp_roc_ceiling, roc_curve

from .book import Book


def plot_rocs(ctx, book: Book, max_points: int = 4000):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in book.rocs]
    cols = 3
    rows = int(math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        pos, neg, eps, delta, family = book.rocs[name]
        fpr, tpr = roc_curve(pos, neg)
        keep = np.unique(np.linspace(0, fpr.size - 1, min(fpr.size, max_points)).astype(int))
        ok = (fpr[keep] > 0) & (tpr[keep] > 0)
        ax.loglog(fpr[keep][ok], tpr[keep][ok], "b-", lw=1.2, label="observed ROC")
        grid = np.geomspace(1e-7, 1.0, 300)
        if math.isfinite(eps):
            ax.loglog(grid, np.maximum(dp_roc_ceiling(grid, eps, delta), 1e-12), "r--", lw=1,
                      label=f"booked ({eps:.3g}, {delta:.0e}) ceiling")
            if family == "gaussian" and delta > 0 and eps > 0:
                mu = T.gdp_mu(eps, delta)
                ax.loglog(grid, np.maximum(1 - T.gdp_tradeoff(grid, mu), 1e-12), "g:", lw=1,
                          label=f"booked GDP mu={mu:.3g}")
        e = book.mechanisms[name]
        ax.set_title(f"{name}\nlower {e['eps_lower']:.3g} / booked {e['eps_booked']:.3g}", fontsize=8)
        ax.set_xlim(1e-6, 1)
        ax.set_ylim(1e-4, 1.05)
        ax.set_xlabel("FPR", fontsize=8)
        ax.set_ylabel("TPR", fontsize=8)
        ax.legend(fontsize=6, loc="lower right")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    ctx.save_figure(fig, "roc_loglog", "log-log ROC of every audited mechanism with the booked DP ceiling")
