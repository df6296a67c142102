"""Embedding auditor of DP-MemView transcripts (paper, Appendix C.5).

For each transcript prefix of length T: embed every assistant response with a frozen
sentence encoder, average the T turn embeddings and L2-normalise. For each protected
attribute and prefix length a separate logistic regression distinguishes transcripts
from ``M`` (label 1) and ``M'`` (label 0): fitted on training pairs, sigmoid (Platt)
calibrated on validation pairs, evaluated on held-out test pairs. Reported: macro-AUC
over attributes and TPR at 5% FPR (macro over attributes, and pooled).

The paper's encoder is all-mpnet-base-v2; fedmem uses the bundled all-MiniLM-L6-v2
(``fedmem.embeddings``), the only encoder available offline. ROC statistics come from
:mod:`fedmem.attacks.audit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.linear_model import LogisticRegression

from fedmem.attacks.audit import roc_auc, tpr_at_fpr


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


class CalibratedAuditor:
    """Logistic regression on features, Platt-calibrated on a validation split."""

    def __init__(self, C: float = 1.0):
        if C <= 0:
            raise ValueError(f"C must be positive. Found {C!r}.")
        self.C = float(C)

    def fit(self, x_train, y_train, x_val, y_val) -> "CalibratedAuditor":
        y_train = np.asarray(y_train)
        self._constant = len(set(y_train.tolist())) < 2
        if not self._constant:
            self._lr = LogisticRegression(C=self.C, max_iter=2000).fit(x_train, y_train)
            d = self._lr.decision_function(x_val).reshape(-1, 1)
            y_val = np.asarray(y_val)
            self._platt = LogisticRegression(C=1e6, max_iter=2000).fit(d, y_val) if len(set(y_val.tolist())) > 1 \
                else None
        return self

    def predict_proba(self, x) -> np.ndarray:
        if self._constant:
            return np.full(len(x), 0.5)
        d = self._lr.decision_function(x).reshape(-1, 1)
        if self._platt is None:
            return 1.0 / (1.0 + np.exp(-d[:, 0]))
        return self._platt.predict_proba(d)[:, 1]


@dataclass
class AuditResult:
    prefix: int
    auc: dict  # attribute -> AUC on test pairs
    tpr5: dict  # attribute -> TPR at 5% FPR on test pairs
    pos_scores: dict = field(default_factory=dict)  # attribute -> calibrated scores of M test transcripts
    neg_scores: dict = field(default_factory=dict)

    @property
    def macro_auc(self) -> float:
        return float(np.mean(list(self.auc.values())))

    @property
    def macro_tpr5(self) -> float:
        return float(np.mean(list(self.tpr5.values())))

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate([self.pos_scores[a] for a in self.auc]),
                np.concatenate([self.neg_scores[a] for a in self.auc]))


def audit(features_m: np.ndarray, features_n: np.ndarray, attributes, splits, prefix: int,
          C: float = 1.0) -> AuditResult:
    """Per-attribute auditors over pairs.

    ``features_m[i]`` / ``features_n[i]``: prefix features of pair i's transcripts on
    ``M`` and ``M'``; ``attributes[i]`` its target attribute; ``splits[i]`` in
    {"train", "val", "test"}.
    """
    attributes = np.asarray(attributes)
    splits = np.asarray(splits)
    auc, tpr, pos, neg = {}, {}, {}, {}
    for a in sorted(set(attributes.tolist())):
        sel = {s: np.nonzero((attributes == a) & (splits == s))[0] for s in ("train", "val", "test")}
        if any(len(v) == 0 for v in sel.values()):
            raise ValueError(f"attribute {a!r} needs train, val and test pairs. Found sizes "
                             f"{ {k: len(v) for k, v in sel.items()} }.")

        def xy(idx):
            return (np.concatenate([features_m[idx], features_n[idx]]),
                    np.r_[np.ones(len(idx)), np.zeros(len(idx))])

        model = CalibratedAuditor(C).fit(*xy(sel["train"]), *xy(sel["val"]))
        pos[a] = model.predict_proba(features_m[sel["test"]])
        neg[a] = model.predict_proba(features_n[sel["test"]])
        auc[a] = roc_auc(pos[a], neg[a])
        tpr[a] = tpr_at_fpr(pos[a], neg[a], 0.05)
    return AuditResult(prefix, auc, tpr, pos, neg)
