"""Bookkeeping of the audit: one row per audited mechanism (correct or broken), the estimators
side by side and the ROC data of every row; the headline estimator of each kind of mechanism.
"""

from __future__ import annotations

from fedmem.attacks import tight as T


# The estimator registered (before any data) as the headline of each kind of mechanism.
HEADLINE = {"gaussian": "gdp_fit", "laplace": "clopper_pearson_heldout", "pure": "clopper_pearson_heldout"}


class Book:
    """Collects one row per audited mechanism (correct or broken) and its ROC data."""

    def __init__(self, alpha: float, delta: float):
        self.alpha, self.delta = alpha, delta
        self.mechanisms: dict = {}
        self.rows: list = []
        self.side: list = []
        self.rocs: dict = {}
        self.search: list = []

    def add(self, name: str, *, pos, neg, eps_booked: float, booked_delta: float, family: str, eps_pair: float,
            broken: str | None, rng, extra: list | None = None, seconds: float = 0.0, gdp_ok: bool = True,
            headline: str | None = None, note: str = "", ks: float | None = None):
        ests = [T.preregistered_threshold_bound(pos, neg, delta=booked_delta, alpha=self.alpha, rng=rng)]
        if gdp_ok:
            ests.append(T.gdp_audit(pos, neg, delta=booked_delta if booked_delta > 0 else self.delta,
                                    alpha=self.alpha, rng=rng))
        ests += list(extra or [])
        by = {e.method: e for e in ests}
        head = by[headline or HEADLINE[family]]
        caught = head.eps_lower > eps_booked + 1e-12
        tight = T.tightness(head.eps_lower, eps_booked)
        entry = {"eps_lower": head.eps_lower, "eps_booked": eps_booked, "delta_booked": booked_delta,
                 "tightness": tight, "method": head.method, "trials": head.trials,
                 "confidence": head.confidence, "broken": broken is not None, "eps_pair": eps_pair,
                 "caught": caught, "seconds": seconds, "deployed_vs_batched_ks_p": ks,
                 "estimators": {e.method: e.to_dict() for e in ests}}
        if broken:
            entry["variant"] = broken
        self.mechanisms[name] = entry
        verdict = ("LEAK (caught)" if caught else "within booked") if broken is None or caught else \
            "MISSED (not caught)"
        self.rows.append([name, broken or "-", head.method, head.eps_lower, eps_booked, booked_delta, eps_pair,
                          tight, head.trials, f"{head.confidence:.2%}", verdict])
        self.side.append([name] + [by[m].eps_lower if m in by else "-"
                                   for m in ("clopper_pearson_heldout", "gdp_fit", "one_run")]
                         + [f"{by['gdp_fit'].details['mu_lower']:.4g}" if "gdp_fit" in by else "-", note])
        self.rocs[name] = (pos, neg, eps_booked, booked_delta, family)
