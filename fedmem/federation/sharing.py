"""Fixed-point encoding and additive secret sharing of retrieval candidates (numpy only).

This module is what a shard host runs before anything leaves it (DESIGN.md, "One
federated query, end to end", step 2): it fixed-point encodes its local top-k'
candidates (scores, clipped value vectors, validity flags), padded to a fixed count
``m`` so that message sizes never depend on the data, and splits every ring element
into additive shares, one per compute party. It must stay importable without torch or
CrypTen (shard hosts are numpy-only Ray actors), so it reproduces CrypTen's encoding
rather than calling it.

Ring and encoding (identical to CrypTen 0.4.1's ``FixedPointEncoder`` and
``ArithmeticSharedTensor``): elements of Z_{2^64} stored as ``int64`` with two's
complement wrap-around; a real ``x`` is encoded as ``round(x * 2**FRAC_BITS)``
(CrypTen truncates, ``(scale * x).long()``; rounding halves the encoding error and
yields the same ring element whenever ``x * 2**16`` is an integer). Additive shares
``x_1 + ... + x_n = x (mod 2^64)``: the first ``n-1`` shares are uniform on the ring,
the last is the difference, so any ``n-1`` shares are jointly uniform and independent
of ``x`` (perfect secrecy against a coalition of up to ``n-1`` parties).

What each field of a :class:`SharePacket` holds:

* ``scores``: shares of ``encode(score)`` (scale ``2**FRAC_BITS``);
* ``values``: shares of ``encode(value)`` (scale ``2**FRAC_BITS``);
* ``valid``:  shares of the raw integer flag 0/1 (scale 1, *not* fixed-point), so that
  multiplying the secret selection mask with the values needs no truncation and the
  revealed sum is the exact ring sum of the encoded selected values.

Selection semantics shared by every party implementation (``fedmem.federation.mpc``):
candidates are laid out by ascending global shard id, then candidate index within the
shard (flat index ``j = s * m + c``). ``topk`` selects the ``k`` valid candidates of
highest *encoded* score; ties are broken by lower flat index, i.e. lower (global shard
id, candidate index); invalid rows never count and never displace a valid row; if fewer
than ``k`` are valid, all valid ones are selected. ``threshold`` selects every valid
candidate with ``encode(score) >= encode(threshold)``. ``broadcast`` selects every
valid candidate (shards pad with zero-value dummies flagged valid, so the selected count
is fixed and independent of the data: support-safe, papers/003 Conditions of Validity).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from fedmem import _validate as V

FRAC_BITS = 16
"""CrypTen's default fixed-point precision (``cfg.encoder.precision_bits``)."""

SCALE = 1 << FRAC_BITS

SCORE_BOUND = float(1 << 20)
"""Largest |score| a shard may send. Scores are similarities (|s| <= 1 for unit keys);
the bound keeps every pairwise score difference far inside the signed ring (2^63), which
CrypTen's sign-bit comparison requires."""

MASK_FILL = float(1 << 21)
"""Invalid rows are given the effective score ``-MASK_FILL`` inside the MPC (below every
admissible score), so they never displace a valid candidate in top-k."""

REVEALABLE = frozenset({"sum", "count", "tallies"})
MODES = ("topk", "threshold", "broadcast")

_I64 = np.iinfo(np.int64)


def encode(x) -> np.ndarray:
    """Fixed-point encode reals to ring elements: ``round(x * 2**FRAC_BITS)`` as int64.

    Raises ``ValueError`` for non-finite input or values whose encoding leaves the signed
    64-bit range (|x| >= 2**47).
    """
    arr = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"x must be finite everywhere to be encoded. Found {arr[~np.isfinite(arr)].ravel()[0]!r}.")
    scaled = np.rint(arr * SCALE)
    if np.any(np.abs(scaled) >= 2.0**63):
        raise ValueError(f"x must satisfy |x| < 2**47 to be encoded. Found {arr.ravel()[np.argmax(np.abs(arr))]!r}.")
    return scaled.astype(np.int64)


def decode(x) -> np.ndarray:
    """Decode ring elements (int64, two's complement) back to float64 reals."""
    arr = np.asarray(x)
    if arr.dtype != np.int64:
        raise TypeError(f"x must be an int64 array of ring elements. Found dtype {arr.dtype}.")
    return arr.astype(np.float64) / SCALE


def random_ring(shape, rng: np.random.Generator) -> np.ndarray:
    """Uniform elements of Z_{2^64} as int64 (every bit pattern equally likely)."""
    return rng.integers(_I64.min, _I64.max, size=shape, dtype=np.int64, endpoint=True)


def share(x_int, n_parties: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ring elements into ``n_parties`` additive shares that sum to ``x_int`` mod 2^64."""
    n = V.positive_int("n_parties", n_parties, minimum=2)
    V.rng_check("rng", rng)
    x = np.asarray(x_int)
    if x.dtype != np.int64:
        raise TypeError(f"x_int must be an int64 array of ring elements (use encode). Found dtype {x.dtype}.")
    shares = [random_ring(x.shape, rng) for _ in range(n - 1)]
    last = x.copy()
    with np.errstate(over="ignore"):
        for s in shares:
            last -= s  # int64 arrays wrap modulo 2^64
    shares.append(last)
    return shares


def reconstruct(shares) -> np.ndarray:
    """Sum additive shares modulo 2^64 (the inverse of :func:`share`)."""
    shares = list(shares)
    if not shares:
        raise ValueError("shares must hold at least one share. Found [].")
    out = np.array(shares[0], dtype=np.int64, copy=True)
    with np.errstate(over="ignore"):
        for s in shares[1:]:
            out += np.asarray(s, dtype=np.int64)
    return out


@dataclass(frozen=True)
class SharePacket:
    """What ONE compute party receives from ONE shard host for a batch of ``B`` queries.

    ``scores`` (B, S_h, m), ``values`` (B, S_h, m, d), ``valid`` (B, S_h, m) are int64
    additive shares (see the module docstring for their encodings); ``shard_ids``
    (S_h,) are the plain global ids of the shards on that host (public: which shards
    exist is public). ``m`` is the fixed padded candidate count per shard.
    """

    scores: np.ndarray
    values: np.ndarray
    valid: np.ndarray
    shard_ids: np.ndarray

    def __post_init__(self):
        for name in ("scores", "values", "valid"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int64:
                raise TypeError(f"{name} must be an int64 numpy array of shares. Found {type(arr).__name__}"
                                f"{'' if not isinstance(arr, np.ndarray) else ' of dtype ' + str(arr.dtype)}.")
        ids = np.asarray(self.shard_ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"shard_ids must be a 1-d integer array. Found shape {ids.shape}, dtype {ids.dtype}.")
        if self.scores.ndim != 3:
            raise ValueError(f"scores must have shape (B, S_h, m). Found shape {self.scores.shape}.")
        B, S_h, m = self.scores.shape
        if S_h != ids.shape[0]:
            raise ValueError(f"scores must have one row per shard id ({ids.shape[0]}). Found shape {self.scores.shape}.")
        if self.valid.shape != self.scores.shape:
            raise ValueError(f"valid must have the shape of scores {self.scores.shape}. Found {self.valid.shape}.")
        if self.values.ndim != 4 or self.values.shape[:3] != self.scores.shape:
            raise ValueError(f"values must have shape {self.scores.shape + ('d',)}. Found {self.values.shape}.")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"shard_ids must be distinct. Found {ids.tolist()!r}.")

    @property
    def batch(self) -> int:
        return self.scores.shape[0]

    @property
    def m(self) -> int:
        return self.scores.shape[2]

    @property
    def d(self) -> int:
        return self.values.shape[3]

    def value_rows(self, b, s, c) -> np.ndarray:
        """``values[b, s, c]`` (rows (len(b), d)): what :class:`SeedShares` gives for a seed."""
        return self.values[np.asarray(b), np.asarray(s), np.asarray(c)]


def _encode_candidates(scores, values, valid, shard_ids):
    """Validate one host's padded candidates and encode them: ``(scores, values, valid, ids)`` as int64
    ring elements (scores and values fixed-point, valid raw 0/1); see :func:`share_candidates`."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 2:
        s, values, valid = s[None], np.asarray(values)[None], np.asarray(valid)[None]
    s = V.finite_array("scores", s, ndim=3)
    v = V.finite_array("values", values, ndim=4)
    ok = np.asarray(valid)
    if ok.shape != s.shape:
        raise ValueError(f"valid must have the shape of scores {s.shape}. Found {ok.shape}.")
    if not np.all((ok == 0) | (ok == 1)):
        raise ValueError(f"valid must hold only 0/1 flags. Found {np.unique(ok)[:5].tolist()!r}.")
    if v.shape[:3] != s.shape:
        raise ValueError(f"values must have shape {s.shape + ('d',)}. Found {v.shape}.")
    if np.any(np.abs(s) > SCORE_BOUND):
        raise ValueError(f"scores must satisfy |score| <= {SCORE_BOUND:g}. Found {s.ravel()[np.argmax(np.abs(s))]!r}.")
    ids = np.asarray(shard_ids)
    if ids.ndim != 1 or ids.shape[0] != s.shape[1] or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"shard_ids must be {s.shape[1]} integer ids. Found {shard_ids!r}.")
    return encode(s), encode(v), ok.astype(np.int64), ids.astype(np.int64)


def share_candidates(scores, values, valid, shard_ids, n_parties: int, rng: np.random.Generator) -> list[SharePacket]:
    """Encode and secret-share one host's padded candidates; returns one packet per party.

    ``scores`` (B, S_h, m) floats with |score| <= ``SCORE_BOUND``; ``values``
    (B, S_h, m, d) floats; ``valid`` (B, S_h, m) booleans or 0/1; ``shard_ids`` (S_h,)
    distinct global shard ids. Padding rows should carry ``valid=0`` and zero values
    (their score is ignored by every selection mode). A single query may be passed
    without the batch axis (scores (S_h, m), values (S_h, m, d), valid (S_h, m)).
    Shares drawn from ``rng`` directly; the shard hosts use :func:`share_candidates_seeded`.
    """
    n = V.positive_int("n_parties", n_parties, minimum=2)
    V.rng_check("rng", rng)
    s, v, ok, ids = _encode_candidates(scores, values, valid, shard_ids)
    parts = [share(s, n, rng), share(v, n, rng), share(ok, n, rng)]
    return [SharePacket(scores=parts[0][p], values=parts[1][p], valid=parts[2][p], shard_ids=ids)
            for p in range(n)]


# ---------------------------------------------------------------------------------------------
# Seed-compressed shares: parties 0..n-2 receive a 32-byte seed, their share is AES-256-CTR(seed)
# ---------------------------------------------------------------------------------------------

SEED_BYTES = 32
"""Length of a share seed: an AES-256 key."""


def keystream_words(encryptor, n: int) -> np.ndarray:
    """The next ``n`` ring elements (int64, little-endian words) of an AES-CTR ``encryptor``'s keystream.

    The keystream is the encryption of zeros: a kept read-only zero buffer is encrypted into an
    uninitialised array (no zero-fill, no second buffer). Shared by the hosts' share seeds
    (:func:`prg_ring`) and the compute parties' triple streams
    (:class:`~fedmem.federation.mpc.keystreams.KeyStream`); numpy and ``cryptography`` only."""
    global _ZEROS
    n = V.positive_int("n", n, minimum=0)
    zeros = _ZEROS
    if len(zeros) < 8 * n:
        zeros = bytes(8 * n)
        if 8 * n <= _ZEROS_KEPT:   # read-only zeros kept for the next call (untouched pages cost little)
            _ZEROS = zeros
    out = np.empty(8 * n + 15, dtype=np.uint8)   # update_into wants room for one more block than it writes
    encryptor.update_into(memoryview(zeros)[:8 * n], out)
    return out[:8 * n].view("<i8").astype(np.int64, copy=False)


_ZEROS = b""
_ZEROS_KEPT = 64 << 20   # bytes of zeros a process keeps between calls (a batch of 100 needs about 10 MB)


def prg_ring(seed: bytes, n: int) -> np.ndarray:
    """``n`` ring elements (int64, little-endian words of the keystream) from AES-256-CTR keyed by ``seed``.

    A cryptographic PRG: every seed is a fresh 32-byte key used for exactly one packet, so the
    fixed all-zero counter block never repeats under one key. Numpy and ``cryptography`` only
    (shard hosts import no torch)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes. Found {seed!r:.60}.")
    return keystream_words(Cipher(algorithms.AES(bytes(seed)), modes.CTR(bytes(16))).encryptor(), n)


def prg_words_at(seed: bytes, starts, n: int) -> np.ndarray:
    """Rows of :func:`prg_ring` ``(seed, ...)`` at arbitrary offsets: ``out[i] = ring[starts[i]:starts[i] + n]``
    (shape (len(starts), n), int64), without generating the keystream before them.

    Counter mode's block ``j`` is the AES encryption of the 128-bit big-endian counter ``j`` (the
    all-zero initial counter block of :func:`prg_ring`), so the blocks a row needs are computed
    directly: one AES-256-ECB call over the counter blocks of every row (random access into CTR;
    the same words, tested against :func:`prg_ring`)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes. Found {seed!r:.60}.")
    n = V.positive_int("n", n)
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    if starts.size and starts.min() < 0:
        raise ValueError(f"starts must be non-negative word offsets. Found {int(starts.min())}.")
    nb = n // 2 + 1                       # 16-byte blocks covering n words from an even or an odd offset
    ctr = np.zeros((starts.size, nb, 2), dtype=">u8")
    ctr[..., 1] = (starts // 2)[:, None] + np.arange(nb)
    ks = Cipher(algorithms.AES(bytes(seed)), modes.ECB()).encryptor().update(ctr.tobytes())
    words = np.frombuffer(ks, dtype="<i8").reshape(starts.size, 2 * nb)
    return np.take_along_axis(words, (starts % 2)[:, None] + np.arange(n), axis=1).astype(np.int64, copy=False)


@dataclass(frozen=True)
class SeedPacket:
    """A compute party's whole :class:`SharePacket`, compressed to the seed it is generated from.

    The party's shares of scores, values and valid flags (in that order, flattened, as in a
    sealed packet's body) are the first ``2 B S_h m + B S_h m d`` elements of
    :func:`prg_ring` ``(seed)``; ``shape`` (B, S_h, m, d) and ``shard_ids`` are public, as in
    every packet. :meth:`expand` rebuilds the packet. The seed is as secret as the shares
    it stands for: it travels only sealed (:func:`seal_packet`)."""

    seed: bytes
    shape: tuple
    shard_ids: np.ndarray

    def __post_init__(self):
        if not isinstance(self.seed, (bytes, bytearray)) or len(self.seed) != SEED_BYTES:
            got = len(self.seed) if isinstance(self.seed, (bytes, bytearray)) else type(self.seed).__name__
            raise ValueError(f"seed must be {SEED_BYTES} bytes. Found {got}.")
        shape = tuple(int(x) for x in self.shape)
        if len(shape) != 4 or min(shape) < 0:
            raise ValueError(f"shape must be (B, S_h, m, d) with non-negative entries. Found {self.shape!r}.")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "seed", bytes(self.seed))

    def __repr__(self):   # never print the seed
        return f"SeedPacket(shape={self.shape}, shard_ids={np.asarray(self.shard_ids).tolist()})"

    def expand(self) -> SharePacket:
        return _packet_from_words(prg_ring(self.seed, _body_words(self.shape)), self.shape, self.shard_ids)

    def rows(self) -> "SeedShares":
        """The share with its scores and valid flags expanded and its values left in the seed
        (:class:`SeedShares`: a reader of selected value rows, the plaintext reference's need)."""
        B, S_h, m, d = self.shape
        n1 = B * S_h * m
        if n1 == 0:
            return SeedShares(self, *(np.zeros((B, S_h, m), dtype=np.int64) for _ in range(2)))
        sv = prg_words_at(self.seed, [0, n1 + n1 * d], n1)
        return SeedShares(self, sv[0].reshape(B, S_h, m), sv[1].reshape(B, S_h, m))


@dataclass(frozen=True)
class SeedShares:
    """A :class:`SeedPacket`'s share read lazily: ``scores`` and ``valid`` (B, S_h, m) expanded,
    value rows generated on demand (:meth:`value_rows`, random access into the keystream), so
    a reader of k selected rows per query generates k rows of the ``B S_h m`` (a batch of 100 at
    20 shards x 5 x 128: 0.5 MB of keystream instead of 10 MB). The same words as
    :meth:`SeedPacket.expand` (tested)."""

    packet: SeedPacket
    scores: np.ndarray
    valid: np.ndarray

    def __repr__(self):   # never print the seed
        return f"SeedShares(shape={self.packet.shape})"

    @property
    def shard_ids(self) -> np.ndarray:
        return np.asarray(self.packet.shard_ids, dtype=np.int64)

    @property
    def batch(self) -> int:
        return self.packet.shape[0]

    @property
    def m(self) -> int:
        return self.packet.shape[2]

    @property
    def d(self) -> int:
        return self.packet.shape[3]

    def value_rows(self, b, s, c) -> np.ndarray:
        """``values[b, s, c]`` of the expanded packet (rows (len(b), d))."""
        B, S_h, m, d = self.packet.shape
        b, s, c = (np.asarray(x, dtype=np.int64).reshape(-1) for x in (b, s, c))
        if b.size == 0 or d == 0:
            return np.zeros((b.size, d), dtype=np.int64)
        if b.min() < 0 or b.max() >= B or s.min() < 0 or s.max() >= S_h or c.min() < 0 or c.max() >= m:
            raise IndexError(f"rows must lie in (B, S_h, m) = {(B, S_h, m)}.")
        return prg_words_at(self.packet.seed, B * S_h * m + ((b * S_h + s) * m + c) * d, d)


def _body_words(shape) -> int:
    """Ring elements in a packet body of shape (B, S_h, m, d): scores and valid (B S_h m each), values."""
    B, S_h, m, d = shape
    return B * S_h * m * (2 + d)


def _packet_from_words(flat: np.ndarray, shape, shard_ids) -> SharePacket:
    """The :class:`SharePacket` whose body (scores, values, valid, flattened in that order: the layout of
    a sealed body and of a seed's keystream) is ``flat``; ``ValueError`` when ``flat`` has another size."""
    B, S_h, m, d = shape
    n1, n2 = B * S_h * m, B * S_h * m * d
    if flat.size != 2 * n1 + n2:
        raise ValueError(f"flat must hold {2 * n1 + n2} ring elements for shape {tuple(shape)}. Found {flat.size}.")
    return SharePacket(scores=flat[:n1].reshape(B, S_h, m), values=flat[n1:n1 + n2].reshape(B, S_h, m, d),
                       valid=flat[n1 + n2:].reshape(B, S_h, m), shard_ids=np.asarray(shard_ids, dtype=np.int64))


def share_encoded_seeded(scores, values, valid, shard_ids, n_parties: int, rng: np.random.Generator, *,
                         compress: bool = True) -> list:
    """Additive shares of already-encoded ring elements (int64 ``scores`` (B, S_h, m), ``values``
    (B, S_h, m, d; int64, or int32 holding the same integers: a host's encoded values), ``valid``
    (B, S_h, m)): parties ``0..n-2`` get a :class:`SeedPacket` (a fresh
    32-byte seed drawn from ``rng``; their share is its AES-256-CTR keystream), the last party
    the :class:`SharePacket` ``x - sum of the others`` (mod 2^64). ``compress=False`` returns the
    first ``n-1`` as the expanded :class:`SharePacket` instead (the same shares).

    The same joint distribution as :func:`share` up to the PRG (any ``n-1`` shares are
    pseudorandom and independent of ``x``: each seed is a uniform key the other parties never
    see), with ``n-1`` packets of 32 bytes instead of a full copy of the data."""
    n = V.positive_int("n_parties", n_parties, minimum=2)
    V.rng_check("rng", rng)
    s, v, ok = (np.asarray(a) for a in (scores, values, valid))
    if (s.dtype != np.int64 or ok.dtype != np.int64 or v.dtype not in (np.int64, np.int32) or s.ndim != 3
            or v.ndim != 4 or v.shape[:3] != s.shape or ok.shape != s.shape):
        raise ValueError(f"scores, values and valid must be int64 ring elements (values may be int32) of shapes "
                         f"(B, S_h, m), "
                         f"(B, S_h, m, d), (B, S_h, m). Found {s.dtype} {s.shape}, {v.dtype} {v.shape}, "
                         f"{ok.dtype} {ok.shape}.")
    ids = np.asarray(shard_ids, dtype=np.int64)
    shape = (*s.shape, v.shape[3])
    # the last share is written straight into one flat body (scores, values, valid: the sealed layout),
    # so sealing it copies nothing more (seal_packet) and x is read once, not copied first
    last = _packet_from_words(np.empty(_body_words(shape), dtype=np.int64), shape, ids)
    out = []
    with np.errstate(over="ignore"):
        for i in range(n - 1):
            sp = SeedPacket(rng.bytes(SEED_BYTES), shape, ids)
            mine = sp.expand()
            for acc, x, ks in zip((last.scores, last.values, last.valid), (s, v, ok),
                                  (mine.scores, mine.values, mine.valid)):
                np.subtract(x if i == 0 else acc, ks, out=acc)
            out.append(sp if compress else mine)
    return [*out, last]


def share_candidates_seeded(scores, values, valid, shard_ids, n_parties: int, rng: np.random.Generator, *,
                            compress: bool = True) -> list:
    """:func:`share_candidates` with seed-compressed shares (:func:`share_encoded_seeded`): what a
    shard host sends. Returns ``n-1`` :class:`SeedPacket` (expanded with ``compress=False``) and
    one :class:`SharePacket`."""
    s, v, ok, ids = _encode_candidates(scores, values, valid, shard_ids)
    return share_encoded_seeded(s, v, ok, ids, n_parties, rng, compress=compress)


@dataclass(frozen=True)
class SelectionSpec:
    """What the compute parties select and what they reveal (a frozen record).

    ``mode``: ``"topk"`` (global top-``k`` by score, tie-break lower (shard id,
    candidate index)), ``"threshold"`` (every valid candidate with score >=
    ``threshold``) or ``"broadcast"`` (every valid candidate). ``reveal`` names the
    outputs opened to the aggregator; nothing else is ever reconstructed.
    """

    mode: str
    k: int = 5
    threshold: float = 0.0
    reveal: frozenset = field(default_factory=lambda: REVEALABLE)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Found {self.mode!r}.")
        V.positive_int("k", self.k, minimum=1)
        t = V.finite("threshold", self.threshold)
        if abs(t) > SCORE_BOUND:
            raise ValueError(f"threshold must satisfy |threshold| <= {SCORE_BOUND:g}. Found {self.threshold!r}.")
        if isinstance(self.reveal, str) or not isinstance(self.reveal, (set, frozenset, tuple, list)):
            raise TypeError(f"reveal must be a set of names from {sorted(REVEALABLE)}. Found {self.reveal!r}.")
        rev = frozenset(self.reveal)
        if not rev <= REVEALABLE:
            raise ValueError(f"reveal must be a subset of {sorted(REVEALABLE)}. Found {sorted(rev)!r}.")
        object.__setattr__(self, "reveal", rev)


@dataclass(frozen=True)
class Revealed:
    """What the compute parties open to the aggregator for a batch of ``B`` queries.

    ``sum`` (B, d): exact sum of the selected (encoded) values, decoded; ``count`` (B,):
    number selected; ``tallies`` (B, S): per-shard number selected, columns ordered by
    ascending global shard id (``shard_ids``). A field not named in the spec's
    ``reveal`` is ``None``. ``stats``: ``{"seconds", "rounds", "bytes"}`` for the whole
    batch (CrypTen communicator stats of party 0; zeros for the plaintext reference).
    """

    sum: np.ndarray | None
    count: np.ndarray | None
    tallies: np.ndarray | None
    stats: dict
    shard_ids: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------
# Sealing: share packets encrypted to their compute party (X25519 + HKDF-SHA256 + ChaCha20-Poly1305)
# ---------------------------------------------------------------------------------------------

SEAL_INFO = b"fedmem/share-packet/v1"
"""Domain separation of the sealing KDF and of every packet's associated data."""

RUN_ID_BYTES = 16
"""Length of a run id: fresh random bytes per computation (one batch, one route)."""

AEADS = ("aes-256-gcm", "chacha20-poly1305")
SEAL_AEAD = "aes-256-gcm"
"""Default AEAD of :func:`seal_packet`. Both are one-time-key AEADs here (a fresh key per
packet); AES-256-GCM is the default because with AES-NI and PCLMUL (x86 since 2010) it
sealed a 10 MB packet 4-5x faster than ChaCha20-Poly1305 on the 2-core development
machine (docs/federation-mpc.md); ChaCha20-Poly1305 is the choice without AES hardware."""


def _aead(name: str, key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    if name == "aes-256-gcm":
        return AESGCM(key)
    if name == "chacha20-poly1305":
        return ChaCha20Poly1305(key)
    raise ValueError(f"aead must be one of {AEADS}. Found {name!r}.")


def new_run_id() -> bytes:
    """A fresh, unpredictable run id (OS randomness: it is a cryptographic nonce, not a DP draw)."""
    import secrets

    return secrets.token_bytes(RUN_ID_BYTES)


KINDS = ("shares", "seed")
TAG_BYTES = 16
"""Authentication tag of both AEADs (appended to every ciphertext)."""
"""What a sealed body holds: the shares themselves, or the 32-byte seed of a :class:`SeedPacket`."""


def _aad(run_id: bytes, party: int, shape: tuple, shard_ids: np.ndarray, aead: str, kind: str = "shares") -> bytes:
    """Associated data: domain, AEAD name, body kind, run id, party rank, shape (B, S_h, m, d), shard ids.

    The tag covers all of it, so a packet of another run (replay), meant for another party
    or claiming other shards, another shape or another kind of body (swap) does not open."""
    head = np.asarray([party, *shape], dtype="<u8").tobytes()
    return (SEAL_INFO + aead.encode() + b"/" + kind.encode() + b"/" + bytes(run_id) + head
            + np.ascontiguousarray(shard_ids, dtype="<i8").tobytes())


def _seal_keys(shared: bytes, epk: bytes, ppk: bytes) -> tuple[bytes, bytes]:
    """(32-byte AEAD key, 12-byte nonce) from the X25519 secret (HKDF-SHA256, one-time key)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    okm = HKDF(algorithm=hashes.SHA256(), length=44, salt=epk + ppk, info=SEAL_INFO).derive(shared)
    return okm[:32], okm[32:]


@dataclass(frozen=True)
class SealedPacket:
    """A :class:`SharePacket` encrypted to ONE compute party; only ciphertext travels.

    ``run_id``, ``party``, ``shard_ids``, ``shape`` (B, S_h, m, d) and ``kind`` are public
    (the same facts the plaintext packet's shape and ids already told; which parties get
    seeds is fixed by the protocol) and bound as associated data; ``epk`` is the host's
    ephemeral X25519 public key; ``ciphertext`` holds the body plus the 16-byte tag: for
    ``kind="shares"`` the shares (scores, values, valid as little-endian int64), for
    ``kind="seed"`` the 32-byte seed of a :class:`SeedPacket`. It is a read-only uint8
    numpy array (bytes are accepted too), so that Ray keeps it out of band: one copy into the
    object store, none out of it. ``aead`` names the cipher (:data:`AEADS`, bound in the
    associated data too).
    """

    run_id: bytes
    party: int
    shard_ids: np.ndarray
    shape: tuple
    epk: bytes
    ciphertext: np.ndarray
    aead: str = SEAL_AEAD
    kind: str = "shares"


def _flat_body(packet: SharePacket) -> memoryview | None:
    """The packet's body as bytes without a copy when its scores, values and valid are consecutive
    C-contiguous little-endian pieces of one buffer, in that order (what :func:`share_encoded_seeded`
    and :func:`_packet_from_words` build); else ``None``."""
    parts = (packet.scores, packet.values, packet.valid)
    base = packet.scores.base
    if (sys.byteorder != "little" or not isinstance(base, np.ndarray) or base.dtype != np.int64 or base.ndim != 1
            or not base.flags.c_contiguous):
        return None
    if any(a.base is not base or not a.flags.c_contiguous for a in parts):
        return None
    at = base.ctypes.data
    for a in parts:
        if a.ctypes.data != at:
            return None
        at += a.nbytes
    if at != base.ctypes.data + base.nbytes:
        return None
    return memoryview(base).cast("B")


def seal_packet(packet: SharePacket | SeedPacket, party_public: bytes, run_id: bytes, party: int, *,
                aead: str = SEAL_AEAD) -> SealedPacket:
    """Encrypt ``packet`` to the party whose raw X25519 public key is ``party_public``.

    Ephemeral-static X25519 (a fresh key pair per packet), HKDF-SHA256 over the shared
    secret (salt: both public keys) gives a one-time key and nonce; the AEAD ``aead``
    (AES-256-GCM or ChaCha20-Poly1305) encrypts the shares (a :class:`SharePacket`) or the
    seed (a :class:`SeedPacket`) with the associated data of :func:`_aad` (run id, party,
    shape, shard ids, kind)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    if not isinstance(packet, (SharePacket, SeedPacket)):
        raise TypeError(f"packet must be a SharePacket or a SeedPacket. Found {type(packet).__name__}.")
    if not isinstance(party_public, (bytes, bytearray)) or len(party_public) != 32:
        raise ValueError(f"party_public must be a 32-byte raw X25519 public key. Found {party_public!r:.60}.")
    if not isinstance(run_id, (bytes, bytearray)) or len(run_id) != RUN_ID_BYTES:
        raise ValueError(f"run_id must be {RUN_ID_BYTES} bytes. Found {run_id!r:.60}.")
    esk = X25519PrivateKey.generate()
    epk = esk.public_key().public_bytes_raw()
    key, nonce = _seal_keys(esk.exchange(X25519PublicKey.from_public_bytes(bytes(party_public))), epk,
                            bytes(party_public))
    ids = np.asarray(packet.shard_ids, dtype=np.int64)
    if isinstance(packet, SeedPacket):
        kind, shape, body = "seed", packet.shape, packet.seed
    else:
        B, S_h, m = packet.scores.shape
        kind, shape = "shares", (B, S_h, m, packet.d)
        body = _flat_body(packet)
        if body is None:
            body = memoryview(np.concatenate([np.asarray(a, dtype="<i8").reshape(-1)
                                              for a in (packet.scores, packet.values, packet.valid)])).cast("B")
    ct = _aead(aead, key).encrypt(nonce, body, _aad(run_id, party, shape, ids, aead, kind))
    return SealedPacket(run_id=bytes(run_id), party=int(party), shard_ids=ids, shape=shape, epk=epk,
                        ciphertext=np.frombuffer(ct, dtype=np.uint8), aead=aead, kind=kind)


class PartyKey:
    """A compute party's X25519 key pair (generated in the party's own process; the private
    key never leaves it). :attr:`public` (32 raw bytes) is what the party publishes."""

    def __init__(self):
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self._sk = X25519PrivateKey.generate()
        self.public = self._sk.public_key().public_bytes_raw()

    def __reduce__(self):   # never pickled: the private key stays in its process
        raise TypeError("PartyKey holds a private key and cannot be pickled.")

    def open(self, sealed, run_id: bytes, party: int, *, lazy: bool = False,
             into: np.ndarray | None = None) -> SharePacket | SeedShares:
        """Decrypt a packet sealed to this key for run ``run_id`` and rank ``party``.

        Fails closed: a packet of another run or party, a wrong key, or any modified byte
        (ciphertext, ids, shape, kind, ephemeral key) raises ``ValueError`` and yields nothing.
        A seed packet (``kind="seed"``) is expanded here: the caller gets the shares, or with
        ``lazy=True`` a :class:`SeedShares` (value rows generated on demand).

        ``into``: a writable uint8 array the shares of a ``kind="shares"`` packet are decrypted
        into when it is large enough (the returned packet's arrays are views of it, valid until
        the caller reuses it); otherwise a new buffer. A caller that opens packets of the same
        size batch after batch keeps one (each fresh 10 MB buffer is 2,560 pages the kernel maps
        in again)."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

        if not isinstance(sealed, SealedPacket):
            raise ValueError(f"packet must be sealed to this party (a SealedPacket). Found {type(sealed).__name__}; "
                             "refused.")
        if sealed.run_id != run_id or sealed.party != party:
            raise ValueError("sealed packet belongs to another run or party; refused.")
        try:
            shape = tuple(int(x) for x in sealed.shape)
            ids = np.asarray(sealed.shard_ids, dtype=np.int64)
            if len(shape) != 4 or min(shape) < 0 or len(sealed.epk) != 32 or sealed.kind not in KINDS:
                raise ValueError("malformed header")
            key, nonce = _seal_keys(self._sk.exchange(X25519PublicKey.from_public_bytes(bytes(sealed.epk))),
                                    bytes(sealed.epk), self.public)
            aead, aad = _aead(sealed.aead, key), _aad(run_id, party, shape, ids, sealed.aead, sealed.kind)
            n = len(sealed.ciphertext) - TAG_BYTES
            if into is not None and sealed.kind == "shares" and 0 < n <= into.nbytes:
                body = into[:n]
                aead.decrypt_into(nonce, sealed.ciphertext, aad, body)
            else:
                body = aead.decrypt(nonce, sealed.ciphertext, aad)
        except (InvalidTag, ValueError, TypeError) as exc:
            raise ValueError("sealed packet failed authentication (tampered, replayed or not for this party); "
                             "refused.") from exc
        if sealed.kind == "seed":
            if len(body) != SEED_BYTES:
                raise ValueError("sealed packet failed authentication (size does not match its kind); refused.")
            seed = SeedPacket(body, shape, ids)
            return seed.rows() if lazy else seed.expand()
        if len(body) != 8 * _body_words(shape):
            raise ValueError("sealed packet failed authentication (size does not match its shape); refused.")
        return _packet_from_words(np.frombuffer(body, dtype="<i8").astype(np.int64, copy=False), shape, ids)
