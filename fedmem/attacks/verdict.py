"""One verdict rule for every attack row fedmem reports.

Every report (``support_leak``, ``flower``, ``agents``, ``memview``, ``brace``, ``dpmind``
and ``results.json``) turns an attack's scores on the two neighbouring worlds into a
:class:`Verdict` by :func:`judge` (or :func:`judge_counts` for a fixed-threshold test).
Nothing else decides a label.

The rule, for an attack that saw what was booked as ``(eps_booked, delta_booked)``:

* ``"LEAK"`` when the Clopper-Pearson epsilon lower bound of the attack exceeds what was
  booked, **or** when the attack's ROC lies provably above the DP trade-off ceiling of the
  booked ``(eps, delta)`` (:attr:`Verdict.ceiling_crossed`). The ceiling test matters for
  exact channels: with ``n`` trials per world a perfect attack can prove at most
  ``eps ~ ln(n / 3.7)`` by Clopper-Pearson, yet perfect separation of ``n + m`` trials is
  itself an event of probability at most ``p`` under any ``(eps, delta)``-DP mechanism,
  with (for positives ``X_i`` and negatives ``Y_j``, ROC ceiling ``c`` of
  :func:`fedmem.attacks.audit.dp_roc_ceiling`)::

      Pr[min_i X_i > max_j Y_j] = E[ TPR(max_j Y_j)^n ] <= integral_0^1 c(1 - u)^n d(u^m)

  (``TPR(s) <= c(FPR(s))`` at every threshold ``s``; substitute ``u = Pr[Y <= s]``). The
  integral is bounded from above by an upper Riemann sum on a fine grid (so the bound is
  never optimistic); ``p <= alpha`` is a ceiling crossing. For ``eps = 0`` it is the exact
  permutation p-value ``1 / C(n + m, n)``. An exact channel (AUC 1.0) with ``n = 800`` per
  world is LEAK against any pure booking below ``eps = 6.28`` while Clopper-Pearson alone
  (held-out half) proves only ``eps >= 4.68``.
* ``"within booked"`` when no leak was shown **and** the test could have shown one: its
  :attr:`Verdict.power` (the Clopper-Pearson bound a perfect attack would reach with this
  many trials) is at least what was booked.
* ``"no leak seen"`` otherwise; the text says ``(power X < Y booked)``: the test was too
  small to see a leak of the booked size, so it shows nothing either way.

* **Gaussian DP (when the booking is Gaussian only)**: a release composed of Gaussian events
  is exactly ``mu``-GDP (:func:`fedmem.dp.events.gaussian_mu`), a claim much stronger at the
  tails than its ``(eps, delta)`` conversion. ``judge(..., mu_booked=mu)`` then also fits the
  whole ROC (:func:`fedmem.attacks.tight.gdp_audit`: many pre-registered thresholds, held-out
  Clopper-Pearson with Bonferroni) and reports ``LEAK`` when the lower confidence bound
  ``mu_lower`` exceeds ``mu_booked`` (no trade-off point of a ``mu_booked``-GDP mechanism lies
  below its curve: sound for any mechanism). Its power (:func:`fedmem.attacks.tight.gdp_power`,
  what a perfect attack proves) counts for "within booked" too: with 400 trials per world a
  perfect attack proves ``mu >= 3.46`` while a Gaussian release at noise multiplier 1.2 books
  ``mu = 0.83``; Clopper-Pearson alone (power ``eps 3.98``) cannot reach that release's
  ``eps = 4.25`` at ``delta = 1e-6``.

Each LEAK test is at level ``alpha`` (the family-wise false-LEAK rate is at most ``2 alpha``,
``3 alpha`` with the GDP test). A run whose noise came from a fast float sampler is not DP at all
(its low-order bits identify the input; :mod:`fedmem.attacks.float_bits`): reports label it
with :func:`sampler_label`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.attacks.audit import epsilon_lower_bound
from fedmem.attacks.tight import gdp_audit, gdp_power

__all__ = ["Verdict", "judge", "judge_counts", "separation_pvalue", "sampler_label",
           "LEAK", "WITHIN", "NO_LEAK_SEEN", "NOT_DP_FLOAT", "is_leak", "worst"]

LEAK = "LEAK"
WITHIN = "within booked"
NO_LEAK_SEEN = "no leak seen"
NOT_DP_FLOAT = "not DP (float sampler)"
_ORDER = {LEAK: 2, NO_LEAK_SEEN: 1, WITHIN: 0}


@dataclass(frozen=True)
class Verdict:
    label: str              # "LEAK" | "within booked" | "no leak seen"
    eps_lower: float        # Clopper-Pearson epsilon lower bound of the attack
    eps_booked: float
    delta_booked: float
    power: float            # the largest epsilon lower bound this many trials could prove (perfect attack)
    ceiling_crossed: bool   # the ROC lies provably above the DP trade-off curve of the booked (eps, delta)
    text: str
    mu_booked: float | None = None   # the booked release is exactly mu-GDP (Gaussian events only), else None
    mu_lower: float | None = None    # GDP lower confidence bound of the attack's ROC (when mu_booked is given)
    mu_power: float | None = None    # the mu_lower a perfect attack would reach with these trials

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.text


def is_leak(v) -> bool:
    """True for a LEAK verdict (a :class:`Verdict`, its dict, or its text)."""
    if isinstance(v, Verdict):
        return v.label == LEAK
    if isinstance(v, dict):
        return v.get("label") == LEAK
    return str(v).startswith(LEAK)


def worst(verdicts) -> str:
    """The overall label of several rows: LEAK if any is, else "no leak seen" if any is, else within booked."""
    labels = [v.label if isinstance(v, Verdict) else (v.get("label") if isinstance(v, dict) else
              (LEAK if str(v).startswith(LEAK) else NO_LEAK_SEEN if str(v).startswith(NO_LEAK_SEEN) else WITHIN))
              for v in verdicts]
    if not labels:
        return WITHIN
    return max(labels, key=lambda s: _ORDER.get(s, 2))


def sampler_label(sampling) -> str | None:
    """``"not DP (float sampler)"`` for a run whose noise came from a fast float sampler, else None."""
    try:
        from fedmem.dp.samplers import is_private  # added by the samplers work; older trees lack it
    except ImportError:
        return NOT_DP_FLOAT if str(sampling) == "fast" else None
    return None if is_private(sampling) else NOT_DP_FLOAT


# ------------------------------------------------------------------ checks
def _booked(eps_booked, delta_booked) -> tuple[float, float]:
    eps = V.nonnegative("eps_booked", eps_booked) if not (isinstance(eps_booked, float) and math.isinf(eps_booked)
                                                        and eps_booked > 0) else math.inf
    delta = V.nonnegative("delta_booked", delta_booked)
    if delta >= 1.0:
        raise ValueError(f"delta_booked must be in [0, 1). Found {delta_booked!r}.")
    return float(eps), float(delta)


def _log_ceiling(f: np.ndarray, eps: float, delta: float) -> np.ndarray:
    """log of the DP ROC ceiling ``min(e^eps f + delta, 1 - e^-eps (1 - f - delta))`` capped to [0, 1]."""
    a = math.exp(eps) * f + delta
    b = 1.0 - math.exp(-eps) * (1.0 - f - delta)
    c = np.clip(np.minimum(a, b), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.log(c)


def separation_pvalue(n_pos: int, n_neg: int, eps: float, delta: float = 0.0, grid: int = 200_001) -> float:
    """Upper bound on ``Pr[all n_pos positive scores > all n_neg negative scores]`` under any
    ``(eps, delta)``-DP mechanism (see the module docstring). An upper Riemann sum of
    ``integral_0^1 c(1-u)^n_pos d(u^n_neg)`` on ``grid`` points: never below the true bound."""
    n = V.positive_int("n_pos", n_pos)
    m = V.positive_int("n_neg", n_neg)
    if math.isinf(eps):
        return 1.0
    u = np.linspace(0.0, 1.0, grid)
    lo, hi = u[:-1], u[1:]
    with np.errstate(divide="ignore"):
        log_lo, log_hi = np.log(lo), np.log(hi)
        # log(hi^m - lo^m) = m log hi + log(1 - (lo/hi)^m)
        log_w = m * log_hi + np.log(-np.expm1(m * (log_lo - log_hi)))
    log_c = n * _log_ceiling(1.0 - lo, eps, delta)     # sup of c(1-u)^n on [lo, hi] is at u = lo
    terms = log_w + log_c
    top = np.max(terms)
    if not np.isfinite(top):
        return 0.0
    return float(min(1.0, math.exp(top) * np.sum(np.exp(terms - top))))


def _text(label: str, eps_lower: float, eps_booked: float, delta: float, power: float, crossed: bool,
          gdp: tuple | None = None) -> str:
    booked = "inf" if math.isinf(eps_booked) else f"{eps_booked:.2f}"
    if gdp is not None:
        mu_b, mu_lo, mu_pow = gdp
        if label == LEAK and mu_lo > mu_b + 1e-12 and not eps_lower > eps_booked and not crossed:
            return f"LEAK (GDP mu >= {mu_lo:.2f} > {mu_b:.2f} booked; CP eps >= {eps_lower:.2f})"
        if label == WITHIN and not power >= eps_booked:
            return (f"within booked (GDP mu >= {mu_lo:.2f} <= {mu_b:.2f} booked, power mu {mu_pow:.2f}; "
                    f"CP eps >= {eps_lower:.2f})")
        if label == NO_LEAK_SEEN:
            return f"no leak seen (power eps {power:.2f} < {booked}, mu {mu_pow:.2f} < {mu_b:.2f} booked)"
    if label == LEAK:
        if eps_lower > eps_booked:
            return f"LEAK (eps >= {eps_lower:.2f} > {booked} booked)"
        dtxt = f", delta {delta:.2g}" if delta > 0 else ""
        return (f"LEAK (perfect separation: ROC above the DP ceiling of eps {booked}{dtxt} booked; "
                f"CP eps >= {eps_lower:.2f}, power {power:.2f})")
    if label == WITHIN:
        return f"within booked (eps >= {eps_lower:.2f} <= {booked} booked; power {power:.2f})"
    if math.isinf(eps_booked):
        return f"no leak seen (nothing claimed: trusted; power {power:.2f})"
    return f"no leak seen (power {power:.2f} < {booked} booked)"


def _decide(eps_lower: float, power: float, crossed: bool, eps_booked: float, delta: float,
            gdp: tuple | None = None) -> Verdict:
    """``gdp``: ``(mu_booked, mu_lower, mu_power)`` when the booking is Gaussian only."""
    gdp_leak = gdp is not None and gdp[1] > gdp[0] + 1e-12
    gdp_power_ok = gdp is not None and gdp[2] >= gdp[0]
    if eps_lower > eps_booked + 1e-12 or crossed or gdp_leak:
        label = LEAK
    elif power >= eps_booked or gdp_power_ok:
        label = WITHIN
    else:
        label = NO_LEAK_SEEN
    mu = (None, None, None) if gdp is None else tuple(float(x) for x in gdp)
    return Verdict(label, float(eps_lower), float(eps_booked), float(delta), float(power), bool(crossed),
                   _text(label, eps_lower, eps_booked, delta, power, crossed, gdp), *mu)


def _power(n_pos: int, n_neg: int, delta: float, alpha: float) -> float:
    return epsilon_lower_bound(n_pos, n_pos, 0, n_neg, delta=delta, alpha=alpha)


# ------------------------------------------------------------------ the rule
def judge_counts(tp, n_pos, fp, n_neg, eps_booked, delta_booked=0.0, *, alpha=0.05) -> Verdict:
    """Verdict of one fixed-threshold test: ``tp`` of ``n_pos`` trials on the world with the
    target flagged, ``fp`` of ``n_neg`` on the neighbour. The ceiling test here is the
    Clopper-Pearson point ``(FPR_hi, TPR_lo)`` above the booked ceiling (equivalently the
    epsilon bound above the booking), plus perfect separation (``tp = n_pos, fp = 0``)
    tested as in :func:`judge`."""
    eps, delta = _booked(eps_booked, delta_booked)
    alpha = V.open_unit("alpha", alpha)
    eps_lower = epsilon_lower_bound(tp, n_pos, fp, n_neg, delta=delta, alpha=alpha)
    power = _power(n_pos, n_neg, delta, alpha)
    crossed = eps_lower > eps + 1e-12
    if not crossed and tp == n_pos and fp == 0 and not math.isinf(eps):
        crossed = separation_pvalue(n_pos, n_neg, eps, delta) <= alpha
    return _decide(eps_lower, power, crossed, eps, delta)


MAX_THRESHOLDS = 64


def _candidates(scores: np.ndarray) -> np.ndarray:
    ts = np.unique(scores)
    if ts.size > MAX_THRESHOLDS:
        ts = np.unique(np.quantile(scores, np.linspace(0.0, 1.0, MAX_THRESHOLDS), method="lower"))
    return ts


def _counts(pos: np.ndarray, neg: np.ndarray, t: float) -> tuple[int, int]:
    return int(np.sum(pos >= t)), int(np.sum(neg >= t))


def judge(pos_scores, neg_scores, eps_booked, delta_booked=0.0, *, alpha=0.05,
          rng: np.random.Generator | None = None, mu_booked: float | None = None) -> Verdict:
    """Verdict of an attack from its scores (higher = "the target is in"), one per trial:
    ``pos_scores`` on the world with the target, ``neg_scores`` on its neighbour.

    ``eps_lower`` is honest about choosing the threshold: both samples are split in half at
    random (``rng``; a generator seeded with 0 when None, so verdicts are reproducible), the
    threshold ``score >= t`` maximising the Clopper-Pearson bound is chosen on one half and
    the bound is computed on the other (as :func:`fedmem.attacks.support.membership_report`
    does). ``power`` is the bound a perfect attack reaches on that held-out half.
    ``ceiling_crossed`` is that bound above the booking, or all positives strictly above all
    negatives (an event fixed in advance, so on all trials) with the separation p-value
    (module docstring) at most ``alpha``.

    ``mu_booked``: when what was booked is exactly ``mu``-GDP (Gaussian events only,
    :func:`fedmem.dp.events.gaussian_mu`), the whole-ROC GDP test runs too (module docstring) on
    its own split, drawn from a child of ``rng`` (``rng.spawn``), so the Clopper-Pearson numbers
    are the same with or without it. At least 4 scores per world are needed for it.
    """
    pos = V.finite_array("pos_scores", pos_scores, ndim=1)
    neg = V.finite_array("neg_scores", neg_scores, ndim=1)
    if pos.size < 2 or neg.size < 2:
        raise ValueError(f"judge needs at least 2 scores per world. Found {pos.size} and {neg.size}.")
    eps, delta = _booked(eps_booked, delta_booked)
    alpha = V.open_unit("alpha", alpha)
    if rng is None:
        rng = np.random.default_rng(0)
    V.rng_check("rng", rng)
    ip, ineg = rng.permutation(pos.size), rng.permutation(neg.size)
    sp, ep = pos[ip[: pos.size // 2]], pos[ip[pos.size // 2:]]
    sn, en = neg[ineg[: neg.size // 2]], neg[ineg[neg.size // 2:]]
    best_t, best_e = math.inf, -1.0
    for t in _candidates(np.r_[sp, sn]):
        tp, fp = _counts(sp, sn, t)
        e = epsilon_lower_bound(tp, sp.size, fp, sn.size, delta=delta, alpha=alpha)
        if e > best_e:
            best_t, best_e = float(t), e
    tp, fp = _counts(ep, en, best_t)
    eps_lower = epsilon_lower_bound(tp, ep.size, fp, en.size, delta=delta, alpha=alpha)
    power = _power(ep.size, en.size, delta, alpha)
    crossed = eps_lower > eps + 1e-12
    if not crossed and pos.min() > neg.max() and not math.isinf(eps):
        crossed = separation_pvalue(pos.size, neg.size, eps, delta) <= alpha
    gdp = None
    if mu_booked is not None:
        mu_b = V.nonnegative("mu_booked", mu_booked)
        if pos.size >= 4 and neg.size >= 4 and math.isfinite(mu_b):
            est = gdp_audit(pos, neg, delta=delta if 0 < delta < 1 else 1e-6, alpha=alpha, rng=rng.spawn(1)[0])
            gdp = (mu_b, est.details["mu_lower"], gdp_power(pos.size, neg.size, alpha=alpha))
    return _decide(eps_lower, power, crossed, eps, delta, gdp)
