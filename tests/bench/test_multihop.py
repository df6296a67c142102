"""Offline two-hop QA (``fedmem.bench.multihop``), the multi-hop extractive agent, and the
``task.benchmark = "multihop"`` mode of the dpmind experiment."""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.agent.dpmind.embeddings import load_minilm
from fedmem.agent.dpmind.loop import DPMindClient, ExtractiveMemoryAgent
from fedmem.agent.dpmind.metrics import sub_exact_match
from fedmem.agent.dpmind.perturb import TokenPerturber, cached_projector
from fedmem.bench.multihop import TYPES, MultiHopQuestion, make_multihop_sample
from fedmem.bench.niah import sentence_stream
from fedmem.dp import MetricLaplace


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def _count(codec):
    return lambda s: int(codec.encode(s).size)


@pytest.mark.parametrize("chain_type", sorted(TYPES))
def test_generator_is_seeded_two_hop_and_has_distractors(minilm, chain_type):
    _, codec = minilm
    kw = dict(chain_type=chain_type, count_tokens=_count(codec), n_chains=5)
    a = make_multihop_sample(1500, rng=np.random.default_rng(4), **kw)
    assert a == make_multihop_sample(1500, rng=np.random.default_rng(4), **kw)
    assert a != make_multihop_sample(1500, rng=np.random.default_rng(5), **kw)
    assert a.tokens >= 1500 and a.tokens == codec.encode(a.text).size
    (q,) = a.questions
    assert isinstance(q, MultiHopQuestion)
    f1, f2, qt = TYPES[chain_type][:3]
    i, j = q.fact_positions
    assert a.sentences[i] == f1.format(a=q.key, b=q.bridge)
    assert a.sentences[j] == f2.format(b=q.bridge, c=q.answers[0])
    # Two hops: neither the bridge nor the answer is in the question.
    assert q.bridge not in q.question and q.answers[0] not in q.question and q.key in q.question
    # Distractors: 4 more chains of the same type, each with its own answer.
    hop2 = [s for s in a.sentences if s.startswith(f2.split("{")[0]) and f2.split("}")[-1].split("{")[0] in s] \
        if not f2.startswith("{") else [s for s in a.sentences if f2.split("}", 1)[1].split("{")[0] in s]
    assert len(hop2) == 5
    # Every word of every entity is unique to it: a bridge cannot be confused by a shared name.
    assert sum(q.bridge.split()[-1] in s for s in a.sentences) == 2


def test_generator_rejects_bad_values(minilm):
    _, codec = minilm
    with pytest.raises(ValueError, match="chain_type must be one of .* Found 'x'"):
        make_multihop_sample(500, chain_type="x", rng=np.random.default_rng(0), count_tokens=_count(codec))
    with pytest.raises(ValueError, match="length_tokens must be >= 64. Found 10"):
        make_multihop_sample(10, chain_type="employer_hq", rng=np.random.default_rng(0), count_tokens=_count(codec))
    with pytest.raises(ValueError, match="n_chains must be >= 1. Found 0"):
        make_multihop_sample(500, chain_type="employer_hq", rng=np.random.default_rng(0),
                             count_tokens=_count(codec), n_chains=0)
    with pytest.raises(ValueError, match="hops must be >= 1. Found 0"):
        ExtractiveMemoryAgent(hops=0)


def _far_apart(codec, chain_type, chunk_tokens, length=1500, seed0=0):
    """A seeded sample whose two gold facts fall in different chunks, neither cut by a chunk boundary."""
    for seed in range(seed0, seed0 + 50):
        s = make_multihop_sample(length, chain_type=chain_type, rng=np.random.default_rng(seed),
                                 count_tokens=_count(codec))
        i, j = s.questions[0].fact_positions
        start = np.concatenate([[0], np.cumsum([codec.encode(x).size for x in s.sentences])])
        chunk = [(start[k] // chunk_tokens, (start[k + 1] - 1) // chunk_tokens) for k in (i, j)]
        if chunk[0][0] == chunk[0][1] and chunk[1][0] == chunk[1][1] and abs(chunk[0][0] - chunk[1][0]) >= 2:
            return s  # each fact inside one chunk, the two at least two chunks apart
    raise AssertionError("no far-apart sample")


@pytest.mark.parametrize("chain_type", sorted(TYPES))
def test_memory_joins_facts_across_chunks_and_chunk_only_cannot(minilm, chain_type):
    """Clean-ish context (epsilon 5000 leaves every token): the 2-hop memory agent answers,
    chunk-only (no propagation) and a 1-hop agent do not. This is what the multihop task
    measures; if the generator put both facts in one chunk, or the agent ignored the
    bridge, this test fails. 1,500 tokens in 5 chunks of 300 (was 3,000 in 8 of
    400): the property needs the two facts two or more chunks apart, not a long context;
    the scenario-scale run is ``fedmem run scenarios/dpmind_multihop.toml`` (docs/dpmind.md)."""
    table, codec = minilm
    proj = cached_projector(table, "cascade", threads=1)
    s = _far_apart(codec, chain_type, 300)
    q = s.questions[0]
    c = DPMindClient(TokenPerturber(MetricLaplace(5000.0, 384), table, proj), codec, chunk_tokens=300)
    c.ingest(sentence_stream(s, 40), np.random.default_rng(1))
    assert c.local_stats()["unchanged_fraction"] == 1.0
    two = ExtractiveMemoryAgent(hops=2)
    assert sub_exact_match(c.ask(q.question, two).final_answer, q.answers) == 1.0
    assert sub_exact_match(c.ask(q.question, two, mode="chunk_only").final_answer, q.answers) == 0.0
    assert sub_exact_match(c.ask(q.question, ExtractiveMemoryAgent(hops=1)).final_answer, q.answers) == 0.0


def test_two_hop_agent_unit_behaviour():
    agent = ExtractiveMemoryAgent(hops=2, memory_sentences=3)
    q = "Where are the headquarters of the company that Vera Kalan works at located?"
    mem = agent.update(q, "No previous memory",
                       "The headquarters of Borex are located in Mitor. Ugo Sadal works at Zenix. "
                       "The headquarters of Quidor are located in Fonel.")
    # Before the bridge is known, hop-2 facts (2 cue words) are kept as candidates.
    assert "Mitor" in mem and "Fonel" in mem
    mem = agent.update(q, mem, "Vera Kalan works at Quidor. The headquarters of Zenix are located in Pelor.")
    assert agent.answer(q, mem) == "Fonel"
    # Chain broken (bridge never linked): no answer rather than the bridge.
    assert agent.answer(q, "Vera Kalan works at Quidor.") == ""


def test_scenario_multihop_mode_runs_shrunk_with_intervals(tmp_path):
    from fedmem.cli import run_scenario

    payload, _, _ = run_scenario(
        "scenarios/dpmind_multihop.toml",
        ["multihop.lengths=[600]", "multihop.samples=2", "multihop.types=['employer_hq', 'spouse_birth']",
         "multihop.n_chains=3", "privacy.epsilons=[3000.0]", "loop.chunk_tokens=200", "stats.bootstrap=200"],
        out=tmp_path, show_progress=False)
    m = payload["metrics"]
    assert m["benchmark"] == "multihop" and m["haystacks_per_setting"] == 4
    iv = m["intervals"]["memory+denoise@eps=3000.0@L=600"]
    assert iv["n_haystacks"] == 4 and iv["subem_ci_method"] == "CP"
    assert iv["subem_ci"][0] <= iv["subem"] <= iv["subem_ci"][1]
    assert m["subem"]["memory+denoise@eps=3000.0@L=600"] == 100.0
    assert (tmp_path / "multihop_subem_vs_epsilon.png").is_file()
