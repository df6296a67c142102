"""``memview.*`` experiments: Tables 2, 3 and 4 of the DP-MemView paper on PairedMem.

One pipeline: generate PairedMem pairs (``fedmem.bench.pairedmem``), run every method on
both stores of every pair with the same trajectory (EM methods once per seed), turn the
released inputs into text with the responder, audit the transcripts, and compute the
programmatic utility metrics tRec / Unsup / U from the deterministic gold behaviours.
The run's shared state and that per-method pipeline are :class:`MemViewRun` in
``fedmem.experiments.memview_run`` (``Bench`` here is its old name); this module holds
the scenario schema, the paper numbers, the three table builders and the DP ceiling check.

Auditors (``fedmem.attacks.memview_auditor``), each per attribute, on held-out test pairs:

* **embedding** (the paper's): MiniLM prefix embeddings, logistic regression, Platt
  calibration with a positive slope.
* **view-LR**: likelihood ratio of the released views given the public turn context
  (slot, read set meets ``I_a``, fallback), trained on the train split only. Memory-text
  methods have no released view; their transcripts are read as the modes the response
  exhibits.
* **count**: untrained number of target-supported views on turns whose read set meets ``I_a``.

AUCs are the seed mean of the macro-AUC with a pair-level bootstrap interval; Table 4
adds the paired difference of each ablation to the compliant interface.

Utility without an LLM judge (differs from the paper's Claude judge, see docs/memview.md):

* **tRec**: on ``M``, over target-relevant turns, the fraction whose response exhibits a
  target-specific view of the active slot (the target-required behaviour).
* **Unsup**: the same behaviour on ``M'``, where the store does not support it.
* **U** (judge-like): mean over turns and both stores of relevance (public ``r(q, v)`` of
  the exhibited modes), correctness (every user fact the response states is in the
  store; a benign view the store does not support is not an error), personalisation (a
  mode the read set supports is exhibited; 1 when the read set supports none) and focus
  (at most one mode and no memory echo).
* **U_strict**: the same with correctness = no exhibited mode unsupported by the store,
  and personalisation = 0 for any mode when the read set supports none. Both and their
  components are reported.

DP ceiling (hard check): for each DP method and its booked (or reconstructed) epsilon,
pure eps-DP bounds every test by ``TPR <= min(e^eps FPR, 1 - e^-eps (1 - FPR))``; the
pooled per-transcript test scores of the embedding and the view-LR auditor give
TPR@5%FPR with a Clopper-Pearson interval and AUC with a bootstrap interval; a lower
confidence bound above the ceiling marks the run failed.
"""

from __future__ import annotations

import math

import numpy as np

from fedmem.agent.memview.baselines import ABLATIONS, ALL_METHODS, DP_METHODS, TABLE2_METHODS, VIOLATES
from fedmem.attacks.audit import auc_ci, clopper_pearson, dp_roc_ceiling, roc_auc, tpr_at_fpr
from fedmem.attacks.memview_auditor import CALIBRATIONS, paired_auc_difference
from fedmem.bench import pairedmem as pm
from fedmem.experiments.memview_run import AUDITORS, EXTRA_METHODS, SLOT_TOPICS, MemViewRun, states_only_true_facts
from fedmem.report import Result, Table
from fedmem.scenario import Experiment, Param, at_least, each, nonempty, open_unit, positive

# Old names, kept importable from here (scripts/bench_memview.py, tests/test_memview_experiment.py)
Bench = MemViewRun
_states_only_true_facts = states_only_true_facts

__all__ = ["AUDITORS", "Bench", "EXPERIMENTS", "EXTRA_METHODS", "MemViewRun", "PAPER_T2", "PAPER_T3_CAP", "PAPER_T3_K",
           "PAPER_T4", "SLOT_TOPICS", "UTILITY_COLUMNS", "ceiling_check", "run_table2", "run_table3", "run_table4",
           "states_only_true_facts"]

# Paper numbers: PairedMem, Qwen2.5-7B column (AUC, TPR@5, tRec, U, Unsup).
PAPER_T2 = {
    "GenericOnly": (0.500, 0.050, 0.426, 0.877, 0.044), "RawReadSet": (0.842, 0.547, 0.521, 0.775, 0.136),
    "TypedMask": (0.500, 0.050, 0.386, 0.846, 0.109), "TaskMin": (0.832, 0.406, 0.524, 0.772, 0.129),
    "OutputFilter": (0.793, 0.438, 0.517, 0.786, 0.136), "DP-MemView (on)": (0.490, 0.016, 0.506, 0.877, 0.119),
    "DP-MemView (pre)": (0.476, 0.062, 0.559, 0.877, 0.175),
}
PAPER_T3_CAP = {1.0: (0.541, 0.508, 0.115), 2.0: (0.490, 0.506, 0.119), 4.0: (0.508, 0.513, 0.113),
                8.0: (0.608, 0.534, 0.105)}
PAPER_T3_K = {2: (0.510, 0.487, 0.088), 3: (0.490, 0.506, 0.119), 4: (0.525, 0.527, 0.129)}
PAPER_T4 = {"DP-MemView (on)": ("2.0", 0.490, 0.506, 0.877, 0.119),
            "IncompleteCharge": ("4.0", 0.554, 0.565, 0.879, 0.160),
            "CappedArgmax": ("inf", 0.754, 0.597, 0.876, 0.047), "NoCap": ("5.33", 0.599, 0.583, 0.876, 0.161)}

_COMMON = {
    "data": {
        "pairs": Param(int, 320, "adjacent store pairs (multiple of 4; paper: 320)", check=at_least(12)),
        "turns": Param(int, 16, "queries per trajectory run (paper: T=16 of a 32-query trajectory)",
                       check=positive),
        "overlap_fraction": Param(float, 0.25, "fraction of pairs with overlapping protected groups",
                                  check=lambda v: None if 0 <= v <= 1 else f"must be in [0, 1], found {v!r}"),
    },
    "budget": {
        "cap": Param(float, help="required: per-attribute cap B_a", check=positive),
        "K": Param(int, help="required: online budget granularity K (eps = B_a / K)", check=positive),
    },
    "run": {
        "seeds": Param(list, [0, 1, 2], "EM seeds of the stochastic methods (paper: 0, 1, 2)", item_type=int,
                       check=nonempty),
    },
    "audit": {
        "prefixes": Param(list, [16], "transcript prefix lengths audited (first one is the table's T)",
                          item_type=int, check=each(positive)),
        "alpha": Param(float, 0.05, "confidence level of the ceiling-check intervals", check=open_unit),
        "n_boot": Param(int, 400, "bootstrap resamples of the AUC interval", check=at_least(10)),
        "C": Param(float, 1.0, "inverse L2 regularisation of the auditor", check=positive),
        "calibration": Param(str, "platt", "embedding-auditor calibration: Platt with slope > 0, or none (raw)",
                             choices=CALIBRATIONS),
        "smoothing": Param(float, 1.0, "pseudo-counts of the view likelihood-ratio auditor", check=positive),
    },
    "responder": {
        "kind": Param(str, "template", "response model", choices=("template", "openai")),
        "base_url": Param(str, "http://localhost:8000/v1", "OpenAI-compatible endpoint (kind='openai')"),
        "model": Param(str, "", "model name at the endpoint (kind='openai')"),
    },
}


def _schema(extra=None, methods_default=TABLE2_METHODS, drop=()):
    s = {k: dict(v) for k, v in _COMMON.items() if k not in drop}
    s["run"]["methods"] = Param(list, help=f"required: methods to run (e.g. {list(methods_default)})", item_type=str,
                                check=lambda v: None if set(v) <= set(ALL_METHODS) and v
                                else f"must be a non-empty subset of {list(ALL_METHODS)}, found {v!r}")
    if extra:
        s.update(extra)
    return s


def _cross(cfg):
    out = []
    if cfg.data.pairs % 4:
        out.append(("data.pairs", f"must be a multiple of 4 (one quota per attribute), found {cfg.data.pairs}"))
    bad = [p for p in cfg.audit.prefixes if p > cfg.data.turns]
    if bad:
        out.append(("audit.prefixes", f"must not exceed data.turns={cfg.data.turns}, found {bad}"))
    if cfg.responder.kind == "openai" and not cfg.responder.model:
        out.append(("responder.model", "must name a model when responder.kind='openai'"))
    return out


def _auc_ceiling(eps: float) -> float:
    """Largest AUC of any ROC under the pure eps-DP ceiling (numerical integral)."""
    if math.isinf(eps):
        return 1.0
    f = np.linspace(0.0, 1.0, 20001)
    return float(np.trapezoid(dp_roc_ceiling(f, eps), f))


def ceiling_check(res: dict, eps: float, alpha: float, n_boot: int, rng, auditor: str = "embedding") -> dict:
    """Pooled TPR@5%FPR and AUC with intervals against the eps-DP ROC ceiling.

    Pools per-transcript scores (each one run of the mechanism) of ``auditor`` over
    seeds and attributes; seed-averaged scores would be a test on several runs."""
    pos, neg = res["pooled"][auditor]
    fpr_target = 0.05
    tpr = tpr_at_fpr(pos, neg, fpr_target)
    k = int(round(tpr * len(pos)))
    lo, hi = clopper_pearson(k, len(pos), alpha)
    auc = roc_auc(pos, neg)
    alo, ahi = auc_ci(pos, neg, alpha=alpha, rng=rng, n_boot=n_boot)
    tpr_ceiling = 1.0 if math.isinf(eps) else float(dp_roc_ceiling(fpr_target, eps))
    auc_ceiling = _auc_ceiling(eps)
    violated = (lo > tpr_ceiling + 1e-12) or (alo > auc_ceiling + 1e-12)
    from fedmem.attacks.verdict import judge  # lazy: ~36 ms, no heavy package

    v = judge(pos, neg, eps)        # the one verdict rule of every report (pure eps: delta 0)
    return {"epsilon": eps, "tpr5": tpr, "tpr5_ci": (lo, hi), "tpr5_ceiling": tpr_ceiling, "auc": auc,
            "auc_ci": (alo, ahi), "auc_ceiling": auc_ceiling, "violated": bool(violated),
            "point_above": bool(tpr > tpr_ceiling or auc > auc_ceiling), "n_pos": len(pos), "n_neg": len(neg),
            "eps_lower": v.eps_lower, "eps_booked": v.eps_booked, "power": v.power, "label": v.label,
            "verdict": v.text}


def _ceiling_table(checks: dict, alpha: float) -> Table:
    rows = []
    for name, c in checks.items():
        check = "VIOLATION (bug)" if c["violated"] else ("point above, CI ok" if c["point_above"] else "ok")
        rows.append([name, c["epsilon"], c["tpr5"], f"[{c['tpr5_ci'][0]:.3f}, {c['tpr5_ci'][1]:.3f}]",
                     c["tpr5_ceiling"], c["auc"], f"[{c['auc_ci'][0]:.3f}, {c['auc_ci'][1]:.3f}]",
                     c["auc_ceiling"], check, c.get("verdict", "-")])
    return Table("DP ceiling check (pooled test transcripts, all seeds and attributes)",
                 ["method", "epsilon", "TPR@5%FPR", f"{1 - alpha:.0%} CI", "ceiling", "AUC", f"{1 - alpha:.0%} CI",
                  "AUC ceiling", "ceiling check", "verdict"], rows,
                 note="Pure eps-DP bounds every test: TPR <= min(e^eps FPR, 1 - e^-eps (1 - FPR)). A lower "
                      "confidence bound above the ceiling fails the run. Verdict: the one rule of every report "
                      "(fedmem.attacks.verdict.judge: LEAK / within booked / no leak seen with the test's power; "
                      "epsilon inf: the method claims nothing).")


def _metrics(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "pooled" and not k.startswith("_")}


def _ci(est: float, ci, mark: str = "") -> str:
    return f"{est:.3f}{mark} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _checks(checks: dict, r: dict, name: str, eps: float, cfg, ctx, *key) -> None:
    """Ceiling checks of one method for the embedding and the view likelihood auditors."""
    for auditor in ("embedding", "view"):
        checks[f"{name} / {auditor}"] = ceiling_check(r, eps, cfg.audit.alpha, cfg.audit.n_boot,
                                                      ctx.rng("ceiling", name, auditor, *key), auditor)


UTILITY_COLUMNS = ["relevance", "correctness", "correctness_strict", "personalisation", "personalisation_strict",
                   "focus", "U", "U_strict"]


def _utility_table(results: dict, title: str) -> Table:
    return Table(title, ["method", "tRec", "Unsup", *UTILITY_COLUMNS],
                 [[m, r["tRec"], r["Unsup"], *(r[k] for k in UTILITY_COLUMNS)] for m, r in results.items()],
                 note="U = mean of relevance, correctness, personalisation, focus (judge-like: a benign view the "
                      "store does not support is not an error; only a false statement about the user is). "
                      "U_strict uses the *_strict columns (any unsupported mode is an error; personalisation also "
                      "requires no mode when the read set supports none). No LLM judge: see docs/memview.md.")


def _auditor_note(cfg) -> str:
    return ("AUC columns: mean over EM seeds of the macro-AUC over the 4 attributes on held-out test pairs, "
            f"with a {1 - cfg.audit.alpha:.0%} pair-level bootstrap interval ({cfg.audit.n_boot} resamples; auditor "
            "fits held fixed). emb = MiniLM embedding auditor (Platt slope > 0); view-LR = likelihood ratio of the "
            "released views given the public turn context, trained on the train split; count = untrained "
            "number of target-supported views on turns whose read set meets I_a.")


def _timing_section(bench) -> tuple[str, str]:
    lines = [f"- {k}: {v:.1f} s" for k, v in bench.timings.items()]
    enc = bench._embedder.encoded if bench._embedder else 0
    lines.append(f"- unique responses embedded: {enc}")
    return ("Stage timings", "\n".join(lines))


def _fmt_bound(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


# ------------------------------------------------------------------------------ table 2
def run_table2(cfg, ctx) -> Result:
    bench = MemViewRun(cfg, ctx)
    T = cfg.audit.prefixes[0]
    results, rows, checks = {}, [], {}
    for method in ctx.progress(list(cfg.run.methods), description="methods"):
        r = bench.evaluate(method, cfg.budget.cap, cfg.budget.K)
        results[method] = r
        paper = PAPER_T2.get(method)
        dag = "†" if r["identical"] else ""
        rows.append([method, _ci(r["auc"], r["auc_ci"], dag), _ci(r["view_auc"], r["view_auc_ci"], dag),
                     _ci(r["count_auc"], r["count_auc_ci"], dag), f"{r['tpr5']:.3f}{dag}",
                     f"{r['view_tpr5']:.3f}{dag}", r["tRec"], r["U"], r["U_strict"], r["Unsup"],
                     *(paper if paper else ("-",) * 5)])
        if method in DP_METHODS or method == "CappedArgmax":
            eps = r["booked_max"] if method in ("DP-MemView (on)", "DP-MemView (pre)") else (
                math.inf if method == "CappedArgmax" else r["reconstructed_max"])
            _checks(checks, r, method, eps, cfg, ctx)
    n_test = results[next(iter(results))]["auditors"]["view"][T]["n_test_pairs"]
    tables = [Table(f"Table 2 (PairedMem, T={T}, B_a={cfg.budget.cap}, K={cfg.budget.K}, {n_test} test pairs): "
                    "fedmem vs paper (Qwen2.5-7B)",
                    ["method", "AUC emb [CI]", "AUC view-LR [CI]", "AUC count [CI]", "TPR@5 emb", "TPR@5 view",
                     "tRec", "U", "U strict", "Unsup", "paper AUC", "paper TPR@5", "paper tRec", "paper U",
                     "paper Unsup"], rows,
                    note="† identical conditioning under M and M' (chance by construction). Responder: "
                         f"{cfg.responder.kind}; utility is programmatic (no LLM judge), see docs/memview.md. "
                         + _auditor_note(cfg)),
              _utility_table(results, "Utility decomposition (per turn, both stores, mean over seeds)")]
    for prefix in cfg.audit.prefixes[1:]:
        tables.append(Table(f"Macro-AUC at prefix T={prefix}", ["method", "AUC emb [CI]", "TPR@5 emb",
                                                                 "AUC view-LR [CI]"],
                            [[m, _ci(r["by_prefix"][prefix]["auc"], r["by_prefix"][prefix]["auc_ci"]),
                              r["by_prefix"][prefix]["tpr5"],
                              _ci(r["auditors"]["view"][prefix]["auc"], r["auditors"]["view"][prefix]["auc_ci"])]
                             for m, r in results.items()]))
    tables.append(Table("Per-attribute AUC at T=%d (emb / view-LR)" % T, ["method", *pm.ATTRIBUTES],
                        [[m, *(f"{r['auditors']['embedding'][T]['auc_per_attr'][a]:.3f} / "
                               f"{r['auditors']['view'][T]['auc_per_attr'][a]:.3f}" for a in pm.ATTRIBUTES)]
                         for m, r in results.items()],
                        note="Platt fits whose slope hit the positivity bound (all seeds): " + ", ".join(
                            f"{m} {r['auditors']['embedding'][T]['clamped_calibrations']}" for m, r in results.items())))
    ok = True
    if checks:
        tables.append(_ceiling_table(checks, cfg.audit.alpha))
        ok = not any(c["violated"] for c in checks.values() if not math.isinf(c["epsilon"]))
    metrics = {"methods": {m: _metrics(r) for m, r in results.items()}, "ceiling": checks,
               "timings": dict(bench.timings)}
    return Result(metrics=metrics, tables=tables, sections=[_timing_section(bench)], ok=ok)


# ------------------------------------------------------------------------------ table 3
def run_table3(cfg, ctx) -> Result:
    bench = MemViewRun(cfg, ctx)
    method = "DP-MemView (on)"
    settings = [("cap", float(b), cfg.sweep.K_for_caps) for b in cfg.sweep.caps] + \
               [("K", cfg.sweep.cap_for_K, int(k)) for k in cfg.sweep.Ks]
    done, rows, checks = {}, [], {}
    for kind, cap, K in ctx.progress(settings, description="settings"):
        key = (cap, K)
        if key not in done:
            done[key] = bench.evaluate(method, cap, K)
            _checks(checks, done[key], f"B_a={cap:g}, K={K}", done[key]["booked_max"], cfg, ctx, cap, K)
        r = done[key]
        paper = PAPER_T3_CAP.get(cap) if kind == "cap" else PAPER_T3_K.get(K)
        label = f"B_a={cap:g} (K={K})" if kind == "cap" else f"K={K} (B_a={cap:g})"
        rows.append([label, cap / K, _ci(r["auc"], r["auc_ci"]), _ci(r["view_auc"], r["view_auc_ci"]),
                     _ci(r["count_auc"], r["count_auc_ci"]), r["tpr5"], r["tRec"], r["U"], r["Unsup"],
                     *(paper or ("-",) * 3)])
    tables = [Table(f"Table 3: budget sensitivity of DP-MemView (on), T={cfg.audit.prefixes[0]}",
                    ["setting", "eps_t,g", "AUC emb [CI]", "AUC view-LR [CI]", "AUC count [CI]", "TPR@5 emb", "tRec",
                     "U", "Unsup", "paper AUC", "paper tRec", "paper Unsup"], rows, note=_auditor_note(cfg)),
              _ceiling_table(checks, cfg.audit.alpha)]
    ok = not any(c["violated"] for c in checks.values())
    metrics = {"settings": {f"{c}_{k}": _metrics(r) for (c, k), r in done.items()}, "ceiling": checks,
               "timings": dict(bench.timings)}
    return Result(metrics=metrics, tables=tables, sections=[_timing_section(bench)], ok=ok)


# ------------------------------------------------------------------------------ table 4
def run_table4(cfg, ctx) -> Result:
    bench = MemViewRun(cfg, ctx)
    rows, checks, results = [], {}, {}
    for method in ctx.progress(list(cfg.run.methods), description="variants"):
        r = bench.evaluate(method, cfg.budget.cap, cfg.budget.K)
        results[method] = r
        if method == "CappedArgmax":
            bound = math.inf
        elif method in ("DP-MemView (on)", "DP-MemView (pre)"):
            bound = r["booked_max"]
        else:
            bound = r["reconstructed_max"]
        relation = "<= B_a" if bound <= cfg.budget.cap + 1e-9 else "> B_a"
        paper = PAPER_T4.get(method)
        rows.append([method, VIOLATES.get(method, "-"), f"{_fmt_bound(bound)} {relation}",
                     r["reconstructed_mean"], r["booked_max"], _ci(r["auc"], r["auc_ci"]),
                     _ci(r["view_auc"], r["view_auc_ci"]), _ci(r["count_auc"], r["count_auc_ci"]), r["tpr5"],
                     r["view_tpr5"], r["tRec"], r["U"], r["U_strict"], r["Unsup"], *(paper or ("-",) * 5)])
        _checks(checks, r, method, bound, cfg, ctx)
    T = cfg.audit.prefixes[0]
    ref = results.get("DP-MemView (on)")
    diff_rows = []
    if ref is not None:
        for method, r in results.items():
            if method == "DP-MemView (on)":
                continue
            for name in AUDITORS:
                d = paired_auc_difference([s[name][T] for s in r["_per_seed"]], [s[name][T] for s in ref["_per_seed"]],
                                          alpha=cfg.audit.alpha, n_boot=cfg.audit.n_boot,
                                          rng=ctx.rng("auc-diff", method, name))
                diff_rows.append([method, name, _ci(d[0], d[1:]), "yes" if d[1] > 0 else "no"])
    extra, extra_rows = _ablation_auditor(results, cfg, ctx, T)
    for method, e in extra.items():
        extra_rows.append([method, VIOLATES.get(method, "-"), _ci(e["auc"], e["auc_ci"]),
                           _ci(e["diff"], e["diff_ci"]) if method != "DP-MemView (on)" else "-",
                           "yes" if e["separated"] else "no", e["nonzero_scores"], e["paper_auc"],
                           "-" if e["paper_diff"] is None else f"{e['paper_diff']:+.3f}"])
    tables = [Table(f"Table 4: safeguard ablations (B_a={cfg.budget.cap}, K={cfg.budget.K}, T={T})",
                    ["variant", "violated", "target DP bound (max)", "mean reconstructed", "ledger max",
                     "AUC emb [CI]", "AUC view-LR [CI]", "AUC count [CI]", "TPR@5 emb", "TPR@5 view", "tRec", "U",
                     "U strict", "Unsup", "paper bound", "paper AUC", "paper tRec", "paper U", "paper Unsup"], rows,
                    note="DP bound: booked ledger for the compliant interface; reconstructed complete-charging cost "
                         "of the target attribute (max over pairs, stores, seeds) for IncompleteCharge and NoCap; "
                         "infinite for CappedArgmax (no finite pure-DP bound). " + _auditor_note(cfg)),
              Table("Extra leakage over the compliant interface (same test pairs)",
                    ["variant", "auditor", f"AUC(variant) - AUC(DP-MemView (on)) [{1 - cfg.audit.alpha:.0%} CI]",
                     "measurably more"], diff_rows,
                    note="Pair-level bootstrap of the difference of seed-mean macro-AUCs (the same resampled test "
                         "pairs for both; auditor fits held fixed)."),
              Table("Ablation-aware auditor: exact likelihood ratio of the selections past the pathwise cap",
                    ["variant", "violated", f"AUC [{1 - cfg.audit.alpha:.0%} CI]",
                     "AUC - AUC(DP-MemView (on)) [CI]", "separated", "transcripts scored != 0",
                     "paper AUC", "paper AUC - 0.490"], extra_rows,
                    note="The auditor knows the ablation and the pair: it replays the target's complete-charging "
                         "cost from public data (read sets, charge sets, fallback controls, eps = B_a/K) and sums "
                         "the exact EM log-ratio log P_M(v)/P_M'(v) over the selections released after that cost "
                         "exceeds B_a (the Neyman-Pearson test of the extra charge; 0 elsewhere). Nothing is fitted, "
                         "so every pair is a test pair; seed-mean macro-AUC, pair-level bootstrap; separated = "
                         "difference CI above 0. "
                         "The compliant interface releases no such selection (every score 0, AUC 0.5): a "
                         "separation there would be a ledger bug. Paper: embedding auditor (Qwen2.5-7B)."),
              _utility_table(results, "Utility decomposition (per turn, both stores, mean over seeds)"),
              _ceiling_table(checks, cfg.audit.alpha)]
    ok = not any(c["violated"] for c in checks.values() if not math.isinf(c["epsilon"]))
    metrics = {"variants": {m: _metrics(r) for m, r in results.items()}, "ceiling": checks,
               "ablation_auditor": extra, "timings": dict(bench.timings)}
    return Result(metrics=metrics, tables=tables, sections=[_timing_section(bench)], ok=ok)


def _ablation_auditor(results: dict, cfg, ctx, T: int) -> tuple[dict, list]:
    """Table 4 with the ablation-aware auditor (``"extra"``): per online EM variant its AUC,
    and for each ablation the paired difference to the compliant interface, beside the
    paper's embedding-auditor numbers."""
    ref = results.get("DP-MemView (on)")
    out = {}
    if ref is None or "extra" not in ref["auditors"]:
        return out, []
    paper_ref = PAPER_T4["DP-MemView (on)"][1]
    for method, r in results.items():
        if "extra" not in r["auditors"]:
            continue
        a = r["auditors"]["extra"][T]
        per_seed = [s["extra"][T] for s in r["_per_seed"]]
        if method == "DP-MemView (on)":
            d = (0.0, 0.0, 0.0)
        else:
            d = paired_auc_difference(per_seed, [s["extra"][T] for s in ref["_per_seed"]], alpha=cfg.audit.alpha,
                                      n_boot=cfg.audit.n_boot, rng=ctx.rng("auc-diff", method, "extra"))
        pooled = [x for res in per_seed for x in np.concatenate([*res.pos_scores.values(), *res.neg_scores.values()])]
        paper = PAPER_T4.get(method)
        out[method] = {"auc": a["auc"], "auc_ci": a["auc_ci"], "diff": float(d[0]), "diff_ci": (float(d[1]), float(d[2])),
                       "separated": bool(d[1] > 0), "n_test_pairs": a["n_test_pairs"],
                       "nonzero_scores": float(np.mean(np.asarray(pooled) != 0.0)),
                       "paper_auc": paper[1] if paper else None,
                       "paper_diff": round(paper[1] - paper_ref, 3) if paper and method != "DP-MemView (on)" else None}
    return out, []


_SWEEP = {
    "sweep": {
        "caps": Param(list, help="required: caps B_a swept at fixed K", item_type=float, check=nonempty),
        "K_for_caps": Param(int, help="required: K used in the cap sweep", check=positive),
        "Ks": Param(list, help="required: granularities K swept at fixed B_a", item_type=int, check=nonempty),
        "cap_for_K": Param(float, help="required: B_a used in the K sweep", check=positive),
    }
}

EXPERIMENTS = {
    "memview.table2": Experiment("memview.table2", "DP-MemView Table 2: compared interfaces on PairedMem (AUC, "
                                 "TPR@5, tRec, U, Unsup) beside the paper", _schema(), run_table2, _cross),
    "memview.table3": Experiment("memview.table3", "DP-MemView Table 3: B_a and K sweep of the online mode",
                                 _schema(_SWEEP, methods_default=["DP-MemView (on)"], drop=("budget",)), run_table3, _cross),
    "memview.table4": Experiment("memview.table4", "DP-MemView Table 4: IncompleteCharge / CappedArgmax / NoCap "
                                 "ablations with reconstructed DP bounds",
                                 _schema(methods_default=["DP-MemView (on)", *ABLATIONS]), run_table4, _cross),
}
