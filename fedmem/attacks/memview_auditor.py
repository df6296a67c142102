"""Auditors of DP-MemView transcripts (paper, Appendix C.5) and a released-view auditor.

**Embedding auditor** (the paper's): for each transcript prefix of length T embed every
assistant response with a frozen sentence encoder, average the T turn embeddings and
L2-normalise. For each protected attribute and prefix length a separate logistic
regression distinguishes transcripts from ``M`` (label 1) and ``M'`` (label 0): fitted
on training pairs, sigmoid (Platt) calibrated on validation pairs, evaluated on
held-out test pairs. The Platt slope is constrained to be positive (a calibration may
rescale a score, never reverse it): an unconstrained fit on 2 x 16 validation
transcripts fitted negative slopes in 10-16 of the per-attribute fits of a Table 4 run
and turned raw AUCs of ~0.50 into calibrated ones of ~0.43. With a positive slope the
per-attribute ranking, hence AUC and TPR@FPR, equal those of the raw scores.

**View auditor** (:func:`view_audit`): works on the released views, not on embeddings.
Each turn is reduced to a public context (active slot, whether its public read set
meets the target group ``I_a``, the fallback control) and a view category (generic / a view supported by the
target attribute / another specific view). A per-attribute naive-Bayes likelihood ratio
``sum_t log P(cat_t | ctx_t, M) / P(cat_t | ctx_t, M')`` is estimated from the
*training* pairs only (add-``smoothing`` counts) and scored on the test pairs.
:func:`target_view_count` is the untrained baseline (number of turns that release a
target-supported view). The ablation-aware auditor of Table 4 (``extra_selection_llr``) lives in
:mod:`fedmem.attacks.ablation_auditor`; :func:`score_audit` scores it.

The paper's encoder is all-mpnet-base-v2; fedmem uses the bundled all-MiniLM-L6-v2
(``fedmem.embeddings``), the only encoder available offline. ROC statistics come from
:mod:`fedmem.attacks.audit`; :func:`macro_auc_ci` is a pair-level bootstrap of the
seed-mean macro-AUC.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.optimize import minimize
from sklearn.linear_model import LogisticRegression

from fedmem.attacks.audit import roc_auc, tpr_at_fpr

CALIBRATIONS = ("platt", "none")
CATEGORIES = ("generic", "target", "other")
MIN_SLOPE = 1e-6  # Platt slope lower bound: positive, so the calibration never reverses a ranking


def prefix_features(turn_embeddings: np.ndarray, prefix: int) -> np.ndarray:
    """``(n, T, d)`` turn embeddings -> ``(n, d)`` L2-normalised mean of the first ``prefix``."""
    x = np.asarray(turn_embeddings, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"turn_embeddings must have shape (n, T, d). Found {x.shape}.")
    if not 1 <= prefix <= x.shape[1]:
        raise ValueError(f"prefix must be in 1..{x.shape[1]}. Found {prefix!r}.")
    m = x[:, :prefix].mean(axis=1)
    norm = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norm > 0, norm, 1.0)


def fit_platt(d, y, min_slope: float = MIN_SLOPE) -> tuple[float, float]:
    """Sigmoid calibration ``P(y=1|d) = 1 / (1 + exp(-(a d + b)))`` with ``a >= min_slope``.

    Maximum likelihood (Platt's smoothed targets) under the bound; returns ``(a, b)``.
    """
    d = np.asarray(d, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if d.shape != y.shape or d.size == 0:
        raise ValueError(f"d and y must be non-empty and of equal length. Found {d.shape} and {y.shape}.")
    if not min_slope > 0:
        raise ValueError(f"min_slope must be positive. Found {min_slope!r}.")
    n1, n0 = float(y.sum()), float(y.size - y.sum())
    t = np.where(y > 0.5, (n1 + 1) / (n1 + 2), 1 / (n0 + 2))  # Platt (1999) targets

    def loss(w):
        z = w[0] * d + w[1]
        p = 1.0 / (1.0 + np.exp(-z))
        nll = np.sum(np.logaddexp(0.0, -z) * t + np.logaddexp(0.0, z) * (1 - t))
        g = p - t
        return nll, np.array([np.sum(g * d), np.sum(g)])

    res = minimize(loss, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B",
                   bounds=[(min_slope, None), (None, None)])
    return float(res.x[0]), float(res.x[1])


class CalibratedAuditor:
    """Logistic regression on features, Platt-calibrated (slope > 0) on a validation split.

    ``calibration="none"`` returns the sigmoid of the raw decision function.
    ``clamped`` is True when the validation data asked for a non-positive slope (the
    fitted slope sits at its lower bound): the calibrated scores then carry the raw
    ranking at nearly constant probability.
    """

    def __init__(self, C: float = 1.0, calibration: str = "platt"):
        if not C > 0:
            raise ValueError(f"C must be positive. Found {C!r}.")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}. Found {calibration!r}.")
        self.C = float(C)
        self.calibration = calibration
        self.clamped = False

    def fit(self, x_train, y_train, x_val, y_val) -> "CalibratedAuditor":
        y_train = np.asarray(y_train)
        self._constant = len(set(y_train.tolist())) < 2
        self._platt = None
        if not self._constant:
            self._lr = LogisticRegression(C=self.C, max_iter=2000).fit(x_train, y_train)
            y_val = np.asarray(y_val)
            if self.calibration == "platt" and len(set(y_val.tolist())) > 1:
                self._platt = fit_platt(self._lr.decision_function(x_val), y_val)
                self.clamped = self._platt[0] <= MIN_SLOPE * (1 + 1e-6)
        return self

    def decision(self, x) -> np.ndarray:
        if self._constant:
            return np.zeros(len(x))
        return self._lr.decision_function(x)

    def predict_proba(self, x) -> np.ndarray:
        if self._constant:
            return np.full(len(x), 0.5)
        d = self._lr.decision_function(x)
        if self._platt is not None:
            a, b = self._platt
            d = a * d + b
        return 1.0 / (1.0 + np.exp(-d))


@dataclass
class AuditResult:
    prefix: int
    auc: dict  # attribute -> AUC on test pairs
    tpr5: dict  # attribute -> TPR at 5% FPR on test pairs
    pos_scores: dict = field(default_factory=dict)  # attribute -> scores of M test transcripts (pair order)
    neg_scores: dict = field(default_factory=dict)  # attribute -> scores of M' test transcripts (same order)
    clamped: int = 0  # per-attribute calibrations whose slope hit the positivity bound

    @property
    def macro_auc(self) -> float:
        return float(np.mean(list(self.auc.values())))

    @property
    def macro_tpr5(self) -> float:
        return float(np.mean(list(self.tpr5.values())))

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate([self.pos_scores[a] for a in self.auc]),
                np.concatenate([self.neg_scores[a] for a in self.auc]))


def _split_indices(attributes, splits, need=("train", "val", "test")):
    attributes = np.asarray(attributes)
    splits = np.asarray(splits)
    if attributes.shape != splits.shape:
        raise ValueError(f"attributes and splits must have equal length. Found {attributes.shape} and {splits.shape}.")
    out = {}
    for a in sorted(set(attributes.tolist())):
        sel = {s: np.nonzero((attributes == a) & (splits == s))[0] for s in need}
        if any(len(v) == 0 for v in sel.values()):
            raise ValueError(f"attribute {a!r} needs {', '.join(need)} pairs. Found sizes "
                             f"{ {k: len(v) for k, v in sel.items()} }.")
        out[a] = sel
    return out


def audit(features_m: np.ndarray, features_n: np.ndarray, attributes, splits, prefix: int,
          C: float = 1.0, calibration: str = "platt") -> AuditResult:
    """Per-attribute embedding auditors over pairs.

    ``features_m[i]`` / ``features_n[i]``: prefix features of pair i's transcripts on
    ``M`` and ``M'``; ``attributes[i]`` its target attribute; ``splits[i]`` in
    {"train", "val", "test"}.
    """
    auc, tpr, pos, neg = {}, {}, {}, {}
    clamped = 0
    for a, sel in _split_indices(attributes, splits).items():
        def xy(idx):
            return (np.concatenate([features_m[idx], features_n[idx]]),
                    np.r_[np.ones(len(idx)), np.zeros(len(idx))])

        model = CalibratedAuditor(C, calibration).fit(*xy(sel["train"]), *xy(sel["val"]))
        clamped += int(model.clamped)
        pos[a] = model.predict_proba(features_m[sel["test"]])
        neg[a] = model.predict_proba(features_n[sel["test"]])
        auc[a] = roc_auc(pos[a], neg[a])
        tpr[a] = tpr_at_fpr(pos[a], neg[a], 0.05)
    return AuditResult(prefix, auc, tpr, pos, neg, clamped)


# ------------------------------------------------------------------ released-view auditor
def view_events(policy, target: str, queries: Sequence, released: Sequence,
                fallbacks: Sequence | None = None) -> list[tuple]:
    """Per turn ``(context, category)`` from public data and the released views.

    ``released[t]``: ``(slot, view name)`` pairs released (or exhibited) at turn t;
    ``fallbacks[t]``: the observable control (a slot fell back to generic), False if None.
    Context ``(slot, hit, fallback)``: the turn's first active slot, whether its public
    read set meets ``I_target`` and the control. Category: ``"target"`` if some released
    view of the slot is supported by ``target``, else ``"other"`` if some is a specific
    view, else ``"generic"``.
    """
    group = policy.groups.get(target)
    if group is None:
        raise ValueError(f"target must be a protected attribute of the policy {list(policy.groups)}. "
                         f"Found {target!r}.")
    if len(released) > len(queries):
        raise ValueError(f"released must not be longer than queries. Found {len(released)} > {len(queries)}.")
    if fallbacks is None:
        fallbacks = [False] * len(released)
    if len(fallbacks) != len(released):
        raise ValueError(f"fallbacks must have one flag per released turn. Found {len(fallbacks)} for "
                         f"{len(released)} turns.")
    out = []
    for q, views, fb in zip(queries, released, fallbacks):
        (slot, *_) = policy.route(q)
        hit = bool(set(policy.read_set(q, slot)) & group)
        voc = policy.vocabularies[slot]
        cat = "generic"
        for s, name in views:
            if s != slot or name == voc.generic.name:
                continue
            view = voc.views[voc.index(name)]
            if target in view.supported_by:
                cat = "target"
                break
            cat = "other"
        out.append(((slot, hit, bool(fb)), cat))
    return out


def target_view_count(events: Sequence[tuple]) -> float:
    """Untrained score: number of turns whose public read set meets ``I_a`` and that
    release a target-supported view (only those turns can depend on the target group)."""
    return float(sum(cat == "target" and ctx[1] for ctx, cat in events))


class ViewLikelihoodAuditor:
    """Naive-Bayes likelihood ratio of the view categories given the public turn context.

    ``P(cat | ctx, side)`` is estimated from training transcripts with ``smoothing``
    pseudo-counts per category; the score of a transcript is the summed log ratio
    ``M`` over ``M'`` (higher = more ``M``-like). Contexts that cannot depend on the
    target (read set misses ``I_a``, or the turn fell back) get ratio 0 by construction.
    """

    def __init__(self, smoothing: float = 1.0):
        if not smoothing > 0:
            raise ValueError(f"smoothing must be positive. Found {smoothing!r}.")
        self.smoothing = float(smoothing)

    def fit(self, events_m: Sequence[Sequence[tuple]], events_n: Sequence[Sequence[tuple]]) -> "ViewLikelihoodAuditor":
        counts = {side: defaultdict(lambda: dict.fromkeys(CATEGORIES, 0.0)) for side in ("M", "M'")}
        for side, data in (("M", events_m), ("M'", events_n)):
            for transcript in data:
                for ctx, cat in transcript:
                    if cat not in CATEGORIES:
                        raise ValueError(f"category must be one of {CATEGORIES}. Found {cat!r}.")
                    counts[side][ctx][cat] += 1.0
        self._llr: dict = {}
        for ctx in set(counts["M"]) | set(counts["M'"]):
            if not self._informative(ctx):
                continue
            cm, cn = counts["M"][ctx], counts["M'"][ctx]
            tm = sum(cm.values()) + self.smoothing * len(CATEGORIES)
            tn = sum(cn.values()) + self.smoothing * len(CATEGORIES)
            self._llr[ctx] = {c: math.log((cm[c] + self.smoothing) / tm) - math.log((cn[c] + self.smoothing) / tn)
                              for c in CATEGORIES}
        return self

    @staticmethod
    def _informative(ctx) -> bool:
        """Only turns whose public read set meets ``I_a`` and that did not fall back can
        depend on the target group (Lemma 1); the others get ratio 0 instead of noise."""
        _, hit, fallback = ctx
        return hit and not fallback

    def score(self, events: Sequence[tuple]) -> float:
        return float(sum(self._llr.get(ctx, {}).get(cat, 0.0) for ctx, cat in events))


def view_audit(events_m: Sequence, events_n: Sequence, attributes, splits, prefix: int, *,
               method: str = "likelihood", smoothing: float = 1.0) -> AuditResult:
    """Per-attribute view auditors over pairs: fit on ``train`` pairs only, score ``test``.

    ``events_m[i]`` / ``events_n[i]``: :func:`view_events` of pair i's transcripts (the
    first ``prefix`` are used). ``method``: ``"likelihood"`` (trained naive-Bayes ratio)
    or ``"count"`` (untrained :func:`target_view_count`; needs only ``test`` pairs).
    """
    if method not in ("likelihood", "count"):
        raise ValueError(f"method must be 'likelihood' or 'count'. Found {method!r}.")
    if prefix < 1:
        raise ValueError(f"prefix must be >= 1. Found {prefix!r}.")
    auc, tpr, pos, neg = {}, {}, {}, {}
    need = ("train", "test") if method == "likelihood" else ("test",)
    for a, sel in _split_indices(attributes, splits, need=need).items():
        if method == "likelihood":
            model = ViewLikelihoodAuditor(smoothing).fit([events_m[i][:prefix] for i in sel["train"]],
                                                         [events_n[i][:prefix] for i in sel["train"]])
            score = model.score
        else:
            score = target_view_count
        pos[a] = np.array([score(events_m[i][:prefix]) for i in sel["test"]])
        neg[a] = np.array([score(events_n[i][:prefix]) for i in sel["test"]])
        auc[a] = roc_auc(pos[a], neg[a])
        tpr[a] = tpr_at_fpr(pos[a], neg[a], 0.05)
    return AuditResult(prefix, auc, tpr, pos, neg)


# ------------------------------------------------------------------ intervals
def macro_auc_ci(results: Sequence[AuditResult], alpha: float = 0.05, rng: np.random.Generator | None = None,
                 n_boot: int = 400) -> tuple[float, float, float]:
    """Seed-mean macro-AUC with a pair-level percentile-bootstrap ``1 - alpha`` interval
    (``scipy.stats.bootstrap``, ``method="percentile"``).

    ``results``: one :class:`AuditResult` per EM seed over the same test pairs (the
    ``i``-th positive and negative score of an attribute belong to test pair ``i``).
    Each replicate resamples test pairs within every attribute, keeps each pair's two
    transcripts and all its seeds together, and recomputes the mean over seeds of the
    macro-AUC. Returns ``(estimate, lo, hi)``.
    """
    if not results:
        raise ValueError("results must hold at least one AuditResult. Found none.")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1). Found {alpha!r}.")
    if int(n_boot) < 10:
        raise ValueError(f"n_boot must be >= 10. Found {n_boot!r}.")
    if rng is None:
        rng = np.random.default_rng(0)
    elif not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None. Found {type(rng).__name__}.")
    attrs = list(results[0].auc)
    for r in results:
        if list(r.auc) != attrs or any(len(r.pos_scores[a]) != len(results[0].pos_scores[a]) for a in attrs):
            raise ValueError("results must cover the same attributes and test pairs.")

    def stat(idx):
        return float(np.mean([np.mean([roc_auc(r.pos_scores[a][idx[a]], r.neg_scores[a][idx[a]]) for a in attrs])
                              for r in results]))

    n = {a: len(results[0].pos_scores[a]) for a in attrs}
    est = stat({a: np.arange(n[a]) for a in attrs})
    lo, hi = _stratified_bootstrap(stat, attrs, n, alpha, rng, n_boot)
    return est, lo, hi


def _stratified_bootstrap(stat, attrs, n, alpha, rng, n_boot) -> tuple[float, float]:
    """Percentile interval of ``stat`` by ``scipy.stats.bootstrap``: one sample of pair indices per
    attribute, each resampled independently (= test pairs resampled within attributes)."""
    from scipy.stats import bootstrap

    samples = tuple(np.arange(n[a]) for a in attrs)
    res = bootstrap(samples, lambda *idx: stat({a: np.asarray(i, dtype=np.int64) for a, i in zip(attrs, idx)}),
                    n_resamples=int(n_boot), vectorized=False, paired=False, method="percentile",
                    confidence_level=1 - alpha, rng=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_auc_difference(results_a: Sequence[AuditResult], results_b: Sequence[AuditResult], alpha: float = 0.05,
                          rng: np.random.Generator | None = None, n_boot: int = 400) -> tuple[float, float, float]:
    """Seed-mean macro-AUC of ``a`` minus that of ``b`` on the same test pairs, with a
    pair-level bootstrap interval (the same resampled pairs for both). ``(diff, lo, hi)``."""
    if not results_a or not results_b:
        raise ValueError("results_a and results_b must each hold at least one AuditResult.")
    if rng is None:
        rng = np.random.default_rng(0)
    elif not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None. Found {type(rng).__name__}.")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1). Found {alpha!r}.")
    attrs = list(results_a[0].auc)
    n = {a: len(results_a[0].pos_scores[a]) for a in attrs}
    for r in (*results_a, *results_b):
        if list(r.auc) != attrs or any(len(r.pos_scores[a]) != n[a] for a in attrs):
            raise ValueError("results_a and results_b must cover the same attributes and test pairs.")

    def stat(rs, idx):
        return np.mean([np.mean([roc_auc(r.pos_scores[a][idx[a]], r.neg_scores[a][idx[a]]) for a in attrs])
                        for r in rs])

    full = {a: np.arange(n[a]) for a in attrs}
    est = float(stat(results_a, full) - stat(results_b, full))
    lo, hi = _stratified_bootstrap(lambda idx: stat(results_a, idx) - stat(results_b, idx), attrs, n, alpha, rng,
                                   n_boot)
    return est, lo, hi


def score_audit(scores_m: Sequence[Sequence[float]], scores_n: Sequence[Sequence[float]], attributes, splits,
                prefix: int) -> AuditResult:
    """Per-attribute AuditResult of an untrained per-turn score (summed over the first
    ``prefix`` turns) on the ``test`` pairs, e.g. :func:`extra_selection_llr`."""
    if prefix < 1:
        raise ValueError(f"prefix must be >= 1. Found {prefix!r}.")
    auc, tpr, pos, neg = {}, {}, {}, {}
    for a, sel in _split_indices(attributes, splits, need=("test",)).items():
        pos[a] = np.array([float(np.sum(scores_m[i][:prefix])) for i in sel["test"]])
        neg[a] = np.array([float(np.sum(scores_n[i][:prefix])) for i in sel["test"]])
        auc[a] = roc_auc(pos[a], neg[a])
        tpr[a] = tpr_at_fpr(pos[a], neg[a], 0.05)
    return AuditResult(prefix, auc, tpr, pos, neg)
