"""The distinguisher: a learned classifier, trained on one split, judged on another.

Every trial of a hypothesis (an arm: worlds + query sequence) is assigned to the *train*
or the *test* split when it is collected (alternately, so the splits are independent and
identically distributed). The search (the bandit) only ever looks at the train split.
At the end, per hypothesis:

1. :class:`~fedmem.hunt.observe.Featuriser` columns are learned on the train split;
2. a gradient-boosted classifier (scikit-learn ``HistGradientBoostingClassifier``, which
   treats NaN as its own value) is fit on the train split, and so is the best single
   feature (the recipe's readable "feature, threshold");
3. the classifier's scores on the test split go to the shared verdict rule
   :func:`fedmem.attacks.verdict.judge` (Clopper-Pearson with its own held-out threshold
   choice, the DP-ceiling separation test, and the GDP test when what was booked is
   Gaussian), at level ``alpha / (3 H)`` where ``H`` is the number of hypotheses the hunt
   declared before collecting anything (Bonferroni; the first step of Holm's procedure,
   which is all a "any leak?" verdict uses). ``judge`` runs up to three tests at its
   ``alpha``, hence the 3: the family-wise chance of a false LEAK over the whole hunt is at
   most ``alpha``.
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.attacks.audit import roc_auc
from fedmem.attacks.verdict import judge
from fedmem.hunt.observe import Featuriser


def _classifier(seed: int):
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(max_iter=60, learning_rate=0.15, max_leaf_nodes=15,
                                          min_samples_leaf=10, random_state=seed)


def fit(leaves0: list[dict], leaves1: list[dict], seed: int):
    """``(featuriser, model, best_single)``; ``best_single = (column, sign, train AUC)``."""
    y = np.r_[np.zeros(len(leaves0)), np.ones(len(leaves1))]
    feat = Featuriser().fit(leaves0 + leaves1, y)
    X = feat.transform(leaves0 + leaves1)
    model = None
    if X.shape[1] and len(leaves0) >= 8 and len(leaves1) >= 8:
        try:
            model = _classifier(seed).fit(X, y)
        except ValueError:      # a degenerate training split: the single-feature test still stands
            model = None
    best = (None, 1.0, 0.5)
    for j, name in enumerate(feat.names):
        col = X[:, j]
        if np.all(np.isnan(col)):
            continue
        c = np.where(np.isnan(col), -1e300, col)
        if np.ptp(c) == 0:
            continue
        auc = float(roc_auc(c[y == 1], c[y == 0]))
        a, sign = (auc, 1.0) if auc >= 0.5 else (1.0 - auc, -1.0)
        if a > best[2]:
            best = (name, sign, a)
    return feat, model, best


def scores(feat: Featuriser, model, leaves: list[dict]) -> np.ndarray:
    X = feat.transform(leaves)
    if model is None:
        return np.zeros(len(leaves))
    return model.predict_proba(X)[:, 1]


def best_scores(feat: Featuriser, model, best, leaves: list) -> np.ndarray:
    """The classifier's scores, or the best single feature's when no classifier could be fit."""
    return scores(feat, model, leaves) if model is not None else single_scores(feat, best, leaves)


def single_scores(feat: Featuriser, best, leaves: list[dict]) -> np.ndarray:
    name, sign, _ = best
    if name is None:
        return np.zeros(len(leaves))
    j = feat.names.index(name)
    col = feat.transform(leaves)[:, j]
    return sign * np.where(np.isnan(col), -1e300, col)


def quick_auc(leaves0: list[dict], leaves1: list[dict], seed: int) -> float:
    """The search's cheap progress signal on the TRAIN split only: a classifier fit on its first half,
    AUC (folded to >= 0.5) on its second half."""
    leaves0, leaves1 = leaves0[-400:], leaves1[-400:]     # bounded cost per call: the latest 400 per world
    h0, h1 = len(leaves0) // 2, len(leaves1) // 2
    if h0 < 8 or h1 < 8:
        return 0.5
    feat, model, best = fit(leaves0[:h0], leaves1[:h1], seed)
    s0, s1 = scores(feat, model, leaves0[h0:]), scores(feat, model, leaves1[h1:])
    a = float(roc_auc(s1, s0))
    b = float(roc_auc(single_scores(feat, best, leaves1[h1:]), single_scores(feat, best, leaves0[h0:])))
    return max(a, b)


def verdict(pos, neg, booked: dict, alpha: float, seed: int):
    """The shared rule on held-out scores; ``booked = {"eps", "delta", "mu"}`` (``mu`` None unless Gaussian)."""
    pos = np.nan_to_num(np.asarray(pos, dtype=np.float64), nan=0.0, posinf=1e300, neginf=-1e300)
    neg = np.nan_to_num(np.asarray(neg, dtype=np.float64), nan=0.0, posinf=1e300, neginf=-1e300)
    mu = booked.get("mu")
    eps = booked["eps"]
    return judge(pos, neg, eps if math.isfinite(eps) else math.inf, booked["delta"], alpha=alpha,
                 rng=np.random.default_rng(seed), mu_booked=mu if (mu is not None and math.isfinite(mu)) else None)
