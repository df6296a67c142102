"""Shared state of one ``memview.*`` run (:class:`MemViewRun`): PairedMem pairs, responder,
scorer, embedder, response cache and stage timings, with the per-method pipeline (transcripts,
programmatic utility, auditors, seed-averaged metrics) that Tables 2, 3 and 4 of
``fedmem.experiments.memview`` are built from.
"""

from __future__ import annotations

import re
import time

import numpy as np

from fedmem.agent.llm import ECHO_MARK, OpenAICompatibleResponder, TemplateResponder
from fedmem.agent.memview.baselines import DP_METHODS, run_method
from fedmem.agent.memview.scorer import PaperScorer, PhraseLexicon
from fedmem.agent.memview.interface import _share
from fedmem.attacks.ablation_auditor import extra_selection_llr
from fedmem.attacks.memview_auditor import (audit, macro_auc_ci, prefix_features, score_audit,
                                           view_audit, view_events)
from fedmem.dp import DurableStore
from fedmem.embeddings import shared_embedder
from fedmem.experiments import pairedmem as pm

SLOT_TOPICS = {"health": "health", "food": "meals", "finance": "finances", "work": "work",
               "schedule": "schedule", "family": "household"}


class MemViewRun:
    """Shared state of one run: pairs, responder, scorer, embedder, caches, timings."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()
        self.pairs = pm.generate(cfg.data.pairs, ctx.rng("pairedmem"), turns=max(32, cfg.data.turns),
                                 overlap_fraction=cfg.data.overlap_fraction)
        self.book = pm.template_book()
        if cfg.responder.kind == "template":
            self.responder = TemplateResponder(self.book, SLOT_TOPICS)
        else:
            self.responder = OpenAICompatibleResponder(cfg.responder.base_url, cfg.responder.model)
        self.scorer = PaperScorer(PhraseLexicon(pm.LEXICON))
        self.cache: dict[str, str] = {}
        self.timings["generate pairs"] = time.perf_counter() - t0
        self._embedder = None

    @property
    def embedder(self):
        if self._embedder is None:
            t0 = time.perf_counter()
            self._embedder = shared_embedder()
            self.timings["load encoder"] = self.timings.get("load encoder", 0) + time.perf_counter() - t0
        return self._embedder

    def _tick(self, key, t0):
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - t0

    def transcripts(self, method: str, seed: int, cap: float, K: int):
        t0 = time.perf_counter()
        out = []
        store = DurableStore(None)  # in-memory; one named ledger per store/trajectory
        for pair in self.pairs:
            sides = {}
            for side in ("M", "M'"):
                rng = self.ctx.rng("em", method, seed, cap, K, pair.index, side)
                sides[side] = run_method(method, pair, side, self.responder, turns=self.cfg.data.turns, cap=cap,
                                         K=K, rng=rng, sensitive_phrases=pm.SENSITIVE_PHRASES,
                                         scorer=self.scorer, cache=self.cache, ledger_store=store,
                                         ledger_name=f"{method}|{seed}|{cap}|{K}|{pair.index}|{side}")
            out.append(sides)
        self._tick("interfaces + responder", t0)
        return out

    def utility(self, runs) -> dict:
        """tRec, Unsup and U with its decomposition, strict and judge-like (module docstring)."""
        trec, unsup = [], []
        parts = {k: [] for k in ("relevance", "correctness", "correctness_strict", "personalisation",
                                 "personalisation_strict", "focus")}
        for pair, sides in zip(self.pairs, runs):
            for side, tr in sides.items():
                tags = pm.store_tags(pair, side)
                for turn, text in zip(pair.turns, tr.responses):
                    q = turn.query
                    (slot,) = pair.policy.route(q)
                    modes = self.book.exhibited_modes(text)
                    if turn.qtype == "target":
                        hit = float(bool(modes & pm.target_views(pair, slot)))
                        (trec if side == "M" else unsup).append(hit)
                    parts["relevance"].append(
                        np.mean([pair.policy.relevance(q, slot, m) for m in modes]) if modes
                        else pair.policy.relevance(q, slot, pair.policy.vocabularies[slot].generic.name))
                    # strict: any mode the store does not support is an error
                    parts["correctness_strict"].append(float(all(self.book.modes[m].tags & tags for m in modes)))
                    # judge-like: only a false statement about the user is an error; the template
                    # responder states user facts only by echoing the store's own sentences
                    parts["correctness"].append(float(states_only_true_facts(text, pair.stores[side])))
                    supported = pm.supported_views(pair, side, q)[slot]
                    parts["personalisation_strict"].append(float(bool(modes & supported)) if supported
                                                           else float(not modes))
                    # judge-like: with nothing to personalise from, a benign unsupported view is no error
                    parts["personalisation"].append(float(bool(modes & supported)) if supported else 1.0)
                    parts["focus"].append(1.0 if len(modes) <= 1 and ECHO_MARK not in text else 0.5)
        out = {k: float(np.mean(v)) for k, v in parts.items()}
        out["tRec"], out["Unsup"] = float(np.mean(trec)), float(np.mean(unsup))
        out["U"] = (out["relevance"] + out["correctness"] + out["personalisation"] + out["focus"]) / 4.0
        out["U_strict"] = (out["relevance"] + out["correctness_strict"] + out["personalisation_strict"]
                           + out["focus"]) / 4.0
        return out

    def _released(self, pair, tr):
        """Per turn released (slot, view) pairs and fallback flags: the interface's release
        where there is one, else the modes the response exhibits (memory-text methods)."""
        if tr.views is not None:
            return tr.views, tr.fallbacks
        views = [tuple((self.book.modes[m].slot, m) for m in sorted(self.book.exhibited_modes(text)))
                 for text in tr.responses]
        return views, None

    def audit_runs(self, runs, method: str | None = None, cap: float | None = None, K: int | None = None) -> dict:
        """auditor -> prefix -> AuditResult for one set of transcripts.

        ``"embedding"``: the paper's calibrated MiniLM auditor; ``"view"``: the
        likelihood-ratio auditor on the released views (trained on the train split);
        ``"count"``: the untrained target-view count; ``"extra"`` (online EM interfaces
        only, when ``method``, ``cap`` and ``K`` are given): the ablation-aware exact
        likelihood ratio of the selections past the target's pathwise cap.
        """
        T = self.cfg.data.turns
        attrs = [p.target for p in self.pairs]
        splits = [p.split for p in self.pairs]
        t0 = time.perf_counter()
        events = {"M": [], "M'": []}
        for pair, sides in zip(self.pairs, runs):
            for side in events:
                views, fallbacks = self._released(pair, sides[side])
                events[side].append(view_events(pair.policy, pair.target, pair.queries[:T], views, fallbacks))
        res = {"embedding": {}, "view": {}, "count": {}}
        for prefix in self.cfg.audit.prefixes:
            res["view"][prefix] = view_audit(events["M"], events["M'"], attrs, splits, prefix,
                                             smoothing=self.cfg.audit.smoothing)
            res["count"][prefix] = view_audit(events["M"], events["M'"], attrs, splits, prefix, method="count")
        if method in EXTRA_METHODS and cap is not None and K is not None:
            eps = _share(cap, K)
            scores = {side: [extra_selection_llr(pair.policy, pair.target, pair.queries[:T], *self._released(
                pair, sides[side]), pair.stores["M"].items, pair.stores["M'"].items, self.scorer, eps=eps, cap=cap)
                for pair, sides in zip(self.pairs, runs)] for side in ("M", "M'")}
            # untrained (nothing is fitted), so every pair is a test pair
            res["extra"] = {prefix: score_audit(scores["M"], scores["M'"], attrs, ["test"] * len(attrs), prefix)
                            for prefix in self.cfg.audit.prefixes}
        self._tick("view auditors", t0)
        t0 = time.perf_counter()
        texts = [t for sides in runs for side in ("M", "M'") for t in sides[side].responses]
        emb = self.embedder.embed(texts)
        self._tick("embed responses", t0)
        t0 = time.perf_counter()
        emb = emb.reshape(len(runs), 2, T, -1)
        for prefix in self.cfg.audit.prefixes:
            fm = prefix_features(emb[:, 0], prefix)
            fn = prefix_features(emb[:, 1], prefix)
            res["embedding"][prefix] = audit(fm, fn, attrs, splits, prefix, C=self.cfg.audit.C,
                                             calibration=self.cfg.audit.calibration)
        self._tick("auditor fit + eval", t0)
        return res

    def evaluate(self, method: str, cap: float, K: int) -> dict:
        """Metrics of one method, averaged over seeds for the EM methods (paper C.5).

        AUCs are the mean over seeds of the macro-AUC over attributes, with a 95%
        pair-level bootstrap interval (test pairs resampled within attributes, all seeds
        of a pair kept together; the auditor fits are held fixed).
        """
        seeds = list(self.cfg.run.seeds) if method in DP_METHODS else [0]
        per_seed, spent, recon = [], [], []
        identical = False
        for seed in seeds:
            runs = self.transcripts(method, seed, cap, K)
            identical = all(r["M"].identical_conditioning for r in runs)
            per_seed.append({"util": self.utility(runs), "audits": self.audit_runs(runs, method, cap, K)})
            spent += [r["M"].target_spent for r in runs] + [r["M'"].target_spent for r in runs]
            recon += [r["M"].target_reconstructed for r in runs] + [r["M'"].target_reconstructed for r in runs]
        out = {"method": method, "cap": cap, "K": K, "seeds": seeds, "identical": identical}
        for key in per_seed[0]["util"]:
            out[key] = float(np.mean([s["util"][key] for s in per_seed]))
        T0 = self.cfg.audit.prefixes[0]
        out["auditors"], out["pooled"] = {}, {}
        for name in [n for n in (*AUDITORS, "extra") if n in per_seed[0]["audits"]]:
            by_prefix = {}
            for prefix in self.cfg.audit.prefixes:
                results = [s["audits"][name][prefix] for s in per_seed]
                est, lo, hi = macro_auc_ci(results, alpha=self.cfg.audit.alpha, n_boot=self.cfg.audit.n_boot,
                                           rng=self.ctx.rng("auc-ci", name, method, cap, K, prefix))
                by_prefix[prefix] = {
                    "auc": est, "auc_ci": (lo, hi), "tpr5": float(np.mean([r.macro_tpr5 for r in results])),
                    "auc_per_attr": {a: float(np.mean([r.auc[a] for r in results])) for a in pm.ATTRIBUTES},
                    "clamped_calibrations": int(sum(r.clamped for r in results)),
                    "n_test_pairs": int(sum(len(v) for v in results[0].pos_scores.values())),
                }
            out["auditors"][name] = by_prefix
            pooled = [s["audits"][name][T0].pooled() for s in per_seed]
            out["pooled"][name] = (np.concatenate([p for p, _ in pooled]), np.concatenate([n for _, n in pooled]))
        out["by_prefix"] = out["auditors"]["embedding"]
        main = out["by_prefix"][T0]
        out["auc"], out["auc_ci"], out["tpr5"] = main["auc"], main["auc_ci"], main["tpr5"]
        view = out["auditors"]["view"][T0]
        out["view_auc"], out["view_auc_ci"], out["view_tpr5"] = view["auc"], view["auc_ci"], view["tpr5"]
        count = out["auditors"]["count"][T0]
        out["count_auc"], out["count_auc_ci"] = count["auc"], count["auc_ci"]
        out["_per_seed"] = [s["audits"] for s in per_seed]  # auditor -> prefix -> AuditResult, per seed
        out["booked_max"] = float(max(spent)) if spent else 0.0
        out["reconstructed_max"] = float(max(recon)) if recon else 0.0
        out["reconstructed_mean"] = float(np.mean(recon)) if recon else 0.0
        return out


AUDITORS = ("embedding", "view", "count")
# Online EM interfaces audited by the ablation-aware auditor (Table 4; "extra" in results)
EXTRA_METHODS = ("DP-MemView (on)", "IncompleteCharge", "NoCap")


_ECHO = re.compile(re.escape(ECHO_MARK) + r" (.+?), I took that into account\.")


def _echoed(text: str) -> list[str]:
    """Memory phrases a response states about the user (``Since you mentioned ...``)."""
    return _ECHO.findall(text)


def states_only_true_facts(text: str, store) -> bool:
    """Judge-like correctness: every user fact the response states is in the store."""
    low = [m.lower() for m in store.items]
    return all(any(e.lower() in m for m in low) for e in _echoed(text))
