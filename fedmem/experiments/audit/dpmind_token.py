"""``dpmind.token``: DP-MIND's metric-DP token perturbation and a coordinate-wise Laplace variant.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .book import Book


def audit_dpmind(cfg, ctx, book: Book, search_rows: list):
    """DP-MIND's metric-DP token perturbation (``fedmem.dp.MetricLaplace``: density
    proportional to ``exp(-eps ||z||)``), booked ``eps * ||x - x'||`` for two token
    embeddings. The noisy embedding is audited (the nearest-token projection after it is
    post-processing). The LR statistic is ``||y - x'|| - ||y - x||``. The search places ``x'``
    along an axis or the diagonal and keeps the placement with the largest exact worst-case
    loss under the audited sampler (metric Laplace: rotation invariant, all alike;
    coordinate-wise Laplace, the broken variant: the diagonal, loss ``eps ||x - x'||_1``).
    The loss ``eps (||y-x'|| - ||y-x||)`` reaches ``eps * dist`` only on the ray through
    ``x'`` and ``x``: in ``dim`` dimensions that event has tiny probability, which the
    row measures (a low tightness here is the looseness of the booked worst case)."""
    from fedmem.dp import MetricLaplace  # lazy: loads dp_accounting (~190 ms)

    A, D = cfg.audit, cfg.dpmind
    booked = D.epsilon * D.distance
    x = np.zeros(D.dim)
    dirs = [("axis e_0", np.eye(D.dim)[0]), ("diagonal", np.ones(D.dim) / math.sqrt(D.dim))]
    for broken, n in ((None, D.trials), ("per_coordinate_laplace", min(D.trials, A.broken_trials))):
        # the exact worst-case loss of each placement under the audited mechanism: metric Laplace
        # eps * ||x - x'||_2 (every direction alike), coordinate-wise Laplace eps * ||x - x'||_1
        order = 2 if broken is None else 1
        losses = [D.epsilon * float(np.linalg.norm(D.distance * u, order)) for _, u in dirs]
        i = int(np.argmax(losses))
        for (lab, _), loss in zip(dirs, losses):
            search_rows.append(["dpmind" + (f"/{broken}" if broken else ""), f"{lab}, distance {D.distance}",
                                loss, loss / booked, "<- chosen" if lab == dirs[i][0] else ""])
        xp = D.distance * dirs[i][1]
        t0 = time.perf_counter()
        rng = ctx.rng("dpmind", broken or "correct")
        if broken:
            # the classic calibration bug: Laplace(1/eps) on every coordinate (the 1-D calibration) instead of
            # the L2 metric Laplace, whose radius is Gamma(dim, 1/eps)
            z_in = rng.laplace(0.0, 1.0 / D.epsilon, (n, D.dim))
            z_out = rng.laplace(0.0, 1.0 / D.epsilon, (n, D.dim))
        else:
            mech = MetricLaplace(D.epsilon, D.dim)
            z_in, z_out = mech.sample(rng, n), mech.sample(rng, n)
        y_in, y_out = x + z_in, xp + z_out
        pos = np.linalg.norm(y_in - xp, order, axis=1) - np.linalg.norm(y_in - x, order, axis=1)
        neg = np.linalg.norm(y_out - xp, order, axis=1) - np.linalg.norm(y_out - x, order, axis=1)
        name = "dpmind.token" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=booked, booked_delta=0.0, family="pure",
                 eps_pair=losses[i], broken=broken, rng=ctx.rng("estimate", name), gdp_ok=False,
                 seconds=time.perf_counter() - t0,
                 note=f"dim {D.dim}, noisy embedding (before projection), LR test, {dirs[i][0]} placement"
                      + (", coordinate-wise Laplace(1/eps) booked as metric DP" if broken else ""))
