"""Support-channel attacks on federated DP retrieval (papers/003, "What Was Observed").

The attacks are pure numpy over what a client sees (:class:`fedmem.federation.engine.
Response`: the noised ``value``, the released ``count`` and ``receipts``) and, for
evaluation only, the engine's ``Truth``. Nothing here talks to the engine, so every
function can be tested on synthetic responses.

Attacks:

(a) **Cardinality reconstruction.** papers/003 reconstructed the contributing-set size
    "using only the count of non-zero secure-tally receipts":
    ``n_hat = #{s : receipt_s > tau}`` (:func:`cardinality_from_receipts`; ``tau = 0.5``
    is exact for integer receipts and the midpoint decision for noised ones). Without
    receipts the adversary falls back to the released count
    (:func:`cardinality_from_count`) or, when the noise was
    calibrated to the realized set, to the noise scale itself
    (:func:`cardinality_from_noise_scale`: ``E||r||^2 = ||mean||^2 + d * std(n)^2``).
(b) **Cardinality differencing** membership inference (papers/003, consequence 1):
    the score of a candidate record is the receipt difference between a query aimed at
    the record and a control query (:func:`differencing_score`).
(c) **Noise-scale exploitation** under ``global`` calibration (consequence 2): the
    released mean over ``n`` contributors moves by ``v/n`` when the target value ``v``
    is present, while the noise was calibrated for ``n_bound``; the score is the
    projection ``<r, v>/||v||`` (:func:`value_score`), and :func:`effective_epsilon`
    gives the epsilon one query really has at its realized ``n``.
(d) **Silent retries**: averaging ``r`` releases of one query divides the noise
    variance by ``r`` (:func:`average_releases`); the experiment shows the booked
    epsilon has to grow with ``r``.

Every metric goes through :mod:`fedmem.attacks.audit` (AUC, bootstrap CI, TPR at low
FPR, Clopper-Pearson epsilon lower bounds, the DP ROC ceiling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.attacks import audit

REJECTED_SCORE = -1.0e6
"""Score an adversary records when the gateway refused the query.

A rejection is itself an observation: if it depended on membership the score would
separate the worlds, and the audit would see it. The value is finite (the audit rejects
non-finite scores) and below every real score.
"""


# ------------------------------------------------------------------ (a) cardinality
def true_cardinality(truth) -> int:
    """Number of contributing shards in an engine ``Truth`` (bool mask or id list)."""
    c = np.asarray(truth.contributing)
    if c.dtype == bool:
        return int(c.sum())
    return int(np.unique(c).size)


def cardinality_from_receipts(receipts, threshold: float = 0.5) -> int:
    """papers/003: ``n_hat = #{s : receipt_s > threshold}``, the count of non-zero receipts.

    Exact for integer receipts; for noised receipts ``threshold = 0.5`` decides each
    shard by the midpoint between "no record selected" (0) and "one record" (1).
    """
    r = V.finite_array("receipts", receipts, ndim=1)
    threshold = V.finite("threshold", threshold)
    return int(np.count_nonzero(r > threshold))


COUNT_MODELS = ("clustered", "uniform")


def cardinality_from_count(count: float, shards: int, k_local: int, model: str = "clustered") -> float:
    """Estimate contributing shards from a selected-candidate count ``c``.

    ``clustered`` (default): memories are topical, so a shard that holds the queried topic
    usually fills all ``k_local`` of its slots: ``ceil(c / k_local)``. ``uniform``: the
    occupancy estimate ``S (1 - (1 - 1/S)^c)`` for candidates spread uniformly over the
    shards. Both are clamped to the feasible range ``[ceil(c / k_local), min(c, S)]``.
    """
    shards = V.positive_int("shards", shards)
    k_local = V.positive_int("k_local", k_local)
    if model not in COUNT_MODELS:
        raise ValueError(f"model must be one of {COUNT_MODELS}. Found {model!r}.")
    c = max(0.0, V.finite("count", count))
    if c == 0:
        return 0.0
    lo = math.ceil(min(c, shards * k_local) / k_local)
    est = lo if model == "clustered" else shards * (1.0 - (1.0 - 1.0 / shards) ** c)
    return float(min(max(est, lo), min(c, shards)))


def cardinality_from_noise_scale(value, noise_std_of_n: Callable[[int], float], n_max: int,
                                 signal_sq: float = 0.25) -> int:
    """Infer ``n`` from the size of the noise when it was calibrated to the realized set.

    A released mean ``r = mean + N(0, std(n)^2 I_d)`` has ``E||r||^2 = ||mean||^2 +
    d std(n)^2``. The adversary knows the public mechanism ``std(n)`` and a rough prior
    ``signal_sq`` for ``||mean||^2`` (at most ``clip^2``), and returns the ``n`` in
    ``1..n_max`` whose predicted ``||r||^2`` is closest on a log scale. Under ``global``
    calibration ``std`` does not depend on ``n`` and this carries no information.
    """
    r = V.finite_array("value", value, ndim=1)
    n_max = V.positive_int("n_max", n_max)
    signal_sq = V.nonnegative("signal_sq", signal_sq)
    d = r.size
    obs = float(r @ r)
    ns = np.arange(1, n_max + 1)
    pred = np.array([signal_sq + d * float(noise_std_of_n(int(n))) ** 2 for n in ns])
    return int(ns[np.argmin(np.abs(np.log(obs + 1e-300) - np.log(pred + 1e-300)))])


def reconstruct_count(response, *, shards: int, k_local: int,
                      noise_std_of_n: Callable[[int], float] | None = None, signal_sq: float = 0.25) -> float:
    """Estimate of the selected *record* count n (the n that calibration is about).

    The sum of the receipts, else the released count, else the noise scale
    (:func:`cardinality_from_noise_scale` with the adversary's ``signal_sq`` prior), else
    ``nan``.
    """
    if response.receipts is not None:
        return float(np.sum(np.asarray(response.receipts, dtype=np.float64)))
    if response.count is not None:
        return float(response.count)
    if noise_std_of_n is not None:
        return float(cardinality_from_noise_scale(response.value, noise_std_of_n, shards * k_local, signal_sq))
    return float("nan")


def reconstruct_cardinality(response, *, shards: int, k_local: int,
                            noise_std_of_n: Callable[[int], float] | None = None,
                            signal_sq: float = 0.25) -> tuple[float, str]:
    """Best available estimate of the contributing-set size from one response.

    Receipts first (papers/003's channel), then the released count (clustered model of
    :func:`cardinality_from_count`), then the noise scale
    (only when ``noise_std_of_n`` is given, i.e. the adversary knows the noise tracks the
    selected count n: the count is inferred in ``1..shards*k_local`` and turned into
    shards by :func:`cardinality_from_count`), else ``nan`` (the response carries no
    support information the adversary can use). Returns ``(estimate, channel used)``.
    """
    if response.receipts is not None:
        return float(cardinality_from_receipts(response.receipts)), "receipts"
    if response.count is not None:
        return cardinality_from_count(response.count, shards, k_local), "count"
    if noise_std_of_n is not None:
        n_hat = cardinality_from_noise_scale(response.value, noise_std_of_n, shards * k_local, signal_sq)
        return cardinality_from_count(n_hat, shards, k_local), "noise-scale"
    return float("nan"), "none"


@dataclass(frozen=True)
class ReconstructionReport:
    queries: int               # queries scored (rejected ones count as misses)
    within: int                # |n_hat - n| <= tolerance
    rate: float
    ci: tuple[float, float]    # Clopper-Pearson CI of rate
    mae: float
    chance_rate: float         # best constant guess (chosen with hindsight of the truths)
    chance_ci: tuple[float, float]
    at_chance: bool            # rate's CI overlaps the constant guess's CI

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def reconstruction_report(estimates: Sequence[float], truths: Sequence[int], tolerance: int = 2,
                          alpha: float = 0.05, rel_tolerance: float = 0.0) -> ReconstructionReport:
    """Share of queries whose reconstructed cardinality is within ``tolerance`` of the truth.

    A hit is ``|n_hat - n| <= max(tolerance, rel_tolerance * n)``; ``nan`` estimates (no
    support channel) count as misses. The chance baseline is the
    best *constant* guess, picked with hindsight over the observed truths, so "at
    chance" is a conservative statement: the responses helped no more than knowing the
    distribution of n in advance.
    """
    est = np.asarray(estimates, dtype=np.float64)
    tru = np.asarray(truths, dtype=np.float64)
    if est.shape != tru.shape or est.ndim != 1 or est.size == 0:
        raise ValueError(f"estimates and truths must be equal-length non-empty 1-d. Found {est.shape}, {tru.shape}.")
    tolerance = int(V.nonnegative("tolerance", tolerance))
    tol = np.maximum(tolerance, V.nonnegative("rel_tolerance", rel_tolerance) * tru)
    hit = np.abs(est - tru) <= tol  # nan -> False
    k = int(hit.sum())
    n = est.size
    best = max(int(np.sum(np.abs(tru - c) <= tol)) for c in np.unique(tru))
    ci = audit.clopper_pearson(k, n, alpha)
    cci = audit.clopper_pearson(best, n, alpha)
    finite = np.isfinite(est)
    mae = float(np.mean(np.abs(est[finite] - tru[finite]))) if finite.any() else float("nan")
    return ReconstructionReport(n, k, k / n, ci, mae, best / n, cci, ci[0] <= cci[1])


# --------------------------------------------------------------- (b), (c) scores
def differencing_score(target, control, shard: int | None = None) -> float:
    """Cardinality-differencing score of one candidate record (papers/003, consequence 1).

    ``target`` answers a query aimed at the record; ``control`` is the baseline it is
    compared with (in the experiment: the same query answered by the neighbouring
    dataset without the record, the adversary's knowledge in the DP game; or a nearby
    query that misses the record). Either may be ``None`` (rejected). With receipts and a known ``shard``, the score
    is ``receipt_shard(target) - receipt_shard(control)``; with receipts only, the
    difference of reconstructed cardinalities; with a count only, the count difference.
    A rejected target scores :data:`REJECTED_SCORE`; no support channel scores 0.
    """
    if target is None:
        return REJECTED_SCORE

    def support(resp) -> float:
        if resp is None:
            return 0.0
        if resp.receipts is not None:
            r = np.asarray(resp.receipts, dtype=np.float64)
            if shard is not None:
                return float(r[shard])
            return float(cardinality_from_receipts(r))
        if resp.count is not None:
            return float(resp.count)
        return 0.0

    return support(target) - support(control)


def value_score(response, target_value) -> float:
    """Value-channel score ``<r, v> / ||v||`` (noise-scale exploitation, attack (c)).

    The released mean contains ``v / n`` when the record was selected; the noise has
    standard deviation ``std`` per coordinate, so the score's signal-to-noise ratio is
    ``||v|| / (n std)``: large exactly when ``n`` is small and ``std`` was calibrated for
    ``n_bound > n``. A rejected response scores :data:`REJECTED_SCORE`.
    """
    if response is None:
        return REJECTED_SCORE
    v = V.finite_array("target_value", target_value, ndim=1)
    norm = float(np.linalg.norm(v))
    if norm == 0:
        raise ValueError("target_value must be non-zero. Found the zero vector.")
    r = V.finite_array("value", response.value, ndim=1, dim=v.size)
    return float(r @ v) / norm


def average_releases(values: Sequence[np.ndarray]) -> np.ndarray:
    """Attack (d): the mean of ``r`` releases of one query has noise variance ``std^2/r``."""
    if len(values) == 0:
        raise ValueError("values must contain at least one release. Found none.")
    return np.mean(np.stack([V.finite_array("value", v, ndim=1) for v in values]), axis=0)


def effective_epsilon(sigma: float, n_realized: int, n_calibrated: int, delta: float) -> float:
    """Epsilon one Gaussian mean release really has when calibrated for the wrong ``n``.

    The mean's sensitivity is ``C/n_realized`` but the noise is ``sigma * C /
    n_calibrated``, so the true noise multiplier is ``sigma * n_realized /
    n_calibrated`` (papers/003, "Noise-scale mismatch"): the aggregator's
    :func:`~fedmem.federation.aggregator.delivered_epsilon` at that multiplier.
    """
    from fedmem.federation.aggregator import delivered_epsilon  # lazy: loads dp_accounting (~280 ms)

    sigma = V.positive("sigma", sigma)
    n_realized = V.positive_int("n_realized", n_realized)
    n_calibrated = V.positive_int("n_calibrated", n_calibrated)
    return delivered_epsilon("gaussian", sigma * n_realized / n_calibrated, delta)


# ----------------------------------------------------------------- membership audit
@dataclass(frozen=True)
class MembershipReport:
    n_pos: int
    n_neg: int
    auc: float
    auc_ci: tuple[float, float]
    tpr_at_1: float
    tpr_at_5: float
    eps_lower: float           # Clopper-Pearson lower bound, threshold chosen on a held-out half
    threshold: float
    ceiling_violations: int    # ROC points provably above the ceiling of `epsilon_claim`
    epsilon_claim: float       # booked epsilon the ceiling was drawn for (inf: no ceiling)
    success_rate: float        # balanced accuracy of the held-out threshold test

    def as_dict(self) -> dict:
        return dict(self.__dict__)


MAX_THRESHOLDS = 64
"""Candidate thresholds examined per test (score quantiles): keeps the audit fast and the
Bonferroni correction of :func:`ceiling_violations` mild."""


def _candidate_thresholds(scores: np.ndarray) -> np.ndarray:
    ts = np.unique(scores)
    if ts.size > MAX_THRESHOLDS:
        ts = np.unique(np.quantile(scores, np.linspace(0.0, 1.0, MAX_THRESHOLDS), method="lower"))
    return ts


def _best_threshold(pos: np.ndarray, neg: np.ndarray, delta: float, alpha: float) -> float:
    """Threshold maximising the epsilon lower bound of ``score >= t`` on a selection sample."""
    best_t, best_e = float(np.max(np.r_[pos, neg])) + 1.0, -1.0
    for t in _candidate_thresholds(np.r_[pos, neg]):
        tp, fp = int(np.sum(pos >= t)), int(np.sum(neg >= t))
        e = audit.epsilon_lower_bound(tp, pos.size, fp, neg.size, delta, alpha)
        if e > best_e:
            best_t, best_e = float(t), e
    return best_t


def ceiling_violations(pos, neg, epsilon: float, delta: float, alpha: float = 0.05) -> int:
    """Number of empirical ROC thresholds provably above the (epsilon, delta) DP ceiling.

    For each candidate threshold ``t`` (at most :data:`MAX_THRESHOLDS` score quantiles), the one-sided Clopper-Pearson lower bound of its TPR is
    compared with ``dp_roc_ceiling`` evaluated at the upper bound of its FPR; a point
    counts only if it is above even then (Bonferroni over thresholds). An
    (epsilon, delta)-DP mechanism produces none except with probability ``alpha``.
    """
    p = V.finite_array("pos", pos, ndim=1)
    n = V.finite_array("neg", neg, ndim=1)
    if not math.isfinite(epsilon):
        return 0
    ts = _candidate_thresholds(np.r_[p, n])
    level = alpha / max(1, ts.size)
    bad = 0
    for t in ts:
        tp, fp = int(np.sum(p >= t)), int(np.sum(n >= t))
        tpr_lo, _ = audit.clopper_pearson(tp, p.size, level)
        _, fpr_hi = audit.clopper_pearson(fp, n.size, level)
        if tpr_lo > audit.dp_roc_ceiling(fpr_hi, epsilon, delta) + 1e-12:
            bad += 1
    return bad


def membership_report(pos, neg, *, delta: float, rng: np.random.Generator, epsilon_claim: float = math.inf,
                      alpha: float = 0.05, n_boot: int = 400) -> MembershipReport:
    """AUC (+ bootstrap CI), TPR at 1%/5% FPR, and an honest empirical epsilon lower bound.

    The lower bound splits both samples in half at random: the threshold is chosen on
    one half (:func:`_best_threshold`) and the Clopper-Pearson bound
    (:func:`fedmem.attacks.audit.epsilon_lower_bound`, confidence ``1 - alpha``) is
    computed on the other, so selecting the threshold does not inflate the bound.
    """
    p = V.finite_array("pos", pos, ndim=1)
    n = V.finite_array("neg", neg, ndim=1)
    delta = V.open_unit("delta", delta)
    V.rng_check("rng", rng)
    if p.size < 4 or n.size < 4:
        raise ValueError(f"membership_report needs at least 4 scores per world. Found {p.size} and {n.size}.")
    auc = audit.roc_auc(p, n)
    ci = audit.auc_ci(p, n, alpha=alpha, rng=rng, n_boot=n_boot)
    ip, ineg = rng.permutation(p.size), rng.permutation(n.size)
    sp, ep = p[ip[: p.size // 2]], p[ip[p.size // 2:]]
    sn, en = n[ineg[: n.size // 2]], n[ineg[n.size // 2:]]
    t = _best_threshold(sp, sn, delta, alpha)
    tp, fp = int(np.sum(ep >= t)), int(np.sum(en >= t))
    eps_lo = audit.epsilon_lower_bound(tp, ep.size, fp, en.size, delta, alpha)
    success = 0.5 * (tp / ep.size + 1 - fp / en.size)
    viol = ceiling_violations(p, n, epsilon_claim, delta, alpha)
    return MembershipReport(p.size, n.size, auc, ci, audit.tpr_at_fpr(p, n, 0.01), audit.tpr_at_fpr(p, n, 0.05),
                            eps_lo, t, viol, float(epsilon_claim), success)
