"""PairedMem generator, responder/baselines, auditor and the memview.* experiments."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter

import numpy as np
import pytest

import fedmem.embeddings as E
from fedmem.agent.llm import ECHO_MARK, TemplateResponder
from fedmem.agent.memview.baselines import output_filter, run_method
from fedmem.experiments.memview import EXPERIMENTS, UTILITY_COLUMNS, _auc_ceiling, _states_only_true_facts
from fedmem.attacks.memview_auditor import audit, prefix_features
from fedmem.experiments import pairedmem as pm
from fedmem.errors import ScenarioError
from fedmem.report import RunContext
from fedmem.registry import load_scenario


@pytest.fixture(scope="module")
def pairs():
    return pm.generate(48, np.random.default_rng(3), turns=32)


# ------------------------------------------------------------------ generator (Appendix C.2)
def test_pairedmem_construction(pairs):
    assert Counter(p.target for p in pairs) == {a: 12 for a in pm.ATTRIBUTES}
    assert sum(p.overlap for p in pairs) == 4 * round(0.25 * 12)
    for p in pairs:
        assert p.policy.layout.n == 28 and len(p.policy.layout.slot_names) == 6
        assert all(4 <= len(g) <= 6 for g in p.policy.groups.values())
        assert bool(p.policy.overlapping_pairs()) == p.overlap
        if p.overlap:
            ia = p.policy.groups[p.target]
            assert any(ia & g for a, g in p.policy.groups.items() if a != p.target)
        pm.validate_pair(p)
        for b in range(2):
            block = p.turns[16 * b:16 * (b + 1)]
            assert Counter(t.qtype for t in block) == {"target": 8, "neutral": 4, "distractor": 4}
        ia = p.policy.groups[p.target]
        for t in p.turns:
            (slot,) = p.policy.route(t.query)
            hits = bool(set(p.policy.read_set(t.query, slot)) & ia)
            assert hits == (t.qtype == "target")
    texts = Counter(m for p in pairs for m in p.stores["M"].items)
    assert len(texts) > 100  # varied wording: no single string marks a side


def test_validator_rejects_a_tampered_pair(pairs):
    import dataclasses

    p = pairs[0]
    outside = next(i for i in range(28) if i not in p.policy.groups[p.target])
    items = list(p.stores["M'"].items)
    items[outside] = items[outside] + " Extra."
    bad = dataclasses.replace(p, stores={"M": p.stores["M"], "M'": pm.MemoryStore(p.policy.layout, tuple(items))})
    with pytest.raises(ValueError, match="outside I_"):
        pm.validate_pair(bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_pairs": 10}, "multiple of 4"), ({"n_pairs": 8}, "no test pairs"),
    ({"n_pairs": 16, "overlap_fraction": 1.5}, "overlap_fraction"),
    ({"n_pairs": 16, "split": (0.5, 0.5, 0.0)}, "split"),
])
def test_generator_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pm.generate(rng=np.random.default_rng(0), **kwargs)


# ------------------------------------------------------------------ responder and baselines
def test_output_filter_deletes_sensitive_sentences():
    text = "Try lentils. Since you mentioned blood sugar, I took that into account. Rest well."
    assert output_filter(text, pm.SENSITIVE_PHRASES) == "Try lentils. Rest well."


def test_template_responder_reads_raw_memory_and_filters(pairs):
    responder = TemplateResponder(pm.template_book())
    p = next(x for x in pairs if x.target == "diabetes")
    t = next(t for t in p.turns if t.qtype == "target" and p.policy.route(t.query)[0] == "food"
             and any(p.tags["M"][i] for i in p.policy.read_set(t.query, "food")))
    raw_m = run_method("RawReadSet", p, "M", responder, turns=32, cap=2.0, K=3).responses
    raw_n = run_method("RawReadSet", p, "M'", responder, turns=32, cap=2.0, K=3).responses
    k = p.turns.index(t)
    assert raw_m[k] != raw_n[k] and ECHO_MARK in raw_m[k]
    assert "low_glycemic" in pm.template_book().exhibited_modes(raw_m[k])
    filt = run_method("OutputFilter", p, "M", responder, turns=32, cap=2.0, K=3,
                      sensitive_phrases=pm.SENSITIVE_PHRASES).responses
    assert ECHO_MARK not in filt[k] and "low_glycemic" in pm.template_book().exhibited_modes(filt[k])
    for m in ("GenericOnly", "TypedMask"):
        a = run_method(m, p, "M", responder, turns=32, cap=2.0, K=3).responses
        b = run_method(m, p, "M'", responder, turns=32, cap=2.0, K=3).responses
        assert a == b  # identical conditioning by construction


# ------------------------------------------------------------------ auditor
def test_auditor_separates_and_ignores():
    rng = np.random.default_rng(0)
    n, T, d = 40, 4, 16
    base = rng.normal(size=(n, T, d))
    shift = np.zeros(d)
    shift[0] = 3.0
    attrs = ["a"] * n
    splits = ["train"] * 20 + ["val"] * 8 + ["test"] * 12
    same = audit(prefix_features(base, T), prefix_features(base, T), attrs, splits, T)
    assert same.macro_auc == 0.5
    sep = audit(prefix_features(base + shift, T), prefix_features(base, T), attrs, splits, T)
    assert sep.macro_auc > 0.9
    with pytest.raises(ValueError, match="prefix"):
        prefix_features(base, T + 1)


def test_auc_ceiling_values():
    assert _auc_ceiling(0.0) == pytest.approx(0.5, abs=1e-6)
    assert _auc_ceiling(math.inf) == 1.0
    assert 0.5 < _auc_ceiling(2.0) < 1.0


def test_minilm_embedder_is_offline_and_cached():
    emb = E.shared_embedder()
    x = emb.embed(["low-glycemic dinner ideas", "low-glycemic dinner ideas", "a walk after meals"])
    assert x.shape == (3, 384)
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(x[0], x[1])
    before = emb.encoded
    emb.embed(["a walk after meals"])
    assert emb.encoded == before


# ------------------------------------------------------------------ experiments (small)
class _HashEmbedder:
    """Bag-of-words hashing embedder: fast stand-in for MiniLM in pipeline tests."""

    encoded = 0

    def embed(self, texts):
        out = np.zeros((len(texts), 256))
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z\-]+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest()[:6], 16) % 256] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def _run(kind, path, tmp_path, monkeypatch, overrides):
    monkeypatch.setattr(E, "_SHARED", _HashEmbedder())
    sc = load_scenario(path, overrides)
    assert sc.experiment is EXPERIMENTS[kind]
    ctx = RunContext(tmp_path, sc.config.seed, show_progress=False, quiet=True)
    return sc.experiment.run(sc.config, ctx)


SMALL = ["data.pairs=48", "run.seeds=[0]", "audit.n_boot=50"]


def test_table2_small_run_orders_methods(tmp_path, monkeypatch):
    res = _run("memview.table2", "scenarios/memview_table2.toml", tmp_path, monkeypatch, SMALL)
    m = res.metrics["methods"]
    assert m["GenericOnly"]["auc"] == 0.5 and m["TypedMask"]["auc"] == 0.5
    for raw in ("RawReadSet", "TaskMin", "OutputFilter"):
        assert m[raw]["auc"] >= 0.75
    for dp in ("DP-MemView (on)", "DP-MemView (pre)"):
        assert m[dp]["booked_max"] <= 2.0 + 1e-12
        assert m[dp]["tRec"] > m["GenericOnly"]["tRec"]
    assert res.ok and not any(c["violated"] for c in res.metrics["ceiling"].values())
    assert {"paper AUC", "AUC view-LR [CI]", "U strict"} <= set(res.tables[0].columns)
    for name, r in m.items():
        for key in ("auc", "view_auc", "count_auc"):
            lo, hi = r[f"{key}_ci"]
            assert lo <= r[key] <= hi, (name, key)
        parts = [r[k] for k in ("relevance", "correctness", "personalisation", "focus")]
        assert all(0 <= x <= 1 for x in parts) and r["U"] == pytest.approx(np.mean(parts))
        assert r["correctness"] >= r["correctness_strict"] and r["U"] >= r["U_strict"]
    for name in ("GenericOnly", "TypedMask"):  # identical conditioning: every auditor at chance
        assert m[name]["view_auc"] == m[name]["count_auc"] == 0.5
    assert m["RawReadSet"]["count_auc"] > 0.9  # the exhibited modes reveal raw memory too
    # a DP mode that picks unsupported views is an error only under the strict rule
    dp = m["DP-MemView (on)"]
    assert dp["correctness"] == 1.0 > dp["correctness_strict"]
    assert any(t.title.startswith("Utility decomposition") for t in res.tables)


def test_table4_small_run_reports_bounds(tmp_path, monkeypatch):
    res = _run("memview.table4", "scenarios/memview_table4.toml", tmp_path, monkeypatch, SMALL)
    v = res.metrics["variants"]
    assert v["NoCap"]["reconstructed_max"] > 2.0
    assert v["IncompleteCharge"]["reconstructed_max"] > 2.0 >= v["IncompleteCharge"]["booked_max"]
    assert v["DP-MemView (on)"]["reconstructed_max"] <= 2.0 + 1e-12
    assert v["CappedArgmax"]["auc"] > v["DP-MemView (on)"]["auc"]
    assert v["CappedArgmax"]["view_auc_ci"][0] > v["DP-MemView (on)"]["view_auc_ci"][1]
    diff = next(t for t in res.tables if t.title.startswith("Extra leakage"))
    verdict = {(row[0], row[1]): row[3] for row in diff.rows}
    assert verdict[("CappedArgmax", "view")] == "yes"
    assert set(UTILITY_COLUMNS) <= set(v["NoCap"])
    # ablation-aware auditor: reported beside the paper; the compliant interface releases no
    # selection past the cap (AUC exactly 0.5, never separated)
    ab = res.metrics["ablation_auditor"]
    assert set(ab) == {"DP-MemView (on)", "IncompleteCharge", "NoCap"}
    assert ab["DP-MemView (on)"]["auc"] == 0.5 and not ab["DP-MemView (on)"]["separated"]
    assert ab["DP-MemView (on)"]["nonzero_scores"] == 0.0 < ab["NoCap"]["nonzero_scores"]
    assert ab["NoCap"]["paper_auc"] == 0.599 and ab["NoCap"]["paper_diff"] == pytest.approx(0.109)
    assert any(t.title.startswith("Ablation-aware auditor") for t in res.tables)


def test_judge_like_correctness_penalises_false_user_facts_only():
    from fedmem.agent.llm import ECHO_MARK

    p = pm.generate(16, np.random.default_rng(0), turns=16)[0]
    m, n = p.stores["M"], p.stores["M'"]
    phrase = next(ph for ph in pm.LEXICON[p.target]
                  if any(ph in x.lower() for x in m.items) and not any(ph in x.lower() for x in n.items))
    echo = f"Try this. {ECHO_MARK} {phrase}, I took that into account. Hope this helps."
    assert _states_only_true_facts(echo, m)
    assert _states_only_true_facts("Batch-cook beans and rice. Hope this helps.", n)  # benign view, no user fact
    assert not _states_only_true_facts(echo, n)  # companion: the same statement is false about M'
