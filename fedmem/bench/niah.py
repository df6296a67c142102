"""RULER-style needle-in-a-haystack (NIAH) generator, fully offline and seeded.

Follows the NIAH protocol used by DP-MIND (Appendix B.1; RULER, Hsieh et al. 2024):

* haystacks: ``repetitive`` (RULER's "The grass is green. The sky is blue. ..." noise)
  or ``essay`` (essay-like prose; RULER uses Paul Graham essays, which cannot be shipped
  or downloaded here, so sentences are generated from a small seeded grammar over a
  fixed English word list: varied, non-repetitive, topical prose);
* needles: ``numeric`` (7-digit numbers) or ``uuid`` (RFC-4122-shaped hex strings),
  written as "One of the special magic {numbers|uuids} for {key} is: {value}.";
* tasks: ``single`` (one needle, one question), ``multi_key`` (``n_keys`` needles with
  distinct keys, the question asks one of them: the others are distractors) and
  ``multi_query`` (``n_keys`` needles, every key is asked as its own question over the
  same context; the sample's score is the mean over its questions).

Length is measured in tokens of the caller's tokenizer (``count_tokens``); the
haystack grows sentence by sentence until the target is reached and needles are
inserted at seeded depths between sentences. The context is returned as a list of
sentence strings so that it can be streamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from fedmem import _validate as V

REPETITIVE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
              "There and back again.")

_ADJ = ("ancient bright calm clever curious daring eager fluffy gentle golden hidden humble jolly "
        "lively lucky mellow misty noble odd patient quiet rapid rusty silent silver smooth sturdy "
        "swift tender tidy vivid wandering wise witty young").split()
_NOUN = ("anchor apple badger basket beacon candle canyon chair cloud comet compass desk falcon "
         "fern garden harbor island kettle lantern maple meadow mirror otter pebble piano quilt "
         "river saddle shell spruce teapot tower valley violin willow").split()
_SUBJ = ["the founder", "the investor", "the engineer", "a small team", "the market", "the startup",
         "every user", "the best programmer", "a good essay", "the first version", "the committee",
         "the customer", "an ambitious student", "the city", "the old company", "the writer"]
_VERB = ["learns", "discovers", "builds", "questions", "ignores", "rewards", "measures", "explains",
         "changes", "values", "imitates", "underestimates", "remembers", "chooses", "finances", "tests"]
_OBJ = ["a new idea", "the hard problem", "the slow process", "their own taste", "the long term",
        "an unusual approach", "the wrong lesson", "a simple product", "the original question",
        "the small details", "an honest answer", "the next decade", "the usual advice", "a risky bet",
        "the quiet work", "the real customers"]
_TAIL = ["because it compounds over time", "when nobody is watching", "long before it is obvious",
         "even if it looks like a toy", "in a way that surprises everyone", "without asking permission",
         "after years of practice", "since the incentives are clear", "as the evidence accumulates",
         "while the rest of the field waits", "and that is usually enough", "despite the usual doubts"]
_OPEN = ["In practice,", "Surprisingly,", "Most of the time,", "Historically,", "In the end,",
         "For this reason,", "Over time,", "Of course,", "At first,", "Sooner or later,"]


@dataclass(frozen=True)
class NiahQuestion:
    question: str
    answers: tuple[str, ...]  # alternative gold answers (metrics take the max)
    key: str


@dataclass(frozen=True)
class NiahSample:
    sentences: tuple[str, ...]   # the context, sentence by sentence (stream it)
    questions: tuple[NiahQuestion, ...]
    tokens: int                  # context length in tokens of the caller's tokenizer
    depths: tuple[float, ...]    # relative positions of the needles

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


def _essay_sentence(rng: np.random.Generator) -> str:
    parts = [_SUBJ[rng.integers(len(_SUBJ))], _VERB[rng.integers(len(_VERB))], _OBJ[rng.integers(len(_OBJ))]]
    if rng.random() < 0.6:
        parts.append(_TAIL[rng.integers(len(_TAIL))])
    s = " ".join(parts)
    if rng.random() < 0.35:
        s = _OPEN[rng.integers(len(_OPEN))] + " " + s
    return s[0].upper() + s[1:] + "."


def _value(kind: str, rng: np.random.Generator, taken: set) -> str:
    while True:
        if kind == "numeric":
            v = str(int(rng.integers(1_000_000, 10_000_000)))
        else:
            h = "".join("0123456789abcdef"[i] for i in rng.integers(0, 16, 32))
            v = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[rng.integers(4)]}{h[17:20]}-{h[20:]}"
        if v not in taken:
            taken.add(v)
            return v


def _key(rng: np.random.Generator, taken: set) -> str:
    while True:
        k = f"{_ADJ[rng.integers(len(_ADJ))]}-{_NOUN[rng.integers(len(_NOUN))]}"
        if k not in taken:
            taken.add(k)
            return k


def word_token_counter(count_tokens):
    """A memoised sentence token counter: word-piece tokenizers split on whitespace first, so
    a sentence's token count is the sum over its words (exact for the MiniLM/BERT tokenizer)."""
    words: dict[str, int] = {}

    def cnt(text: str) -> int:
        total = 0
        for w in text.split():
            if w not in words:
                words[w] = count_tokens(w)
            total += words[w]
        return total

    return cnt


def make_sample(length_tokens: int, *, haystack: str, needle: str, task: str, rng: np.random.Generator,
                count_tokens: Callable[[str], int], n_keys: int = 4) -> NiahSample:
    """One NIAH sample of about ``length_tokens`` tokens (never fewer)."""
    V.positive_int("length_tokens", length_tokens, minimum=64)
    if haystack not in ("repetitive", "essay"):
        raise ValueError(f"haystack must be 'repetitive' or 'essay'. Found {haystack!r}.")
    if needle not in ("numeric", "uuid"):
        raise ValueError(f"needle must be 'numeric' or 'uuid'. Found {needle!r}.")
    if task not in ("single", "multi_key", "multi_query"):
        raise ValueError(f"task must be 'single', 'multi_key' or 'multi_query'. Found {task!r}.")
    n = 1 if task == "single" else V.positive_int("n_keys", n_keys, minimum=2)
    noun = "numbers" if needle == "numeric" else "uuids"
    keys_taken: set = set()
    vals_taken: set = set()
    needles = []
    for _ in range(n):
        k, v = _key(rng, keys_taken), _value(needle, rng, vals_taken)
        needles.append((k, v, f"One of the special magic {noun} for {k} is: {v}."))
    cnt = word_token_counter(count_tokens)

    needle_tokens = sum(cnt(s) for _, _, s in needles)
    # Haystack sentences until the target length is reached.
    sentences: list[str] = []
    total = needle_tokens
    rep = REPETITIVE.split(". ")
    rep = [s if s.endswith(".") else s + "." for s in rep]
    i = 0
    while total < length_tokens:
        s = rep[i % len(rep)] if haystack == "repetitive" else _essay_sentence(rng)
        i += 1
        sentences.append(s)
        total += cnt(s)
    depths = np.sort(rng.uniform(0.0, 1.0, size=n))
    slots = np.minimum((depths * (len(sentences) + 1)).astype(int), len(sentences))
    order = rng.permutation(n)  # which needle goes to which depth
    for j in range(n - 1, -1, -1):
        sentences.insert(int(slots[j]), needles[order[j]][2])
    singular = "number" if needle == "numeric" else "uuid"

    def q(k: str, v: str) -> NiahQuestion:
        return NiahQuestion(f"What is the special magic {singular} for {k} mentioned in the provided text?", (v,), k)

    if task == "multi_query":
        questions = tuple(q(k, v) for k, v, _ in needles)
    else:
        k, v, _ = needles[int(rng.integers(n))]
        questions = (q(k, v),)
    return NiahSample(tuple(sentences), questions, int(total), tuple(float(d) for d in depths))


VARIANTS: dict[str, tuple[str, str]] = {
    # RULER's three NIAH variants used in DP-MIND Appendix B.1
    "repetitive_numeric": ("repetitive", "numeric"),
    "essay_numeric": ("essay", "numeric"),
    "essay_uuid": ("essay", "uuid"),
}


def variant(name: str) -> tuple[str, str]:
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}. Found {name!r}.")
    return VARIANTS[name]


def sentence_stream(sample: NiahSample, piece_sentences: int = 256) -> Sequence[str]:
    """The context as text pieces of ``piece_sentences`` sentences (whitespace-separated)."""
    V.positive_int("piece_sentences", piece_sentences)
    s = sample.sentences
    return [" ".join(s[i:i + piece_sentences]) + " " for i in range(0, len(s), piece_sentences)]
