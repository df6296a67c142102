"""Adversaries at every boundary of an agent session, and the undefended agent.

Each boundary's adversary plays a distinguishing game on neighbouring inputs and is
scored with :func:`fedmem.attacks.support.membership_report` (AUC with bootstrap CI,
TPR at 1% FPR, a held-out Clopper-Pearson epsilon lower bound, and the number of ROC
points provably above the DP ceiling of the booked epsilon). The same game is played
against the **undefended agent** (raw memory, no gateway, clean context) on the same
tasks and seeds.

* **third-party app** (DP-MemView): sees the released views of the user's memory ``M``.
  Neighbour: the paired store ``M'`` (differs in the pair's target attribute), run by
  the evaluator through a shadow interface with the same public policy and queries.
  Score: :func:`fedmem.attacks.memview_auditor.target_view_count` (turns whose public
  read set meets the target group and that release a target-supported view). One trial
  per user. Undefended: the app reads the raw store; score = items unique to ``M`` minus
  items unique to ``M'``.
* **external model provider** (DP-MIND): sees the perturbed chunks of every context.
  Game per (user, task): the true needle vs a decoy needle of the same format; score =
  fraction of the candidate's word pieces present in what the provider saw, plus 1 if
  the candidate string appears verbatim. Also the exact recovery rate (needle verbatim
  in what the provider saw). Booked: metric DP, ``eps * sum_i ||phi(a_i) - phi(b_i)||``
  for the two needles' token rows (the guarantee for exactly this neighbouring pair).
  Undefended: the clean chunks.
* **curious peer agent** (federation): its own principals (one fresh principal per
  trial, as a Sybil would), queries near one target record (``near_duplicates``) to the
  session's federation (target present) and to a neighbour federation without it.
  Score: the Gaussian log-likelihood ratio of the released value against both worlds'
  exact selected means (the adversary knows both datasets; refusal: ``REJECTED_SCORE``).
  Booked: the principal's spend for the one query. Undefended: the exact selected mean.
* **aggregator** (release policy): the compute parties open what the plan says (the
  selected sum; the count/tallies where the plan opens them) to the aggregator, which
  adds the noise. Its view is the opened sum, exactly (evaluation reads it through
  ``ground_truth_many``, the same selection and encoding as the parties). Same queries
  and score as the peer. Nothing is booked for it: the aggregator is inside the trust
  boundary, and this row shows what that trust covers.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from fedmem.errors import SupportPrivacyViolation

REPORT_DELTA_PURE = 1e-9   # delta passed to the lower bound for pure-DP boundaries (app, external)


def _report(pos, neg, *, delta, rng, claim, trusted=False):
    from fedmem.attacks.support import membership_report  # lazy: loads sklearn, scipy, numpy (~2.6 s)
    from fedmem.attacks.verdict import judge  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    r = membership_report(np.asarray(pos, float), np.asarray(neg, float), delta=delta, rng=rng,
                          epsilon_claim=claim, n_boot=400)
    # one verdict rule (fedmem.attacks.verdict): an undefended side booked nothing (judged against 0);
    # a trusted observer (the aggregator) claims nothing (inf)
    booked = claim if (math.isfinite(claim) or trusted) else 0.0
    v = judge(np.asarray(pos, float), np.asarray(neg, float), booked, delta if 0 < booked < math.inf else 0.0)
    return {"n_pos": r.n_pos, "n_neg": r.n_neg, "auc": r.auc, "auc_ci": list(r.auc_ci), "tpr_at_1fpr": r.tpr_at_1,
            "eps_lower": v.eps_lower, "ceiling_violations": r.ceiling_violations, "epsilon_claim": r.epsilon_claim,
            "power": v.power, "label": v.label, "verdict": v.text}


# --------------------------------------------------------------------------- app (DP-MemView)
def app_game(worlds, exposures: dict, spends: dict, config, rng: np.random.Generator) -> dict:
    from fedmem.agent.memview import MemViewInterface, PaperScorer, PhraseLexicon  # lazy: loads dp_accounting (~240 ms)
    from fedmem.attacks.memview_auditor import target_view_count, view_events  # lazy: loads sklearn, scipy, numpy (~2.6 s)
    from fedmem.bench import pairedmem as pm  # lazy: ~53 ms, no heavy package

    pos, neg, upos, uneg, booked, specific, views = [], [], [], [], [], 0, 0
    for w in worlds:
        ex = exposures.get(w.user)
        if ex is None or not ex["memview"]:
            continue
        pol, target = w.pair.policy, w.pair.target
        rel = ex["memview"]
        queries = [t.app_query for t in w.tasks[:len(rel)]]
        released = [tuple((s, v) for s, v, _ in slots) for _, slots in rel]
        fb = [any(f for _, _, f in slots) for _, slots in rel]
        pos.append(target_view_count(view_events(pol, target, queries, released, fb)))
        shadow = MemViewInterface(pol, w.pair.stores["M'"], PaperScorer(PhraseLexicon(pm.LEXICON)),
                                  caps={a: config.memview_cap for a in pol.attributes},
                                  rng=np.random.default_rng(rng.integers(2**63)), mode="online", K=config.memview_K)
        srel = [shadow.answer(q) for q in queries]
        neg.append(target_view_count(view_events(pol, target, queries, [r.views for r in srel],
                                                 [any(s.fallback for s in r.slots) for r in srel])))
        booked.append(spends[w.user]["memview"]["per_attribute"].get(target, 0.0))
        for _, slots in rel:
            for s, v, _ in slots:
                views += 1
                specific += v != pol.vocabularies[s].generic.name
        only_m = set(w.pair.stores["M"].items) - set(w.pair.stores["M'"].items)
        only_n = set(w.pair.stores["M'"].items) - set(w.pair.stores["M"].items)

        def raw(items):
            return len(set(items) & only_m) - len(set(items) & only_n)

        upos.append(raw(w.pair.stores["M"].items))
        uneg.append(raw(w.pair.stores["M'"].items))
    if len(pos) < 4:
        return {"skipped": f"needs >= 4 agents with app releases, found {len(pos)}"}
    claim = max(booked)
    return {
        "defended": _report(pos, neg, delta=REPORT_DELTA_PURE, rng=rng, claim=claim),
        "undefended": _report(upos, uneg, delta=REPORT_DELTA_PURE, rng=rng, claim=math.inf),
        "booked": {"kind": "pure eps on the target attribute", "median": float(np.median(booked)),
                   "max": float(claim)},
        "utility": {"defended": specific / max(views, 1), "undefended": 1.0,
                    "metric": "fraction of released slot views that are specific (not generic); raw memory: 1"},
        "game": "M vs M' (target attribute), one trial per user; score target_view_count",
    }


# --------------------------------------------------------------------------- external model provider (DP-MIND)
def clean_perturber(table):
    """The undefended agent's "perturber": a TokenPerturber whose ``perturb_ids`` is the identity."""
    from fedmem.agent.dpmind import TokenPerturber  # lazy: loads dp_accounting (~370 ms)
    from fedmem.dp import MetricLaplace  # lazy: loads dp_accounting (~230 ms)

    class _Clean(TokenPerturber):
        def perturb_ids(self, ids, rng):
            return self._ids(ids).copy()

    class _NoProjector:
        name = "none"

        def __init__(self, t):
            self.table = t

        def project(self, points):  # pragma: no cover - never called
            raise RuntimeError("the clean perturber never projects")

    return _Clean(MetricLaplace(1.0, table.dim), table, _NoProjector(table))


def undefended_dpmind(worlds, codec, table, config, tasks_done: dict) -> dict:
    """Clean context through the same chunk loop and external model: {(user, task): (chunks, answer, correct)}."""
    from fedmem.agent.dpmind import DPMindClient, ExtractiveMemoryAgent  # lazy: loads dp_accounting (~370 ms)

    pert = clean_perturber(table)
    model = ExtractiveMemoryAgent()
    out = {}
    for w in worlds:
        for t in w.tasks:
            if t.index not in tasks_done.get(w.user, ()):
                continue
            c = DPMindClient(pert, codec, chunk_tokens=config.dpmind_chunk_tokens, restore_k=config.dpmind_restore_k)
            c.ingest(t.context, np.random.default_rng(0))
            ans = c.ask(t.question, model)
            ok = any(a.lower() in ans.final_answer.lower() for a in t.answers) if t.answers else None
            out[(w.user, t.index)] = (c.chunks, ans.final_answer, ok)
    return out


def _decoy(needle: str, rng) -> str:
    while True:
        if needle.isdigit():
            d = "".join(str(int(x)) for x in rng.integers(0, 10, size=len(needle)))
            d = str(int(rng.integers(1, 10))) + d[1:]
        else:
            alphabet = "0123456789abcdef"
            d = "".join(c if c == "-" else alphabet[int(rng.integers(16))] for c in needle)
        if d != needle:
            return d


def _span_score(candidate: str, seen_text: str, seen_bag: Counter, codec) -> float:
    ids = codec.encode(candidate)
    if ids.size == 0:
        return 0.0
    need = Counter(int(i) for i in ids)
    frac = sum(min(c, seen_bag.get(k, 0)) for k, c in need.items()) / ids.size
    return frac + (1.0 if candidate.lower() in seen_text.lower() else 0.0)


def external_game(worlds, exposures: dict, results: dict, undefended: dict, codec, table, eps_token: float,
                  rng: np.random.Generator) -> dict:
    from fedmem.attacks.audit import clopper_pearson  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    pos, neg, upos, uneg, claims = [], [], [], [], []
    rec = urec = prov = n = 0
    correct = ucorrect = m = 0
    for w in worlds:
        ex = exposures.get(w.user)
        if ex is None:
            continue
        by_task = {t.index: t for t in w.tasks}
        res = {r.task: r for r in results.get(w.user, [])}
        for s in ex["dpmind"]:
            t = by_task[s["task"]]
            if not t.answers:
                continue
            needle, decoy = t.answers[0], _decoy(t.answers[0], rng)
            seen = " ".join(s["chunks"])
            bag = Counter(int(i) for i in codec.encode(seen))
            pos.append(_span_score(needle, seen, bag, codec))
            neg.append(_span_score(decoy, seen, bag, codec))
            rec += needle.lower() in seen.lower()
            r = res.get(s["task"])
            if r is not None:
                prov += needle.lower() in r.dp_answer.lower()
                correct += bool(r.correct)
                m += 1
            a, b = codec.encode(needle), codec.encode(decoy)
            if a.size == b.size:
                claims.append(eps_token * float(np.linalg.norm(
                    table.matrix[a].astype(np.float64) - table.matrix[b].astype(np.float64), axis=1).sum()))
            u = undefended.get((w.user, s["task"]))
            if u is not None:
                useen = " ".join(u[0])
                ubag = Counter(int(i) for i in codec.encode(useen))
                upos.append(_span_score(needle, useen, ubag, codec))
                uneg.append(_span_score(decoy, useen, ubag, codec))
                urec += needle.lower() in useen.lower()
                ucorrect += bool(u[2])
            n += 1
    if n < 4:
        return {"skipped": f"needs >= 4 contexts, found {n}"}
    claim = max(claims) if claims else math.inf
    return {
        "defended": _report(pos, neg, delta=REPORT_DELTA_PURE, rng=rng, claim=claim),
        "undefended": _report(upos, uneg, delta=REPORT_DELTA_PURE, rng=rng, claim=math.inf),
        "exact_recovery": {"defended": rec / n, "defended_ci": list(clopper_pearson(rec, n)),
                           "undefended": urec / max(len(upos), 1),
                           "undefended_ci": list(clopper_pearson(urec, max(len(upos), 1))),
                           "provider_answer_has_needle": prov / max(m, 1), "n": n},
        "booked": {"kind": "metric DP: eps_token * sum_i ||phi(needle_i) - phi(decoy_i)||",
                   "eps_per_token": eps_token, "median": float(np.median(claims)) if claims else math.inf,
                   "max": float(claim), "pairs_with_equal_length": len(claims)},
        "utility": {"defended": correct / max(m, 1), "undefended": ucorrect / max(len(upos), 1),
                    "metric": "DP-MIND answer correct (needle in the final answer)", "n": m},
        "game": "true needle vs same-format decoy, one trial per context; score = word-piece overlap + verbatim",
    }


# --------------------------------------------------------------------------- peer agent and aggregator (federation)
def pick_target(data, rng):
    s = int(rng.integers(data.n_shards))
    i = int(rng.integers(len(data.keys[s])))
    return s, i, np.asarray(data.keys[s][i], float), np.asarray(data.values[s][i], float)


def federation_games(service, neighbour, target, trials: int, rng: np.random.Generator, *, radius: float = 0.05,
                     delta: float) -> dict:
    """Curious peer (fresh principal per trial, through the public client) and aggregator
    (the opened selected sum) on ``trials`` near-duplicate queries per world.

    The adversary knows both datasets (the DP game), so it computes offline the exact
    selected mean ``mu_w(q)`` (peer) or sum ``s_w(q)`` (aggregator) of each world and
    scores an observation ``x`` by the Gaussian log-likelihood ratio
    ``||x - m_without||^2 - ||x - m_with||^2`` (optimal against isotropic Gaussian noise of
    the same scale in both worlds); a refusal scores ``REJECTED_SCORE``.
    """
    import ray

    from fedmem.agent.federation_service import RemoteMemoryClient  # lazy: ~29 ms, no heavy package
    from fedmem.attacks.observable import near_duplicates  # lazy: loads sklearn, scipy, numpy (~2.6 s)
    from fedmem.attacks.support import REJECTED_SCORE  # lazy: loads sklearn, scipy, numpy (~2.6 s)

    _, _, key, _ = target
    qs = near_duplicates(key, trials, radius, rng)

    def truth(svc):
        out = []
        for s in range(0, len(qs), 512):
            out += ray.get(svc.ground_truth_many.remote(qs[s:s + 512]))
        return out

    t_with, t_without = truth(service), truth(neighbour)

    def mean(t):
        return np.asarray(t.sum, float) / max(int(t.count), 1)

    def llr(x, a, b):
        return float(np.sum((x - b) ** 2) - np.sum((x - a) ** 2))

    scores, refusals, booked = {}, {}, []
    differs = sum(not np.allclose(mean(a), mean(b)) for a, b in zip(t_with, t_without))
    for name, svc, truths in (("with", service, t_with), ("without", neighbour, t_without)):
        sc, ref = [], 0
        for q, ta, tb in zip(qs, t_with, t_without):
            c = RemoteMemoryClient(svc, ray.get(svc.connect.remote()))
            try:
                r = c.retrieve(q, family="peer")
                sc.append(llr(np.asarray(r.value, float), mean(ta), mean(tb)))
                if name == "with":
                    booked.append(c.epsilon_spent)
            except SupportPrivacyViolation:
                sc.append(REJECTED_SCORE)
                ref += 1
        scores[name] = sc
        refusals[name] = ref
        scores[f"raw_{name}"] = [llr(mean(t), mean(ta), mean(tb)) for t, ta, tb in zip(truths, t_with, t_without)]
        scores[f"agg_{name}"] = [llr(np.asarray(t.sum, float), np.asarray(ta.sum, float), np.asarray(tb.sum, float))
                                 for t, ta, tb in zip(truths, t_with, t_without)]
    claim = max(booked) if booked else math.inf
    return {
        "peer": {
            "defended": _report(scores["with"], scores["without"], delta=delta, rng=rng, claim=claim),
            "undefended": _report(scores["raw_with"], scores["raw_without"], delta=delta, rng=rng, claim=math.inf),
            "booked": {"kind": f"(eps, delta={delta}) per query, per principal", "median": float(np.median(booked))
                       if booked else math.inf, "max": float(claim)},
            "refusals": refusals, "queries_whose_selection_changes": int(differs),
            "game": f"target record present vs removed; {trials} near-duplicate queries per world, one fresh "
                    f"principal each; score = Gaussian log-likelihood ratio against both worlds' exact means",
        },
        "aggregator": {
            "defended": _report(scores["agg_with"], scores["agg_without"], delta=delta, rng=rng, claim=math.inf,
                                trusted=True),
            "booked": {"kind": "nothing: the aggregator is trusted with what the plan opens", "median": 0.0,
                       "max": 0.0},
            "game": "same queries; the aggregator's view is the opened selected sum (exact); same score on sums",
        },
    }


def federation_utility(service, results: dict, worlds) -> dict:
    """Mean L2 error of the released value against the exact selected mean (undefended: 0)."""
    import ray

    qs, vals = [], []
    by_user = {w.user: {t.index: t for t in w.tasks} for w in worlds}
    refused = total = 0
    for u, res in results.items():
        for r in res:
            total += 1
            if r.federation is None:
                refused += 1
                continue
            qs.append(by_user[u][r.task].fed_query)
            vals.append(np.asarray(r.federation["value"], float))
    if not qs:
        return {"defended": None, "undefended": 0.0, "refused": refused, "n": total}
    qs = np.stack(qs)
    truths = []
    for s in range(0, len(qs), 512):     # the federation's max_batch bounds one call
        truths += ray.get(service.ground_truth_many.remote(qs[s:s + 512]))
    err = [float(np.linalg.norm(v - np.asarray(t.sum) / max(int(t.count), 1))) for v, t in zip(vals, truths)]
    return {"defended": float(np.mean(err)), "defended_ci": _mean_ci(err), "undefended": 0.0,
            "refused": refused, "n": total,
            "metric": "mean L2 error of the released value vs the exact selected mean (raw memory: 0)"}


def _mean_ci(x) -> list:
    """95% Student-t interval of the mean (scipy.stats.t.interval)."""
    from scipy import stats

    x = np.asarray(x, float)
    sem = float(stats.sem(x)) if x.size >= 2 else 0.0
    if x.size < 2 or sem == 0.0:
        return [float(x.mean()), float(x.mean())]
    lo, hi = stats.t.interval(0.95, df=x.size - 1, loc=float(x.mean()), scale=sem)
    return [float(lo), float(hi)]
