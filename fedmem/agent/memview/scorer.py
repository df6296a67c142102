"""View scorers ``u_{t,g}(q, v; M_R) in [0, 1]`` with a declared sensitivity (Eq. (5)-(6)).

A scorer reads only the public query, the slot's vocabulary and the current read-set
contents ``M_R`` (never the paired store, never other positions), and declares
``sensitivity`` = Delta_u, a bound on the sup-norm change of its score vector between
adjacent stores (Eq. 6). The interface passes Delta_u to the exponential mechanism.

:class:`PaperScorer` is the fixed scorer of the paper (Appendix C.5)::

    u = 0.4 r(q, v) + 0.4 c(v; M_R) + 0.2 s(v; M_R),  r, c, s in [0, 1]

``r`` is the public relevance of the view to the query intent; ``c`` is 1 when some
read item carries evidence compatible with the view (evidence found by a public phrase
lexicon); ``s`` is the specificity support ``min(1, #supporting items / 2)``. The generic
view has the store-independent ``c = 0.5, s = 0``. Only ``c`` and ``s`` can change
between adjacent stores, each by at most 1, so ``|u_M(v) - u_M'(v)| <= 0.4 + 0.2 = 0.6``:
Delta_u = 0.6, as in the paper.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from fedmem import _validate as V


@runtime_checkable
class Scorer(Protocol):
    sensitivity: float

    def scores(self, policy, query, slot: str, items: Sequence[str], vocabulary=None) -> np.ndarray:  # pragma: no cover
        """Score vector over ``vocabulary.views`` (default ``policy.vocabularies[slot]``), in order."""
        ...


class PhraseLexicon:
    """Public phrase lexicon: evidence tag -> phrases (lower-case substring match)."""

    def __init__(self, phrases: Mapping[str, Sequence[str]]):
        if not phrases:
            raise ValueError("phrases must map at least one evidence tag to phrases. Found none.")
        self._phrases = {t: tuple(p.lower() for p in ps) for t, ps in phrases.items()}
        self._cache: dict[str, frozenset] = {}

    def tags(self, text: str) -> frozenset:
        hit = self._cache.get(text)
        if hit is None:
            low = text.lower()
            hit = frozenset(t for t, ps in self._phrases.items() if any(p in low for p in ps))
            if len(self._cache) < 200_000:
                self._cache[text] = hit
        return hit

    def first_phrase(self, text: str, tag: str) -> str | None:
        low = text.lower()
        for p in self._phrases.get(tag, ()):
            if p in low:
                return p
        return None


class PaperScorer:
    """0.4 r + 0.4 c + 0.2 s (Appendix C.5) with Delta_u = 0.6."""

    W_R, W_C, W_S = 0.4, 0.4, 0.2
    GENERIC_C = 0.5

    def __init__(self, lexicon: PhraseLexicon, sensitivity: float = 0.6):
        if not isinstance(lexicon, PhraseLexicon):
            raise TypeError(f"lexicon must be a PhraseLexicon. Found {type(lexicon).__name__}.")
        self.lexicon = lexicon
        self.sensitivity = V.positive("sensitivity", sensitivity)
        if self.sensitivity < self.W_C + self.W_S - 1e-12:
            raise ValueError(f"sensitivity must be >= {self.W_C + self.W_S:.1f} (the bound of Eq. 6 for this "
                             f"scorer). Found {sensitivity!r}.")

    def scores(self, policy, query, slot: str, items: Sequence[str], vocabulary=None) -> np.ndarray:
        voc = policy.vocabularies[slot] if vocabulary is None else vocabulary
        item_tags = [self.lexicon.tags(m) for m in items]
        out = np.empty(len(voc.views))
        for k, v in enumerate(voc.views):
            r = policy.relevance(query, slot, v.name)
            if v is voc.generic:  # generic view: store-independent
                c, s = self.GENERIC_C, 0.0
            else:
                support = sum(1 for t in item_tags if t & v.supported_by)
                c, s = (1.0 if support else 0.0), min(1.0, support / 2.0)
            out[k] = self.W_R * r + self.W_C * c + self.W_S * s
        return out
