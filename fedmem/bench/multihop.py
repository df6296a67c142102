"""Offline two-hop QA over a long context (a RULER-HQA stand-in), seeded, shipped as code.

DP-MIND's main tables are multi-hop QA (RULER-HQA: HotpotQA questions whose supporting
paragraphs are hidden among distractor paragraphs). HotpotQA cannot be downloaded here,
so this module generates the same *shape* of task from a seeded grammar:

* a sample holds ``n_chains`` two-hop **chains** of one type, each chain two facts
  ``(a -r1-> b)`` and ``(b -r2-> c)`` about invented entities (names built from
  syllables, so no answer can come from world knowledge);
* one chain is asked about: the question names ``a`` and asks for ``c``, so the answer
  needs both facts and the bridge entity ``b`` appears in neither the question nor the
  answer. The other ``n_chains - 1`` chains are distractors of the same type: their
  facts match the question's relation words exactly as the gold facts do;
* every fact is placed at its own seeded depth in an essay-like haystack (the NIAH
  grammar of :mod:`fedmem.bench.niah`), so the two facts of a chain usually fall in
  different chunks: chunk-only answering cannot join them, a memory that carries the
  first fact forward can.

Chain types (``TYPES``)::

    employer_hq      "{a} works at {b}."              "The headquarters of {b} are located in {c}."
                     Q: "Where are the headquarters of the company that {a} works at located?"
    spouse_birth     "The spouse of {a} is {b}."      "{b} was born in the city of {c}."
                     Q: "In which city was the spouse of {a} born?"
    inventor_school  "The inventor of the {a} is {b}." "{b} studied at the university of {c}."
                     Q: "The inventor of the {a} studied at which university?"

Samples are :class:`~fedmem.bench.niah.NiahSample` records (sentences, questions,
tokens, depths), so they stream and score exactly like NIAH samples. The question also
records its bridge and the two facts' sentence indices (``MultiHopQuestion``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fedmem import _validate as V
from fedmem.bench.niah import NiahQuestion, NiahSample, _essay_sentence, word_token_counter

# Entity name material: syllables, so that names are invented, varied and single words.
_SYL_A = ("ka ve lo mi ra to su ne da fi go ha jo lu ma pe qui ri sa ti vo ze bra cle dro fla gri".split())
_SYL_B = ("ren dal mor vik tes lan bor nix gar lis pen dor vel mak sor tun zel rik fon wen".split())
_SYL_C = ("ia on ar ex us en ix or um el".split())
_FIRST = ("Amara Bruno Celia Dorian Elio Farah Gideon Hana Ilya Jonas Kaia Leandro Mirela Nadia Oren "
          "Priya Quentin Rosa Soren Talia Ugo Vera Wendell Xenia Yusuf Zora").split()
_GADGET_ADJ = ("copper glass folding steam pocket solar tidal woven hollow spiral iron amber").split()
_GADGET_NOUN = ("loom lantern compass kettle clock press pump sextant telescope bellows engine harp").split()

TYPES: dict[str, tuple[str, str, str, str, str, str]] = {
    # name: (hop-1 fact, hop-2 fact, question, kind of a, kind of b, kind of c)
    "employer_hq": ("{a} works at {b}.", "The headquarters of {b} are located in {c}.",
                    "Where are the headquarters of the company that {a} works at located?",
                    "person", "org", "place"),
    "spouse_birth": ("The spouse of {a} is {b}.", "{b} was born in the city of {c}.",
                     "In which city was the spouse of {a} born?", "person", "person", "place"),
    "inventor_school": ("The inventor of the {a} is {b}.", "{b} studied at the university of {c}.",
                        "The inventor of the {a} studied at which university?", "gadget", "person", "place"),
}


@dataclass(frozen=True)
class MultiHopQuestion(NiahQuestion):
    bridge: str = ""
    fact_positions: tuple[int, int] = (0, 0)  # sentence indices of the hop-1 and hop-2 facts


def _word(rng: np.random.Generator) -> str:
    w = _SYL_A[rng.integers(len(_SYL_A))] + _SYL_B[rng.integers(len(_SYL_B))]
    if rng.random() < 0.5:
        w += _SYL_C[rng.integers(len(_SYL_C))]
    return w.capitalize()


def _entity(kind: str, rng: np.random.Generator, taken: set) -> str:
    """A fresh entity of ``kind``; no word of it is shared with any earlier entity of the sample."""
    while True:
        if kind == "person":
            e = f"{_FIRST[rng.integers(len(_FIRST))]} {_word(rng)}"
        elif kind == "gadget":
            e = f"{_GADGET_ADJ[rng.integers(len(_GADGET_ADJ))]} {_GADGET_NOUN[rng.integers(len(_GADGET_NOUN))]}"
        else:  # org, place
            e = _word(rng)
        words = {w.lower() for w in e.split()}
        if not words & taken:
            taken.update(words)
            return e


def make_multihop_sample(length_tokens: int, *, chain_type: str, rng: np.random.Generator,
                         count_tokens: Callable[[str], int], n_chains: int = 6) -> NiahSample:
    """One two-hop sample of about ``length_tokens`` tokens (never fewer); one question."""
    V.positive_int("length_tokens", length_tokens, minimum=64)
    if chain_type not in TYPES:
        raise ValueError(f"chain_type must be one of {sorted(TYPES)}. Found {chain_type!r}.")
    n_chains = V.positive_int("n_chains", n_chains, minimum=1)
    f1, f2, qt, ka, kb, kc = TYPES[chain_type]
    taken: set = set()
    chains = []
    for _ in range(n_chains):
        a, b, c = _entity(ka, rng, taken), _entity(kb, rng, taken), _entity(kc, rng, taken)
        chains.append((a, b, c))
    facts = []  # chain j's hop-1 fact at 2j, its hop-2 fact at 2j + 1
    for j, (a, b, c) in enumerate(chains):
        facts += [(j, 0, f1.format(a=a, b=b)), (j, 1, f2.format(b=b, c=c))]
    cnt = word_token_counter(count_tokens)

    total = sum(cnt(s) for _, _, s in facts)
    sentences: list[str] = []
    while total < length_tokens:
        s = _essay_sentence(rng)
        sentences.append(s)
        total += cnt(s)
    depths = rng.uniform(0.0, 1.0, size=len(facts))
    slots = np.minimum((depths * (len(sentences) + 1)).astype(int), len(sentences))
    # Insert from the deepest slot down so earlier slots keep their meaning; equal slots
    # keep the facts' order.
    order = sorted(range(len(facts)), key=lambda i: (slots[i], i), reverse=True)
    for i in order:
        sentences.insert(int(slots[i]), facts[i][2])
    asked = int(rng.integers(n_chains))
    a, b, c = chains[asked]
    pos = tuple(sentences.index(facts[2 * asked + h][2]) for h in (0, 1))
    q = MultiHopQuestion(qt.format(a=a), (c,), a, bridge=b, fact_positions=pos)
    return NiahSample(tuple(sentences), (q,), int(total), tuple(float(d) for d in np.sort(depths)))
