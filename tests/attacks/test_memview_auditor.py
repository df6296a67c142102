"""Auditors of DP-MemView transcripts: calibration, released-view auditors, intervals and
the Table 4 claim that removing a safeguard leaks measurably more (paper 000, RQ2)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from fedmem.agent.memview.baselines import run_method
from fedmem.agent.memview.scorer import PaperScorer, PhraseLexicon
from fedmem.attacks.ablation_auditor import extra_selection_llr
from fedmem.attacks.memview_auditor import (AuditResult, CalibratedAuditor, ViewLikelihoodAuditor,
                                            fit_platt, score_audit,
                                            macro_auc_ci, paired_auc_difference, target_view_count, view_audit,
                                            view_events)
from fedmem.experiments import pairedmem as pm

SCORER = PaperScorer(PhraseLexicon(pm.LEXICON))


class _NoText:
    """The view auditors read released views only; no response text is needed."""

    def respond(self, messages):
        return ""


# ------------------------------------------------------------------ calibration
def test_platt_slope_is_positive_even_when_validation_reverses_the_ranking():
    d = np.linspace(-2, 2, 40)
    y = (d < 0).astype(float)  # validation says: higher score = label 0
    a, b = fit_platt(d, y)
    assert a > 0
    free = fit_platt(d, 1 - y)  # the same data in the usual direction fits a large slope
    assert free[0] > 1.0
    with pytest.raises(ValueError, match="min_slope"):
        fit_platt(d, y, min_slope=0.0)
    with pytest.raises(ValueError, match="d and y"):
        fit_platt([], [])


def test_calibrated_auc_equals_raw_auc_when_validation_is_adversarial():
    """The old unconstrained Platt fit flipped rankings (calibrated 0.43 vs raw 0.50 in
    Table 4); a positive slope keeps the raw ranking. The companion (a negative slope,
    what an unconstrained fit returns here) is caught by the same comparison."""
    rng = np.random.default_rng(1)
    n, d = 60, 8
    w = np.zeros(d)
    w[0] = 1.5
    x_tr = rng.normal(size=(2 * n, d)) + np.r_[np.ones(n), np.zeros(n)][:, None] * w
    y_tr = np.r_[np.ones(n), np.zeros(n)]
    x_val = rng.normal(size=(2 * n, d)) - np.r_[np.ones(n), np.zeros(n)][:, None] * w  # reversed on validation
    x_te = rng.normal(size=(2 * n, d)) + np.r_[np.ones(n), np.zeros(n)][:, None] * w
    from fedmem.attacks.audit import roc_auc

    model = CalibratedAuditor().fit(x_tr, y_tr, x_val, y_tr)
    assert model.clamped
    raw = model.decision(x_te)
    cal = model.predict_proba(x_te)
    auc_raw, auc_cal = roc_auc(raw[:n], raw[n:]), roc_auc(cal[:n], cal[n:])
    assert auc_raw > 0.7 and auc_cal == pytest.approx(auc_raw)
    # companion: the former unconstrained Platt fit on the same validation data
    from sklearn.linear_model import LogisticRegression

    old = LogisticRegression(C=1e6, max_iter=2000).fit(model.decision(x_val).reshape(-1, 1), y_tr)
    assert old.coef_[0, 0] < 0
    flipped = old.predict_proba(raw.reshape(-1, 1))[:, 1]
    assert roc_auc(flipped[:n], flipped[n:]) == pytest.approx(1 - auc_raw)
    with pytest.raises(ValueError, match="calibration"):
        CalibratedAuditor(calibration="isotonic")
    with pytest.raises(ValueError, match="C must"):
        CalibratedAuditor(C=0)


# ------------------------------------------------------------------ view auditors
@functools.lru_cache(maxsize=1)
def _small_pairs():
    return pm.generate(16, np.random.default_rng(11), turns=16)


def test_view_events_read_public_context_and_reject_bad_input():
    p = _small_pairs()[0]
    tr = run_method("CappedArgmax", p, "M", _NoText(), turns=16, cap=2.0, K=3, scorer=SCORER,
                    rng=np.random.default_rng(0))
    ev = view_events(p.policy, p.target, p.queries, tr.views, tr.fallbacks)
    assert len(ev) == 16
    ia = p.policy.groups[p.target]
    for (ctx, cat), turn, views in zip(ev, p.turns, tr.views):
        slot, hit, _ = ctx
        assert hit == bool(set(p.policy.read_set(turn.query, slot)) & ia) == (turn.qtype == "target")
        names = {v for _, v in views}
        assert (cat == "target") == bool(names & pm.target_views(p, slot))
    assert target_view_count(ev) == sum(cat == "target" and ctx[1] for ctx, cat in ev)
    with pytest.raises(ValueError, match="target"):
        view_events(p.policy, "vegetarian", p.queries, tr.views)
    with pytest.raises(ValueError, match="fallbacks"):
        view_events(p.policy, p.target, p.queries, tr.views, [False])
    with pytest.raises(ValueError, match="smoothing"):
        ViewLikelihoodAuditor(smoothing=0)
    with pytest.raises(ValueError, match="method"):
        view_audit([ev], [ev], ["a"], ["test"], 16, method="oracle")


def test_view_likelihood_auditor_learns_direction_from_training_only():
    hit = ("food", True, False)
    miss = ("food", False, False)
    m_train = [[(hit, "target"), (hit, "target"), (miss, "other")]] * 5
    n_train = [[(hit, "generic"), (hit, "other"), (miss, "other")]] * 5
    model = ViewLikelihoodAuditor().fit(m_train, n_train)
    assert model.score([(hit, "target")]) > 0 > model.score([(hit, "generic")])
    assert model.score([(miss, "target")]) == 0.0  # a context that cannot depend on I_a carries no ratio
    assert model.score([(("work", True, False), "target")]) == 0.0  # unseen context


# ------------------------------------------------------------------ intervals
def _result(pos, neg):
    from fedmem.attacks.audit import roc_auc, tpr_at_fpr

    return AuditResult(16, {"a": roc_auc(pos, neg)}, {"a": tpr_at_fpr(pos, neg, 0.05)}, {"a": np.asarray(pos)},
                       {"a": np.asarray(neg)})


def test_macro_auc_ci_covers_half_for_noise_and_excludes_it_for_signal():
    rng = np.random.default_rng(4)
    noise = _result(rng.normal(size=200), rng.normal(size=200))
    est, lo, hi = macro_auc_ci([noise], rng=np.random.default_rng(0), n_boot=200)
    assert lo < 0.5 < hi and lo <= est <= hi
    signal = _result(rng.normal(size=200) + 0.5, rng.normal(size=200))
    est, lo, hi = macro_auc_ci([signal], rng=np.random.default_rng(0), n_boot=200)
    assert lo > 0.5
    d, dlo, dhi = paired_auc_difference([signal], [noise], rng=np.random.default_rng(0), n_boot=200)
    assert dlo > 0 and dlo <= d <= dhi
    with pytest.raises(ValueError, match="n_boot"):
        macro_auc_ci([noise], n_boot=5)
    with pytest.raises(ValueError, match="alpha"):
        macro_auc_ci([noise], alpha=1.0)
    with pytest.raises(TypeError, match="rng"):
        macro_auc_ci([noise], rng=3)
    with pytest.raises(ValueError, match="same attributes"):
        paired_auc_difference([signal], [_result(np.zeros(3), np.zeros(3))])


# ------------------------------------------------------------------ Table 4: ablations leak more
# The check runs at B_a=8, K=3 (eps 2.67 per release) on 160 pairs, T=16, where the extra
# releases carry enough signal for a test of seconds; Table 4 itself (B_a=2) is measured
# in docs/memview.md. NoCap releases an EM view on every target turn (8 instead of 3 at
# T=16); CappedArgmax releases the top-scoring view. IncompleteCharge is not in this
# check: its extra releases (~1.5 per 16 turns, on job_loss/pregnancy pairs only) mostly
# fall on views shared with the uncharged partner attribute, and its AUC gain over the
# compliant interface was +0.004 [-0.040, 0.054] on 320 job_loss/pregnancy pairs at T=32
# (+0.054 [0.001, 0.097] on 320 pregnancy pairs, 19 s): not measurable in a fast test.
# Size: 160 pairs (was 320). Measured (fixed seeds, n_boot 300): at 320 pairs NoCap - compliant
# = 0.123 [0.083, 0.163] (bootstrap SE 0.021), CappedArgmax 0.254 [0.223, 0.293], the compliant
# interface against itself -0.038 [-0.087, 0.009]; at 160 pairs (SE ~0.036) NoCap 0.144 [0.080,
# 0.223], CappedArgmax 0.309 [0.264, 0.367], compliant 0.043 [-0.024, 0.121]. Level: a compliant
# variant is flagged with probability 0.025 (one-sided 95% interval); power at 160 pairs against
# NoCap's effect 0.123: P(Z > 1.96 - 0.123/0.036) ~ 0.93, against CappedArgmax's ~1.
# (Measured by setting LEAK_PAIRS and calling _leaks_more_than_compliant on each variant: 67 s vs
# 107 s wall for the three, under load ~17 on 2 shared cores.)
LEAK_PAIRS, LEAK_CAP, LEAK_K, LEAK_T = 160, 8.0, 3, 16


@functools.lru_cache(maxsize=1)
def _leak_pairs():
    return pm.generate(LEAK_PAIRS, np.random.default_rng(2026), turns=LEAK_T)


@functools.lru_cache(maxsize=4)
def _count_audit(method: str, seed: int) -> AuditResult:
    pairs = _leak_pairs()
    ev = {"M": [], "M'": []}
    for p in pairs:
        for side in ev:
            tr = run_method(method, p, side, _NoText(), turns=LEAK_T, cap=LEAK_CAP, K=LEAK_K, scorer=SCORER,
                            rng=np.random.default_rng([seed, p.index, side == "M"]))
            ev[side].append(view_events(p.policy, p.target, p.queries[:LEAK_T], tr.views, tr.fallbacks))
    # the count auditor is untrained, so every pair is a test pair
    return view_audit(ev["M"], ev["M'"], [p.target for p in pairs], ["test"] * len(pairs), LEAK_T, method="count")


def _leaks_more_than_compliant(variant: str) -> tuple[bool, tuple]:
    """Same check for every variant: the 95% pair-bootstrap interval of the macro-AUC
    difference AUC(variant) - AUC(compliant) lies above 0 (independent EM seeds)."""
    ref = _count_audit("DP-MemView (on)", 0)
    res = _count_audit(variant, 1)
    d = paired_auc_difference([res], [ref], rng=np.random.default_rng(0), n_boot=300)
    return d[1] > 0, d


@pytest.mark.parametrize("variant, leaks", [
    ("NoCap", True),
    ("CappedArgmax", True),
    ("DP-MemView (on)", False),  # the ablation made compliant: same check, other EM seed
])
def test_ablations_leak_measurably_more_than_the_compliant_interface(variant, leaks):
    detected, (d, lo, hi) = _leaks_more_than_compliant(variant)
    assert detected == leaks, f"{variant}: AUC difference {d:.3f} [{lo:.3f}, {hi:.3f}]"


# ------------------------------------------------------------------ Table 4: the ablation-aware auditor
# At Table 4's own setting (B_a=2, K=3, T=16): the exact EM log-ratio of the selections
# released past the target's pathwise complete-charging cap (extra_selection_llr). 96 pairs,
# one seed: enough to check the compliant interface releases none and NoCap does.
T4_CAP, T4_K, T4_T, T4_PAIRS = 2.0, 3, 16, 96


@functools.lru_cache(maxsize=1)
def _t4_pairs():
    return pm.generate(T4_PAIRS, np.random.default_rng(2026), turns=T4_T)


@functools.lru_cache(maxsize=4)
def _extra_audit(method: str, seed: int) -> AuditResult:
    from fedmem.agent.memview.interface import _share

    pairs = _t4_pairs()
    sc = {"M": [], "M'": []}
    for p in pairs:
        for side in sc:
            tr = run_method(method, p, side, _NoText(), turns=T4_T, cap=T4_CAP, K=T4_K, scorer=SCORER,
                            rng=np.random.default_rng([seed, p.index, side == "M"]))
            sc[side].append(extra_selection_llr(p.policy, p.target, p.queries[:T4_T], tr.views, tr.fallbacks,
                                                p.stores["M"].items, p.stores["M'"].items, SCORER,
                                                eps=_share(T4_CAP, T4_K), cap=T4_CAP))
    return score_audit(sc["M"], sc["M'"], [p.target for p in pairs], ["test"] * len(pairs), T4_T)


@pytest.mark.parametrize("variant, past_cap", [
    ("DP-MemView (on)", False),
    ("NoCap", True),  # companion: the same check fires on an interface without the cap check
])
def test_ablation_aware_auditor_finds_no_selection_past_the_cap_of_the_compliant_interface(variant, past_cap):
    """The ablation-aware auditor scores only selections past the target's pathwise cap:
    on the compliant interface every score is 0 (AUC exactly 0.5, never separated); on NoCap
    the same check finds them. Separation of the ablations themselves is measured by the
    memview.table4 scenario (docs/memview.md): at B_a=2 a 96-pair, one-seed test has no power."""
    res = _extra_audit(variant, 1)
    found = any(np.any(s) for s in (*res.pos_scores.values(), *res.neg_scores.values()))
    assert found == past_cap
    if not past_cap:
        ref = _extra_audit("DP-MemView (on)", 0)
        d, lo, hi = paired_auc_difference([res], [ref], rng=np.random.default_rng(0), n_boot=50)
        assert res.macro_auc == 0.5 and not lo > 0


def test_extra_selection_llr_rejects_bad_input():
    p = _small_pairs()[0]
    tr = run_method("NoCap", p, "M", _NoText(), turns=16, cap=2.0, K=3, scorer=SCORER,
                    rng=np.random.default_rng(0))
    args = (p.policy, p.target, p.queries, tr.views, tr.fallbacks, p.stores["M"].items, p.stores["M'"].items,
            SCORER)
    llr = extra_selection_llr(*args, eps=2.0 / 3, cap=2.0)
    assert len(llr) == 16 and any(x != 0 for x in llr)
    assert not any(extra_selection_llr(*args, eps=2.0 / 3, cap=100.0))  # nothing past a cap never reached
    with pytest.raises(ValueError, match="eps must be positive"):
        extra_selection_llr(*args, eps=0.0, cap=2.0)
    with pytest.raises(ValueError, match="cap must be positive"):
        extra_selection_llr(*args, eps=1.0, cap=-1.0)
    with pytest.raises(ValueError, match="target"):
        extra_selection_llr(p.policy, "vegetarian", *args[2:], eps=1.0, cap=2.0)
