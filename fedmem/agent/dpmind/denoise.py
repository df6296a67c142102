"""DP-MIND Algorithm 2: local alignment and longest unambiguous span restoration.

During perturbation the client records the token alignment
Pi = {(w'_t, w_t)}_{t=1..L} (Algorithm 1, line 2). A restoration rule maps a perturbed
span (w'_t, ..., w'_{t+k-1}) to its clean span (w_t, ..., w_{t+k-1}) for 1 <= k <= K,
and is valid only when the perturbed span has an unambiguous clean counterpart: every
occurrence of the perturbed span in C' aligns with the same clean span (Sec. 4.3).
``Denoise(A_DP, Pi, K)`` tokenizes the answer and, scanning left to right, replaces the
longest valid span starting at each position (Algorithm 2, lines 4-11).

Instead of materialising BuildRestoreMap for every span of a million-token context
(up to K*L entries), :class:`Alignment` keeps an inverted index from perturbed token to
positions and answers ``LongestRestore`` on demand for the (short) answer. The result
is the same as the full map restricted to spans that occur in the answer.

The alignment holds clean tokens: it lives only inside the client object and is never
part of what is sent to the external model (see ``DPMindClient``).
"""

from __future__ import annotations

import numpy as np

from fedmem import _validate as V


class Alignment:
    """Pi: the clean and perturbed token ids, position by position (local only)."""

    def __init__(self):
        self._clean: list[np.ndarray] = []
        self._pert: list[np.ndarray] = []
        self._frozen = False
        self._index: tuple[np.ndarray, np.ndarray] | None = None

    def extend(self, clean: np.ndarray, perturbed: np.ndarray) -> None:
        if self._frozen:
            raise RuntimeError("alignment is frozen; it cannot grow after restoration started")
        c, p = np.asarray(clean, dtype=np.int64), np.asarray(perturbed, dtype=np.int64)
        if c.shape != p.shape or c.ndim != 1:
            raise ValueError(f"clean and perturbed must be 1-d of equal length. Found {c.shape} and {p.shape}.")
        self._clean.append(c)
        self._pert.append(p)

    def __len__(self) -> int:
        return sum(c.size for c in self._clean)

    def _freeze(self):
        if self._index is None:
            self._frozen = True
            self.clean = np.concatenate(self._clean) if self._clean else np.zeros(0, np.int64)
            self.perturbed = np.concatenate(self._pert) if self._pert else np.zeros(0, np.int64)
            self._clean, self._pert = [self.clean], [self.perturbed]
            order = np.argsort(self.perturbed, kind="stable")
            keys = self.perturbed[order]
            self._index = (order, keys)
        return self._index

    def positions(self, token: int) -> np.ndarray:
        """Positions t with w'_t == token (ascending)."""
        order, keys = self._freeze()
        lo, hi = np.searchsorted(keys, token, "left"), np.searchsorted(keys, token, "right")
        return order[lo:hi]

    def restore_span(self, span: np.ndarray) -> np.ndarray | None:
        """The clean span aligned with every occurrence of perturbed ``span``, or None if absent or ambiguous."""
        self._freeze()
        span = np.asarray(span, dtype=np.int64)
        k = span.size
        pos = self.positions(int(span[0]))
        pos = pos[pos + k <= self.perturbed.size]
        for j in range(1, k):
            if pos.size == 0:
                break
            pos = pos[self.perturbed[pos + j] == span[j]]
        if pos.size == 0:
            return None
        clean = self.clean[pos[:, None] + np.arange(k)[None, :]]
        if np.any(clean != clean[0]):
            return None  # ambiguous: the same perturbed span came from different clean spans
        return clean[0]


def longest_restore(tokens: np.ndarray, start: int, alignment: Alignment, max_span: int):
    """LongestRestore (Algorithm 2, line 5): (clean span, k) for the longest valid k, or (None, 0)."""
    upper = min(max_span, tokens.size - start)
    for k in range(upper, 0, -1):
        clean = alignment.restore_span(tokens[start:start + k])
        if clean is not None:
            return clean, k
    return None, 0


def denoise_ids(tokens, alignment: Alignment, max_span: int) -> tuple[np.ndarray, int]:
    """Algorithm 2 on token ids. Returns (restored ids, number of tokens changed)."""
    V.positive_int("max_span", max_span)
    toks = np.asarray(tokens, dtype=np.int64)
    out: list[np.ndarray] = []
    changed = 0
    r = 0
    while r < toks.size:
        clean, k = longest_restore(toks, r, alignment, max_span)
        if k > 0:
            out.append(clean)
            changed += int(np.sum(clean != toks[r:r + k]))
            r += k
        else:
            out.append(toks[r:r + 1])
            r += 1
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), changed
