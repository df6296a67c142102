"""``brace.step``: one BRACE step (``brace_run`` with T = 1), its neighbour search over gate
sizes, the exact epsilon of a projected Gaussian pair, and a half-noise variant.
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedmem.attacks import tight as T

from .book import Book
from .releases import batched_release


def brace_step_candidates(r: float, far: int, gate: int, margin: float = 1e-3):
    """Candidate neighbouring banks for one BRACE step from ``q = 0`` (d = 1). In every pair
    ONE record sits at ``+(1 - margin) r`` in D and at ``-(1 - margin) r`` in D' (both inside
    the gate), which moves the step's mean by ``2 (1 - margin) r / m`` for a gate of ``m``
    records; the certificate ``Delta_bar`` (floor ``2r/n``) sets the noise. Small gates move
    the mean most but get a certificate near ``2r``, whose noise is then cut by the
    projection on ``B(q, 2r)``; large gates (``m`` records at ``q``) drive the certificate to
    its floor ``2r/n`` and the release is a plain Gaussian. Returns ``(label, D, D')``
    pairs; the search keeps the one with the largest exact epsilon."""
    x = (1 - margin) * r
    rest = np.full((far, 1), 10.0 * r)
    out = [("1 in gate (+x vs -x), %d far" % far, np.vstack([[[x]], rest]), np.vstack([[[-x]], rest]))]
    sizes = sorted({max(1, gate // 40), max(1, gate // 4), gate})
    for m in sizes:
        core = np.zeros((m, 1))
        out.append((f"{m} at q + 1 (+x vs -x)", np.vstack([core, [[x]]]), np.vstack([core, [[-x]]])))
    return out


class _ScaledNoise:
    """A NoiseSource whose noise std is ``factor`` times the calibrated one (the half-noise variant)."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor

    def perturb(self, t, Q, sigma, delta_bar, *, grid=None):
        return self.inner.perturb(t, Q, sigma * self.factor, delta_bar * self.factor, grid=grid)


def projected_gaussian_epsilon(a: float, b: float, s: float, R: float, delta: float, points: int = 40_001) -> float:
    """Exact (numerical) epsilon at ``delta`` of ``clip(a + s Z, -R, R)`` vs ``clip(b + s Z, -R, R)``
    (1-D Gaussian then projection onto the ball, the BRACE output): ``delta(eps)`` is the
    integral of ``(p_a - e^eps p_b)_+`` over the interior plus the two atoms, maximised over
    both orders; eps by bisection."""
    from scipy.stats import norm as N

    lo_y, hi_y = max(-R, min(a, b) - 40 * s), min(R, max(a, b) + 40 * s)    # the interior mass outside: < 1e-300
    y = np.linspace(lo_y, hi_y, points)
    h = y[1] - y[0]

    # densities and atoms do not depend on eps: computed once
    dens = {c: (N.pdf(y, c, s), float(N.sf(R, c, s)), float(N.cdf(-R, c, s))) for c in (a, b)}

    def dlt(eps, a_, b_):
        (pa, ha, la), (pb, hb, lb) = dens[a_], dens[b_]
        w = math.exp(eps)
        return np.sum(np.maximum(pa - w * pb, 0.0)) * h + max(ha - w * hb, 0.0) + max(la - w * lb, 0.0)

    def d(eps):
        return max(dlt(eps, a, b), dlt(eps, b, a))

    if d(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def audit_brace(cfg, ctx, book: Book, search_rows: list):
    """One BRACE step (``brace_run`` with T = 1, d = 1, secure sampler, as ``BraceMemory.recall``
    runs it): the release is ``Y_1 = Proj_{B(q, 2r)}(Q_1 + xi)`` with ``xi`` of std
    ``Delta_bar_1 sqrt(T / (2 rho))``; booked ``params.event()`` = (epsilon, delta) from the
    zCDP parameter rho (App. C.2). The LR statistic of the equal-variance pair is monotone
    in ``y`` (the projection's atoms sit at its ends), so the score is ``y (a - b)``."""
    from fedmem.agent.brace.mechanism import NoiseSource, brace_run  # lazy: loads dp_accounting (~110 ms)
    from fedmem.agent.brace.params import BraceParams  # lazy: loads dp_accounting (~400 ms)
    from fedmem.dp import GaussianMechanism  # lazy: loads dp_accounting (~120 ms)

    A, Br = cfg.audit, cfg.brace
    r = Br.r
    p = BraceParams(r=r, T=1, epsilon=Br.epsilon, delta=A.delta, d=1)
    q = np.zeros((1, 1))

    def step(X, noise, B):
        return brace_run(X, np.repeat(q, B, axis=0), p, noise)

    zero = NoiseSource(normals=np.zeros((1, 1, 1)))
    best = None
    for lab, X, Xp in brace_step_candidates(r, Br.far, Br.gate):
        ra, rb = step(X, zero, 1), step(Xp, zero, 1)
        a, b = float(ra.Y[0, 0, 0]), float(rb.Y[0, 0, 0])
        dbar = max(float(ra.delta_bar[0, 0]), float(rb.delta_bar[0, 0]))
        same = float(ra.delta_bar[0, 0]) == float(rb.delta_bar[0, 0])
        g = p.secure_grid(X.shape[0])
        sig = dbar * p.noise_multiplier
        loss = projected_gaussian_epsilon(a, b, sig * (dbar + g) / dbar, 2 * r, A.delta) if same else math.nan
        search_rows.append(["brace", lab, loss, loss / p.epsilon,
                            f"mean moves {abs(a - b):.4g}, certificate {dbar:.4g} ({abs(a - b) / dbar:.3g} of it)"
                            + ("" if same else " (differs between worlds: skipped)")])
        if same and (best is None or loss > best[0] + 1e-12):
            best = (loss, lab, X, Xp, a, b, dbar)
    for row in search_rows:
        if row[0] == "brace" and row[1] == best[1]:
            row[4] += " <- chosen"
    _, _, X, Xp, a, b, dbar = best
    grid = p.secure_grid(X.shape[0])
    for broken, factor, n in ((None, 1.0, Br.trials), ("half_noise", 0.5, min(Br.trials, A.broken_trials))):
        t0 = time.perf_counter()
        rng = ctx.rng("brace", broken or "correct")
        live = min(cfg.aggregator.deployed, n)
        sig = dbar * p.noise_multiplier * factor
        mech = GaussianMechanism(sigma=sig, l2_sensitivity=dbar * factor)
        out, ks = [], []
        for bank, centre in ((X, a), (Xp, b)):
            src = NoiseSource(rng=rng, sampling="secure")
            dep = step(bank, src if factor == 1.0 else _ScaledNoise(src, factor), live).Y[:, 0, 0]
            bulk = np.clip(batched_release(mech, np.array([centre]), n - live, rng, "secure", grid)[:, 0],
                           -2 * r, 2 * r)
            from scipy.stats import ks_2samp

            ks.append(float(ks_2samp(dep, bulk).pvalue))
            out.append(np.concatenate([dep, bulk]))
        infl = sig * (dbar * factor + grid) / (dbar * factor)
        eps_pair = projected_gaussian_epsilon(a, b, infl, 2 * r, A.delta)
        pos, neg = out[0] * (a - b), out[1] * (a - b)
        name = "brace.step" + (f"/{broken}" if broken else "")
        # the GDP fit is exact only when the projection never binds (a plain Gaussian pair); otherwise the
        # projection's atoms bound the loss below the GDP curve's and only Clopper-Pearson is valid
        gauss = max(abs(a), abs(b)) + 10 * infl < 2 * r
        book.add(name, pos=pos, neg=neg, eps_booked=p.event().epsilon, booked_delta=A.delta, family="gaussian",
                 headline="gdp_fit" if gauss else "clopper_pearson_heldout",
                 eps_pair=eps_pair, broken=broken, rng=ctx.rng("estimate", name), seconds=time.perf_counter() - t0,
                 ks=min(ks),
                 note=f"T=1, d=1, r={r}, {X.shape[0]} records, certificate {dbar:.4g}, noise std {sig:.4g}, output "
                      f"projected on B(q, {2 * r:g}); without the projection the pair's eps would be "
                      f"{T.gdp_epsilon(abs(a - b) / infl, A.delta):.3g}; zCDP rho={p.rho:.4g}; deployed vs batched "
                      f"KS p={min(ks):.2g} ({live} brace_run releases per world)")
