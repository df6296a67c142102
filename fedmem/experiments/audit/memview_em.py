"""``memview.em``: DP-MemView's exponential-mechanism selection (``ExponentialMechanism.select``),
its worst-case utility neighbours by exact probabilities, and a sensitivity-off-by-2 variant.
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks.audit import epsilon_lower_bound

from .book import Book


def search_em_neighbours(epsilon: float, sensitivity: float, max_candidates: int, trials: int, alpha: float):
    """Worst-case utility neighbours of the exponential mechanism, by exact probabilities.

    For K candidates, D has utilities ``(s, 0, ..., 0)`` and D' has ``(0, s, ..., s)`` (every
    coordinate moves by the sensitivity s, the largest change allowed); the event "candidate
    0 is chosen" has exact privacy loss ``ln(P_D(0) / P_D'(0))``, which grows to epsilon
    with K while ``P_D'(0)`` shrinks. The K kept maximises the Clopper-Pearson bound the
    test would reach with ``trials`` releases at the expected counts (public numbers only).
    Returns ``(u_D, u_D', rows)``."""
    from fedmem.dp import ExponentialMechanism  # lazy: loads dp_accounting (~130 ms)

    em = ExponentialMechanism(epsilon, sensitivity)
    rows, best = [], None
    K = 2
    while K <= max_candidates:
        u_in = np.zeros(K)
        u_in[0] = sensitivity
        u_out = np.full(K, sensitivity)
        u_out[0] = 0.0
        p, q = float(em.probabilities(u_in)[0]), float(em.probabilities(u_out)[0])
        loss = math.log(p / q)
        expect = epsilon_lower_bound(int(p * trials / 2), trials // 2, int(math.ceil(q * trials / 2)), trials // 2,
                                     alpha=alpha)
        rows.append(["em", f"K={K}", loss, loss / epsilon, expect])
        if best is None or expect > best[0]:
            best = (expect, u_in, u_out, K, loss)
        K *= 2
    return best[1], best[2], rows, best[3], best[4]


def _em_draws(em, u, n: int, deployed: int, rng):
    """``deployed`` draws of ``em.select(u, rng)`` and ``n`` more by the same inverse CDF on a batch
    of uniforms (``ExponentialMechanism.select``: one uniform, ``searchsorted`` on the cumulative
    probabilities); scores are 1 for candidate 0. Returns the scores and the two-sided p-value of
    a two-proportion test (deployed vs batched frequency of candidate 0)."""
    from scipy.stats import fisher_exact

    live = np.array([em.select(u, rng) == 0 for _ in range(deployed)], dtype=float)
    cdf = np.cumsum(em.probabilities(u))
    idx = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cdf.size - 1)
    bulk = (idx == 0).astype(float)
    a, b = int(live.sum()), int(bulk.sum())
    p = float(fisher_exact([[a, live.size - a], [b, bulk.size - b]]).pvalue)
    return np.concatenate([live, bulk]), p


def audit_em(cfg, ctx, book: Book, search_rows: list):
    from fedmem.dp import ExponentialMechanism  # lazy: loads dp_accounting (~130 ms)

    A, M = cfg.audit, cfg.memview
    sens = 1.0
    u_in, u_out, rows, K, loss = search_em_neighbours(M.epsilon, sens, M.max_candidates, A.trials, A.alpha)
    search_rows += [r[:4] + [f"expected CP bound {r[4]:.3g}" + (" <- chosen" if r[1] == f"K={K}" else "")]
                    for r in rows]
    for broken, s_decl, n in ((None, sens, A.trials), ("sensitivity_off_by_2", sens / 2, A.broken_trials)):
        em = ExponentialMechanism(M.epsilon, s_decl)
        t0 = time.perf_counter()
        rng = ctx.rng("em", broken or "correct")
        deployed = min(cfg.aggregator.deployed, n)
        pos, f_in = _em_draws(em, u_in, n, deployed, rng)
        neg, f_out = _em_draws(em, u_out, n, deployed, rng)
        p_in, p_out = float(em.probabilities(u_in)[0]), float(em.probabilities(u_out)[0])
        name = "memview.em" + (f"/{broken}" if broken else "")
        book.add(name, pos=pos, neg=neg, eps_booked=M.epsilon, booked_delta=0.0, family="pure",
                 eps_pair=math.log(p_in / p_out), broken=broken, rng=ctx.rng("estimate", name), gdp_ok=False,
                 seconds=time.perf_counter() - t0,
                 note=f"K={K} candidates, event 'candidate 0 chosen'; deployed vs batched two-proportion p="
                      f"{min(f_in, f_out):.2g}" + (
                     f", declared sensitivity {s_decl} vs utilities moving by {sens}" if broken else ""))
