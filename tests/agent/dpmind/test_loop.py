"""DP-MIND loop side: Algorithm 2 denoising, Algorithm 1 chunk loop and its external view,
metrics (Appendix B.2), the NIAH generator and the ``dpmind.niah`` scenario."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fedmem.agent.dpmind.denoise import Alignment, denoise_ids
from fedmem.agent.dpmind.embeddings import load_minilm
from fedmem.agent.dpmind.loop import (FINAL_ANSWER_PROMPT, MEMORY_UPDATE_PROMPT, NO_MEMORY, DPMindClient,
                                      ExtractiveMemoryAgent, extract_answer)
from fedmem.agent.dpmind.metrics import exact_match, f1_score, normalize_answer, score, sub_exact_match
from fedmem.agent.dpmind.perturb import TokenPerturber, cached_projector
from fedmem.bench.niah import VARIANTS, make_sample, sentence_stream
from fedmem.dp import MetricLaplace


@pytest.fixture(scope="session")
def minilm():
    return load_minilm()


@pytest.fixture(scope="session")
def ivf(minilm):
    return cached_projector(minilm[0], "ivf", n_clusters=256, n_probe=24, threads=1)


def client(minilm, ivf, eps, **kw):
    table, codec = minilm
    return DPMindClient(TokenPerturber(MetricLaplace(eps, 384), table, ivf), codec, **kw)


# ------------------------------------------------------------------ Algorithm 2
def _align(clean, pert):
    a = Alignment()
    a.extend(np.array(clean), np.array(pert))
    return a


def test_denoise_restores_unambiguous_span_and_prefers_longest():
    # clean:     10 11 12 13 | 10 14
    # perturbed: 20 21 22 13 | 20 14      (20 came from 10 twice: unambiguous)
    a = _align([10, 11, 12, 13, 10, 14], [20, 21, 22, 13, 20, 14])
    out, changed = denoise_ids([20, 21, 22, 99], a, max_span=4)
    assert out.tolist() == [10, 11, 12, 99] and changed == 3
    out, _ = denoise_ids([20, 21, 22], a, max_span=1)  # K = 1: token by token, same result here
    assert out.tolist() == [10, 11, 12]


def test_denoise_leaves_ambiguous_spans_alone():
    # 30 came from 1 at one position and from 2 at another: ambiguous alone,
    # but the longer span (30, 31) occurs once and is restored.
    a = _align([1, 5, 2, 6], [30, 31, 30, 32])
    assert denoise_ids([30], a, 4)[0].tolist() == [30]
    assert denoise_ids([30, 31], a, 4)[0].tolist() == [1, 5]
    assert denoise_ids([30, 31], a, 1)[0].tolist() == [30, 5]  # K=1 cannot use the longer span
    assert denoise_ids([], a, 4)[0].size == 0
    with pytest.raises(ValueError, match="max_span"):
        denoise_ids([30], a, 0)


def test_client_denoise_restores_perturbed_needle(minilm, ivf):
    table, codec = minilm
    c = client(minilm, ivf, 90.0, chunk_tokens=512)
    text = "The sky is blue. " * 200 + "One of the special magic numbers for fluffy-chair is: 4821937. " + \
        "The sky is blue. " * 50
    c.ingest(text, np.random.default_rng(10))
    q = "What is the special magic number for fluffy-chair mentioned in the provided text?"
    ans = c.ask(q, ExtractiveMemoryAgent())
    # Seed chosen so that the needle is corrupted; the local restoration repairs it.
    assert sub_exact_match(ans.dp_answer, "4821937") == 0.0
    assert ans.final_answer == "4821937" and ans.restored_tokens > 0
    assert "4821937" not in " ".join(m["content"] for m in ans.transcript)  # restoration is local


# ------------------------------------------------ Algorithm 1 and its external view
class Recorder:
    """A responder that records every message and delegates to the extractive agent."""

    def __init__(self):
        self.seen: list[str] = []
        self.agent = ExtractiveMemoryAgent()

    def respond(self, messages):
        self.seen += [m["content"] for m in messages]
        reply = self.agent.respond(messages)
        self.seen.append(reply)
        return reply


def test_external_view_never_contains_a_clean_token_that_was_perturbed_away(minilm, ivf):
    table, codec = minilm
    rng = np.random.default_rng(8)
    words = ["zebra", "violin", "harbor", "maple", "quartz", "falcon", "lantern", "meadow", "comet", "otter"]
    text = " ".join(f"The secret {w} code for agent {i} is {rng.integers(10**6, 10**7)}."
                    for i, w in enumerate(words * 30))
    c = client(minilm, ivf, 60.0, chunk_tokens=256)
    c.ingest(text, np.random.default_rng(1))
    q = "What is the secret code for agent seven?"
    rec = Recorder()
    ans = c.ask(q, rec)
    ans2 = c.ask(q, rec, mode="chunk_only")
    view = rec.seen + [m["content"] for m in ans.transcript + ans2.transcript] + list(c.chunks)
    clean_ids = codec.encode(text)
    pert_ids = np.concatenate([codec.encode(ch) for ch in c.chunks])
    # Tokens of the clean context that the perturbation removed everywhere.
    gone = set(clean_ids.tolist()) - set(pert_ids.tolist()) - set(codec.encode(q).tolist())
    assert len(gone) > 20  # the test has something to find
    for msg in view:
        leaked = gone & set(codec.encode(msg).tolist())
        # The fixed prompt templates are public text, not context.
        template = set(codec.encode(MEMORY_UPDATE_PROMPT + FINAL_ANSWER_PROMPT + NO_MEMORY).tolist())
        assert not (leaked - template), codec.tokens(sorted(leaked - template))
    # Pi is not reachable through public attributes.
    assert not any(isinstance(getattr(c, n), Alignment) for n in dir(c) if not n.startswith("_"))


def test_prompts_are_the_papers_and_answer_extraction():
    assert "Updated memory:" in MEMORY_UPDATE_PROMPT and "<section>" in MEMORY_UPDATE_PROMPT
    assert "Therefore, the answer is (insert answer here)" in FINAL_ANSWER_PROMPT
    assert extract_answer("blah. Therefore, the answer is 4821937.") == "4821937"
    assert extract_answer("Therefore, the answer is (abc-12)") == "abc-12"
    assert extract_answer("no marker") == "no marker"


def test_memory_is_bounded_and_loop_answers_clean_context(minilm, ivf):
    agent = ExtractiveMemoryAgent(memory_sentences=2)
    q = "What is the special magic number for fluffy-chair?"
    mem = agent.update(q, NO_MEMORY, "The special magic number for x is 1. The special magic thing. "
                                     "Special magic number for fluffy-chair is: 77. Unrelated.")
    assert len(mem.splitlines()) == 2 and "77" in mem
    assert agent.answer(q, mem) == "77"
    assert agent.update(q, NO_MEMORY, "nothing here.") == NO_MEMORY


def test_niah_high_epsilon_memory_and_chunk_only(minilm, ivf):
    table, codec = minilm
    count = lambda s: int(codec.encode(s).size)  # noqa: E731
    for v in VARIANTS:
        hay, needle = VARIANTS[v]
        # 1,500 tokens in chunks of 350 (was 3,000 in 700): still 5 chunks with
        # distractor keys, so memory vs chunk-only is exercised as before.
        s = make_sample(1500, haystack=hay, needle=needle, task="multi_key", rng=np.random.default_rng(2),
                        count_tokens=count)
        c = client(minilm, ivf, 5000.0, chunk_tokens=350)
        c.ingest(sentence_stream(s, 40), np.random.default_rng(3))
        q = s.questions[0]
        mem = score(c.ask(q.question, ExtractiveMemoryAgent()).final_answer, q.answers)
        chunk = score(c.ask(q.question, ExtractiveMemoryAgent(), mode="chunk_only").final_answer, q.answers)
        assert mem["em"] == 1.0 and mem["subem"] >= chunk["subem"]


# ------------------------------------------------------------------- bad input
def test_bad_context_inputs(minilm, ivf):
    table, codec = minilm
    c = client(minilm, ivf, 100.0)
    for bad in ("", "   \n\t "):
        with pytest.raises(ValueError, match="at least one token"):
            c.ingest(bad, np.random.default_rng(0))
    with pytest.raises(ValueError, match="UTF-8"):
        c.ingest(b"caf\xe9 \xff", np.random.default_rng(0))
    with pytest.raises(TypeError, match="context"):
        c.ingest(42, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="ingest"):
        c.ask("q?", ExtractiveMemoryAgent())
    # Only special tokens: perturbed like any other input, output never special.
    n = c.ingest("[CLS] [SEP] [MASK] [PAD] [UNK]", np.random.default_rng(0))
    assert n == 5
    out = codec.encode(c.chunks[0])
    assert out.size >= 1 and not set(out.tolist()) & set(table.special_ids)
    assert c.ingest("caf\u00e9 \u2603".encode("utf-8"), np.random.default_rng(0)) >= 1
    with pytest.raises(ValueError, match="question"):
        c.ask("  ", ExtractiveMemoryAgent())
    with pytest.raises(ValueError, match="mode"):
        c.ask("q?", ExtractiveMemoryAgent(), mode="bogus")
    with pytest.raises(ValueError, match="chunk_tokens"):
        client(minilm, ivf, 100.0, chunk_tokens=0)


# ---------------------------------------------------------------- metrics (B.2)
def test_metrics_normalisation_and_scores():
    assert normalize_answer("The  Answer, is: A 42!") == "answer is 42"
    assert exact_match("the 4821937.", "4821937") == 1.0
    assert exact_match("4821937 maybe", "4821937") == 0.0
    assert sub_exact_match("I think it is 4821937 maybe", "4821937") == 1.0
    assert sub_exact_match("482193", "4821937") == 0.0
    assert f1_score("red blue", "blue green") == pytest.approx(0.5)
    assert f1_score("", "x") == 0.0
    assert exact_match("b", ["a", "b"]) == 1.0  # max over gold answers
    with pytest.raises(ValueError, match="gold"):
        exact_match("a", [])


# --------------------------------------------------------------------- NIAH
def test_niah_generator_lengths_needles_and_determinism(minilm):
    table, codec = minilm
    count = lambda s: int(codec.encode(s).size)  # noqa: E731
    a = make_sample(2000, haystack="essay", needle="uuid", task="multi_query", n_keys=3,
                    rng=np.random.default_rng(5), count_tokens=count)
    b = make_sample(2000, haystack="essay", needle="uuid", task="multi_query", n_keys=3,
                    rng=np.random.default_rng(5), count_tokens=count)
    assert a == b and len(a.questions) == 3
    assert a.tokens >= 2000 and a.tokens == codec.encode(a.text).size
    for q in a.questions:
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", q.answers[0])
        assert f"for {q.key} is: {q.answers[0]}." in a.text
    r = make_sample(500, haystack="repetitive", needle="numeric", task="single", rng=np.random.default_rng(1),
                    count_tokens=count)
    assert len(r.questions) == 1 and re.fullmatch(r"\d{7}", r.questions[0].answers[0])
    with pytest.raises(ValueError, match="task"):
        make_sample(500, haystack="essay", needle="numeric", task="x", rng=np.random.default_rng(1),
                    count_tokens=count)


# ----------------------------------------------------------------- scenario
def test_scenario_runs_shrunk(tmp_path):
    from fedmem.cli import run_scenario

    payload, result, out = run_scenario(
        "scenarios/dpmind_niah.toml",
        ["niah.lengths=[800]", "niah.samples=1", "niah.variants=['essay_numeric']",
         "niah.tasks=['single', 'multi_query']", "niah.n_keys=2", "privacy.epsilons=[90.0, 3000.0]",
         "loop.chunk_tokens=300", "stats.bootstrap=200"],
        out=tmp_path, show_progress=False)
    m = payload["metrics"]
    assert m["subem"]["memory+denoise@eps=3000.0@L=800"] == 100.0
    assert m["unchanged_token_fraction"]["90.0"] < m["unchanged_token_fraction"]["3000.0"]
    assert (tmp_path / "niah_subem_vs_epsilon.png").is_file()
    json.loads((tmp_path / "results.json").read_text())


def test_scenario_rejects_bad_keys(tmp_path):
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    with pytest.raises(ScenarioError) as exc:
        load_scenario("scenarios/dpmind_niah.toml", ["privacy.epsilons=[0.0]", "perturb.n_probe=999",
                                                     "niah.tasks=['bogus']"])
    text = str(exc.value)
    assert "privacy.epsilons" in text and "niah.tasks" in text
