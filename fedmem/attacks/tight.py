"""Tight privacy audits: estimators whose lower bound can meet the accountant.

:mod:`fedmem.attacks.audit` turns one test's counts into an epsilon lower bound. A
weak auditor (a few hundred trials, a threshold picked after looking, the (eps, delta)
region at a single point) proves little: a Gaussian mechanism booked at eps = 4,
delta = 1e-6 is indistinguishable from eps ~ 2 at any single threshold with 1e5 trials,
because the region ``TPR <= e^eps FPR + delta`` only bites at FPR ~ 1e-6. This module
gives three estimators with power, used side by side by the ``audit.tightness``
experiment:

1. :func:`preregistered_threshold_bound` -- **exact Clopper-Pearson on a pre-registered
   threshold** (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021). The scores of each
   world are split at random; the threshold (and direction) is chosen on one half only,
   and the exact Clopper-Pearson bound of :func:`~fedmem.attacks.audit.epsilon_lower_bound`
   is computed on the other, held-out half. Valid for every (eps, delta)-DP mechanism,
   without any assumption on the shape of its trade-off curve. Tight for pure-DP
   mechanisms whose privacy loss is attained on an event of non-negligible probability
   (Laplace, the exponential mechanism), loose for Gaussian noise at small delta.

2. :func:`gdp_audit` -- **a Gaussian-DP fit of the whole ROC** (Dong, Roth, Su 2019,
   "Gaussian Differential Privacy"; Nasr et al. 2023, "Tight auditing of differentially
   private machine learning", Sec. 4). A mechanism is mu-GDP when every test's type II
   error ``beta`` is at least ``G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu)`` at type I
   error ``alpha``. On the held-out half, at each of ``m`` thresholds fixed on the other
   half, one-sided Clopper-Pearson upper bounds ``alpha_hi``, ``beta_hi`` (Bonferroni over
   all ``2m`` ends, so they hold simultaneously with probability ``1 - alpha``) give the
   smallest mu consistent with that point: ``mu_t = Phi^{-1}(1 - alpha_hi) -
   Phi^{-1}(beta_hi)``. ``mu_lower = max_t mu_t`` is a ``1 - alpha`` lower confidence
   bound on mu; the ROC of every mu' < mu_lower lies above some observed point. It is
   turned into epsilon at delta by the GDP dual (DRS19 Cor. 2.13)::

       delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).

   **Assumption**: the step ``mu -> eps(delta)`` is exact only when the mechanism's
   trade-off curve *is* a GDP curve (the Gaussian mechanism: ``mu = Delta / sigma``, and
   the analytic Gaussian's ``eps(delta)`` equals this dual exactly). The mu bound itself
   holds for any mechanism (it says "not mu'-GDP for mu' < mu_lower"); the epsilon it
   implies is the epsilon of the best-fitting GDP curve, which is what Nasr et al. 2023
   report. For pure-DP mechanisms use estimator 1.

3. :func:`one_run_audit` -- **one-run auditing with many canaries** (Steinke, Nasr,
   Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run"). ``m`` canaries
   are each included independently with probability 1/2 in ONE run; the auditor scores
   each, guesses "in" for the ``k_pos`` highest scores and "out" for the ``k_neg``
   lowest, and abstains on the rest. If the mechanism is (eps, delta)-DP w.r.t. each
   canary, the number ``W`` of correct guesses among the ``r = k_pos + k_neg`` satisfies
   (SNJ23 Thm. 5.2 / Prop. 5.7)::

       Pr[W >= v] <= Pr[Binomial(r, e^eps / (1 + e^eps)) >= v]
                     + 2 m delta * max_{i=1..v} Pr[v - i <= Binomial(r, q) < v] / i

   :func:`one_run_p_value` is the right-hand side; :func:`one_run_epsilon_lower_bound`
   inverts it (the largest eps whose p-value is below ``alpha``). One run, no repeats:
   the audit of one federated retrieval.

Every estimator returns an :class:`Estimate` (``eps_lower``, the method, trials, the
confidence, details). No function here draws from a global RNG: the held-out split takes
an injected ``numpy.random.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize
from scipy.stats import binom, norm

from fedmem import _validate as V
from fedmem.attacks.audit import _cp_ends, epsilon_lower_bound

__all__ = [
    "Estimate",
    "gdp_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "preregistered_threshold_bound",
    "gdp_audit",
    "gdp_power",
    "one_run_p_value",
    "one_run_epsilon_lower_bound",
    "one_run_audit",
    "tightness",
]


@dataclass(frozen=True)
class Estimate:
    """One estimator's answer: ``eps_lower`` holds with probability >= ``confidence``."""

    method: str
    eps_lower: float
    trials: int
    confidence: float
    delta: float
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"method": self.method, "eps_lower": self.eps_lower, "trials": self.trials,
                "confidence": self.confidence, "delta": self.delta, **self.details}


def tightness(eps_lower: float, eps_booked: float) -> float:
    """``eps_lower / eps_booked`` (inf when nothing is booked but something was proven)."""
    lo = V.nonnegative("eps_lower", eps_lower)
    booked = V.nonnegative("eps_booked", eps_booked)
    if booked == 0.0:
        return 0.0 if lo == 0.0 else math.inf
    return lo / booked


# ------------------------------------------------------------------ Gaussian DP
def gdp_tradeoff(alpha, mu: float):
    """The mu-GDP trade-off curve ``G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu)`` (DRS19 Def. 2.7)."""
    mu = V.nonnegative("mu", mu)
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1]. Found {alpha!r}.")
    out = norm.cdf(norm.isf(a) - mu)
    return float(out) if out.ndim == 0 else out


def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of a mu-GDP mechanism (DRS19 Cor. 2.13), computed in log space."""
    eps = V.nonnegative("epsilon", epsilon)
    mu = V.nonnegative("mu", mu)
    if mu == 0.0:
        return 0.0
    a = norm.logcdf(-eps / mu + mu / 2)
    b = eps + norm.logcdf(-eps / mu - mu / 2)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest eps with ``delta(eps) <= delta`` for a mu-GDP mechanism (0 if mu = 0)."""
    mu = V.nonnegative("mu", mu)
    delta = V.open_unit("delta", delta)
    if mu == 0.0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError(f"mu is too large for a finite epsilon at delta={delta!r}. Found {mu!r}.")
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The mu whose GDP curve gives exactly (eps, delta): the inverse of :func:`gdp_epsilon`."""
    eps = V.nonnegative("epsilon", epsilon)
    delta = V.open_unit("delta", delta)
    hi = 1.0
    while gdp_delta(eps, hi) < delta:
        hi *= 2.0
    return float(optimize.brentq(lambda m: gdp_delta(eps, m) - delta, 1e-12, hi, xtol=1e-14, rtol=1e-12))


# ------------------------------------------------------------------ helpers
def _two_worlds(pos, neg):
    p = V.finite_array("pos", pos, ndim=1)
    n = V.finite_array("neg", neg, ndim=1)
    if p.size < 4 or n.size < 4:
        raise ValueError(f"pos and neg need at least 4 scores each. Found {p.size} and {n.size}.")
    return p, n


def _split(x: np.ndarray, frac: float, rng: np.random.Generator):
    perm = rng.permutation(x.size)
    cut = max(1, min(x.size - 1, int(round(frac * x.size))))
    return x[perm[:cut]], x[perm[cut:]]


def _check_rng(rng):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator. Found {type(rng).__name__}.")


def _counts_at_least(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """#{score >= t} for every t."""
    s = np.sort(scores)
    return s.size - np.searchsorted(s, thresholds, side="left")


def _candidate_thresholds(pos: np.ndarray, neg: np.ndarray, count: int) -> np.ndarray:
    """Thresholds spread over the whole ROC: quantiles of both worlds, denser in both tails."""
    u = np.linspace(0.0, 1.0, count // 2 + 2)[1:-1]
    tails = np.concatenate([np.geomspace(1.0 / max(pos.size, neg.size), 0.5, count // 4),
                            1.0 - np.geomspace(1.0 / max(pos.size, neg.size), 0.5, count // 4)])
    qs = np.clip(np.unique(np.concatenate([u, tails])), 0.0, 1.0)
    t = np.concatenate([np.quantile(pos, qs), np.quantile(neg, qs)])
    return np.unique(t)


def _cp_threshold_bounds(kp, n_pos, kn, n_neg, delta, level):
    """Vectorised ``epsilon_lower_bound`` over thresholds: the event {score >= t} and its complement.

    ``level`` is the two-sided CP level per rate (each end one-sided at ``level / 2``).
    """
    tpr_lo, _ = _cp_ends(kp, n_pos, level)
    _, fpr_hi = _cp_ends(kn, n_neg, level)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where((tpr_lo - delta > 0) & (fpr_hi > 0), np.log(np.maximum(tpr_lo - delta, 1e-300) / fpr_hi),
                     -np.inf)
        tnr_lo, fnr_hi = 1.0 - fpr_hi, 1.0 - tpr_lo
        b = np.where((tnr_lo - delta > 0) & (fnr_hi > 0), np.log(np.maximum(tnr_lo - delta, 1e-300) / fnr_hi),
                     -np.inf)
    return np.maximum(a, b)


# ------------------------------------------------------------------ estimator 1
def preregistered_threshold_bound(pos, neg, *, delta: float = 0.0, alpha: float = 0.05,
                                  rng: np.random.Generator, select_frac: float = 0.5,
                                  n_thresholds: int = 400) -> Estimate:
    """Exact Clopper-Pearson epsilon lower bound at a threshold chosen on held-out data.

    ``pos``: scores of releases on D (higher = "D"), ``neg``: on the neighbour D'. Each is
    split at random (``rng``) into a selection part (``select_frac``) and an evaluation
    part. On the selection part, every candidate threshold's bound (both the event
    ``score >= t`` and its complement, :func:`~fedmem.attacks.audit.epsilon_lower_bound`
    at the same ``alpha``) is computed and the best threshold is *registered*; the bound
    reported is that threshold's exact Clopper-Pearson bound on the evaluation part alone,
    valid with probability >= ``1 - alpha`` (no multiple testing: one threshold is tested).
    Swap ``pos`` and ``neg`` to test the other direction (D' -> D).
    """
    p, n = _two_worlds(pos, neg)
    delta = V.nonnegative("delta", delta)
    alpha = V.open_unit("alpha", alpha)
    select_frac = V.open_unit("select_frac", select_frac)
    n_thresholds = V.positive_int("n_thresholds", n_thresholds, minimum=4)
    _check_rng(rng)
    p_sel, p_ev = _split(p, select_frac, rng)
    n_sel, n_ev = _split(n, select_frac, rng)
    cand = _candidate_thresholds(p_sel, n_sel, n_thresholds)
    b = _cp_threshold_bounds(_counts_at_least(p_sel, cand), p_sel.size, _counts_at_least(n_sel, cand), n_sel.size,
                             delta, alpha)
    t = float(cand[int(np.argmax(b))])
    tp = int(_counts_at_least(p_ev, np.array([t]))[0])
    fp = int(_counts_at_least(n_ev, np.array([t]))[0])
    eps = epsilon_lower_bound(tp, p_ev.size, fp, n_ev.size, delta=delta, alpha=alpha)
    return Estimate("clopper_pearson_heldout", eps, int(p.size + n.size), 1.0 - alpha, delta,
                    {"threshold": t, "tp": tp, "n_pos": int(p_ev.size), "fp": fp, "n_neg": int(n_ev.size),
                     "selection_bound": float(max(0.0, np.max(b)))})


# ------------------------------------------------------------------ estimator 2
def gdp_audit(pos, neg, *, delta: float, alpha: float = 0.05, rng: np.random.Generator,
              select_frac: float = 0.5, n_thresholds: int = 64) -> Estimate:
    """Lower confidence bound on mu (Gaussian DP) from the whole ROC, and the epsilon at ``delta`` it implies.

    Thresholds (``n_thresholds`` of them, spread over the ROC) are fixed on a selection
    part of the scores (``rng`` split); on the held-out part, each threshold's
    ``(FPR, TPR)`` gets one-sided Clopper-Pearson bounds with a Bonferroni correction over
    all thresholds, both score orientations and both ends, so that every bound holds at
    once with probability >= ``1 - alpha``. ``mu_lower`` is the largest mu for which some
    observed point lies strictly below the mu-GDP trade-off curve (module docstring,
    estimator 2). ``eps_lower = gdp_epsilon(mu_lower, delta)``: exact for mechanisms with a
    GDP trade-off curve (Gaussian noise), the best-fitting GDP curve's epsilon otherwise.
    ``details`` also holds ``mu_hat`` (the point estimate at the same threshold, no
    confidence correction) and the registered threshold.
    """
    p, n = _two_worlds(pos, neg)
    delta = V.open_unit("delta", delta)
    alpha = V.open_unit("alpha", alpha)
    select_frac = V.open_unit("select_frac", select_frac)
    n_thresholds = V.positive_int("n_thresholds", n_thresholds, minimum=2)
    _check_rng(rng)
    p_sel, p_ev = _split(p, select_frac, rng)
    n_sel, n_ev = _split(n, select_frac, rng)
    # pre-register the thresholds on the selection part: the n_thresholds best point estimates of mu
    cand = _candidate_thresholds(p_sel, n_sel, 4 * n_thresholds)
    best_mu, best_t, best_hat = -math.inf, math.nan, math.nan
    tests = 2 * n_thresholds            # two orientations
    level = alpha / tests               # each threshold: two one-sided ends at level/2 -> total alpha
    for sign in (1.0, -1.0):
        ps, ns = sign * p_sel, sign * n_sel
        c = np.sort(sign * cand)
        a_sel = (_counts_at_least(ns, c) + 0.5) / (ns.size + 1)         # FPR (type I), smoothed
        b_sel = (ps.size - _counts_at_least(ps, c) + 0.5) / (ps.size + 1)  # FNR (type II)
        mu_sel = norm.isf(a_sel) + norm.isf(b_sel)
        keep = c[np.argsort(-mu_sel)[:n_thresholds]]
        pe, ne = sign * p_ev, sign * n_ev
        kp = _counts_at_least(pe, keep)
        kn = _counts_at_least(ne, keep)
        tpr_lo, _ = _cp_ends(kp, pe.size, level)
        _, fpr_hi = _cp_ends(kn, ne.size, level)
        beta_hi = 1.0 - tpr_lo
        mu_t = np.where((fpr_hi < 1.0) & (beta_hi < 1.0), norm.isf(fpr_hi) + norm.isf(beta_hi), -np.inf)
        i = int(np.argmax(mu_t))
        if mu_t[i] > best_mu:
            best_mu, best_t = float(mu_t[i]), float(sign * keep[i])
            a_hat = (kn[i] + 0.5) / (ne.size + 1)
            b_hat = (pe.size - kp[i] + 0.5) / (pe.size + 1)
            best_hat = float(norm.isf(a_hat) + norm.isf(b_hat))
    mu_lower = max(0.0, best_mu)
    eps = gdp_epsilon(mu_lower, delta)
    return Estimate("gdp_fit", eps, int(p.size + n.size), 1.0 - alpha, delta,
                    {"mu_lower": mu_lower, "mu_hat": max(0.0, best_hat), "threshold": best_t,
                     "thresholds_tested": tests})


def gdp_power(n_pos: int, n_neg: int, *, alpha: float = 0.05, select_frac: float = 0.5,
              n_thresholds: int = 64) -> float:
    """The largest ``mu_lower`` :func:`gdp_audit` can return with these many scores per world: a
    perfect attack (every held-out positive above every held-out negative) at the same split and
    Bonferroni level. A test whose power is below the booked ``mu`` cannot show a leak of that size."""
    n_pos = V.positive_int("n_pos", n_pos, minimum=4)
    n_neg = V.positive_int("n_neg", n_neg, minimum=4)
    alpha = V.open_unit("alpha", alpha)
    select_frac = V.open_unit("select_frac", select_frac)
    n_thresholds = V.positive_int("n_thresholds", n_thresholds, minimum=2)
    level = alpha / (2 * n_thresholds)
    ev = [n - max(1, min(n - 1, int(round(select_frac * n)))) for n in (n_pos, n_neg)]
    tpr_lo, _ = _cp_ends(ev[0], ev[0], level)
    _, fpr_hi = _cp_ends(0, ev[1], level)
    return max(0.0, float(norm.isf(float(fpr_hi)) + norm.isf(1.0 - float(tpr_lo))))


# ------------------------------------------------------------------ estimator 3
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Pr[>= v of r guesses correct] under (eps, delta)-DP with m canaries (SNJ23 Thm. 5.2)."""
    m = V.positive_int("m", m)
    r = V.positive_int("r", r, minimum=0)
    v = V.positive_int("v", v, minimum=0)
    if not v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m. Found v={v}, r={r}, m={m}.")
    eps = V.nonnegative("epsilon", epsilon)
    delta = V.nonnegative("delta", delta)
    q = 1.0 / (1.0 + math.exp(-eps))
    beta = float(binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(1.0, beta)
    i = np.arange(1, v + 1)
    window = np.cumsum(binom.pmf(v - i, r, q))      # Pr[v - i <= Bin < v]
    a = float(np.max(window / i))
    return min(1.0, beta + a * delta * 2 * m)


def one_run_epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, alpha: float = 0.05) -> float:
    """The largest eps for which ``one_run_p_value(m, r, v, eps, delta) < alpha`` (0 if none)."""
    alpha = V.open_unit("alpha", alpha)
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    hi = 1.0
    while one_run_p_value(m, r, v, hi, delta) < alpha:
        hi *= 2.0
        if hi > 1e3:
            return math.inf
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def one_run_audit(scores, included, *, delta: float, alpha: float = 0.05,
                  guesses=((10, 10), (25, 25), (50, 50), (100, 100))) -> Estimate:
    """One-run audit (SNJ23): ``scores`` of m canaries (higher = "included"), ``included`` the truth.

    For each ``(k_pos, k_neg)`` in ``guesses`` (fixed before looking at the scores), the
    auditor guesses "in" for the ``k_pos`` top scores and "out" for the ``k_neg`` bottom
    ones; each choice is tested at ``alpha / len(guesses)`` (Bonferroni), and the best
    bound is returned. The canaries' inclusion must be independent fair coins.
    """
    s = V.finite_array("scores", scores, ndim=1)
    inc = np.asarray(included)
    if inc.shape != s.shape or inc.dtype != bool:
        raise ValueError(f"included must be a boolean array shaped like scores {s.shape}. Found {inc.dtype} "
                         f"{inc.shape}.")
    alpha = V.open_unit("alpha", alpha)
    delta = V.nonnegative("delta", delta)
    m = s.size
    guesses = [(int(a), int(b)) for a, b in guesses if 0 < a + b <= m and a >= 0 and b >= 0]
    if not guesses:
        raise ValueError(f"guesses must hold at least one (k_pos, k_neg) with 0 < k_pos + k_neg <= m={m}.")
    order = np.argsort(-s, kind="stable")
    best = (-1.0, None)
    for kp, kn in guesses:
        v = int(inc[order[:kp]].sum() + (~inc[order[m - kn:]]).sum()) if kn else int(inc[order[:kp]].sum())
        eps = one_run_epsilon_lower_bound(m, kp + kn, v, delta=delta, alpha=alpha / len(guesses))
        if eps > best[0]:
            best = (eps, {"k_pos": kp, "k_neg": kn, "correct": v, "guesses": kp + kn})
    return Estimate("one_run", max(0.0, best[0]), m, 1.0 - alpha, delta,
                    {"canaries": m, **best[1], "choices_tested": len(guesses)})
