"""Answer metrics of DP-MIND Appendix B.2: EM, F1 and SubEM after normalisation.

Normalisation (B.2, the SQuAD convention): lowercase, remove punctuation, remove the
articles ``a``, ``an``, ``the``, collapse whitespace. EM is exact string equality of the
normalised strings; F1 is the harmonic mean of token precision and recall over the
normalised whitespace tokens (multiset overlap); SubEM is 1 when the normalised gold
span occurs in the normalised prediction. With several gold answers, each metric is the
maximum over them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be str. Found {type(text).__name__}.")
    s = text.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(gold: str | Iterable[str]) -> list[str]:
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not golds or not all(isinstance(g, str) for g in golds):
        raise ValueError(f"gold must be a string or a non-empty list of strings. Found {gold!r}.")
    return golds


def exact_match(prediction: str, gold: str | Iterable[str]) -> float:
    p = normalize_answer(prediction)
    return float(max(p == normalize_answer(g) for g in _golds(gold)))


def _f1(p: str, g: str) -> float:
    pt, gt = p.split(), g.split()
    if not pt or not gt:
        return float(pt == gt)
    common = sum((Counter(pt) & Counter(gt)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(pt), common / len(gt)
    return 2 * prec * rec / (prec + rec)


def f1_score(prediction: str, gold: str | Iterable[str]) -> float:
    p = normalize_answer(prediction)
    return max(_f1(p, normalize_answer(g)) for g in _golds(gold))


def sub_exact_match(prediction: str, gold: str | Iterable[str]) -> float:
    p = normalize_answer(prediction)
    best = 0.0
    for g in _golds(gold):
        ng = normalize_answer(g)
        if ng and ng in p:  # plain containment of the normalised span, as in B.2
            best = 1.0
    return best


def score(prediction: str, gold: str | Iterable[str]) -> dict[str, float]:
    return {"em": exact_match(prediction, gold), "f1": f1_score(prediction, gold),
            "subem": sub_exact_match(prediction, gold)}
