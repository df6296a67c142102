"""Shard hosts: many memory shards per Ray actor, numpy only (no torch, no CrypTen).

DESIGN.md, "One federated query, end to end", step 2. For every query a shard, in
plaintext on its own records only:

1. scores each record by cosine similarity with the unit query (keys are unit-norm, so
   the score is ``<key, q>``);
2. keeps its local top-k' records (higher score first, ties to the lower record index),
   **padded to exactly k'** rows so that message sizes never depend on the data
   (padding rows: ``valid=0``, score ``PAD_SCORE``, value 0);
   in ``broadcast`` mode the padding rows are instead zero-value *dummies flagged
   valid*, so every shard contributes exactly k' valid candidates and the selected
   count and per-shard tallies are constants (papers/003, Conditions of Validity);
3. clips every value to L2 norm <= C (again, even if the data generator already did; once
   per record, when the host loads its shards, and fixed-point encodes it then:
   :func:`encode_values`, so a query only gathers ring elements, :func:`encoded_candidates`);
4. fixed-point encodes and splits everything into additive shares, one packet per compute
   party (:func:`~fedmem.federation.sharing.share_candidates_seeded`): every party but the last
   gets a fresh 32-byte seed whose AES-256-CTR keystream is its share
   (:class:`~fedmem.federation.sharing.SeedPacket`), the last party the difference (a
   :class:`~fedmem.federation.sharing.SharePacket`), so only one full copy of the data is
   sealed and sent per host.

:func:`local_candidates` is the pure function that does steps 1-3 for a stack of shards;
:class:`ShardHostCore` adds step 4 and is what the Ray actor (:func:`host_actor_class`)
wraps, so the same code runs in-process for the evaluation-only ``ground_truth``.
All hosts are placed with ``num_cpus=0``: they are idle between queries, so thousands of
shards on a handful of hosts fit on one 2-core machine.
"""

from __future__ import annotations

import os

import numpy as np

from fedmem import _validate as V
from fedmem.federation.sharing import decode, encode, seal_packet, share_encoded_seeded

PAD_SCORE = -4.0
"""Score of padding rows and broadcast dummies: below every cosine similarity (>= -1)."""

MODES = ("topk", "threshold", "broadcast")
INLINE_SEALED_BYTES = 64 * 1024
"""A sealed packet up to this size (e.g. a 48-byte sealed seed) is returned by value instead of
``ray.put``: each host-owned object costs a few ms of Ray bookkeeping per call
(``scripts/bench_engine.py --ray-micro``), and a sealed packet is ciphertext the driver cannot
open (it can already fetch every object it holds a ref to). Unsealed packets are always put."""


KEY_NORM_SLACK = 1e-6
"""A key whose L2 norm exceeds ``1 + KEY_NORM_SLACK`` is scaled to unit norm by the host (keys are
unit by contract; the slack leaves float32 embeddings' rounding untouched), so every score is in
``[-1 - slack, 1 + slack]``, far inside ``SCORE_BOUND`` and the fixed-point range."""


def check_shards(keys, values, *, key_dim: int | None = None, value_dim: int | None = None, sizes=None,
                 shard_ids=None) -> None:
    """The structural contract of shard records (public metadata only: shapes, dtypes, counts).

    Every shard holds real numeric ``keys`` (n, key_dim) and ``values`` (n, value_dim) (float or
    integer dtypes), the same ``n`` as declared in ``sizes`` when given, the same dims on every
    shard. Raises ``ValueError`` naming the shard (its global id when ``shard_ids`` is given) and
    the shape, dtype or count found; record values are never read here (they are the host's to
    clip, :func:`sanitize_shard`)."""
    if len(keys) != len(values):
        raise ValueError(f"keys and values must list the same shards. Found {len(keys)} and {len(values)}.")
    ids = list(range(len(keys))) if shard_ids is None else [int(i) for i in shard_ids]
    for j, (k, v) in enumerate(zip(keys, values)):
        k, v = np.asarray(k), np.asarray(v)
        for name, arr, dim in (("keys", k, key_dim), ("values", v, value_dim)):
            if arr.dtype.kind not in "fiu":
                raise ValueError(f"shard {ids[j]}: {name} must be a real numeric array (float or integer). "
                                 f"Found dtype {arr.dtype}.")
            if arr.ndim != 2 or (dim is not None and arr.shape[1] != dim):
                raise ValueError(f"shard {ids[j]}: {name} must have shape (n, {dim if dim is not None else 'd'}). "
                                 f"Found shape {arr.shape}.")
        if k.shape[0] != v.shape[0]:
            raise ValueError(f"shard {ids[j]}: keys and values must hold the same records. Found {k.shape[0]} keys "
                             f"and {v.shape[0]} values.")
        if sizes is not None and k.shape[0] != int(sizes[j]):
            raise ValueError(f"shard {ids[j]}: must hold the {int(sizes[j])} records its size declares. Found "
                             f"{k.shape[0]}.")
        if key_dim is None:
            key_dim = k.shape[1]
        if value_dim is None:
            value_dim = v.shape[1]


def _row_norms(x: np.ndarray) -> np.ndarray:
    """L2 norms of the last axis without overflow (scaled by each row's largest entry first: the
    norm of a finite 1e300 row is finite); rows must be finite."""
    peak = np.max(np.abs(x), axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
    safe = np.where(peak > 0, peak, 1.0)
    return peak[..., 0] * np.linalg.norm(x / safe, axis=-1)


def sanitize_shard(keys, values) -> tuple[np.ndarray, np.ndarray]:
    """One shard's records brought into contract, each record by a function of itself alone (so a
    neighbouring dataset stays a neighbour, and no record's treatment depends on another's):

    * a record with any non-finite key entry gets the zero key (score 0), with any non-finite value
      entry the zero value; it still counts (shard sizes are public and fix the padding);
    * a key of norm above ``1 + KEY_NORM_SLACK`` is scaled to unit norm (|score| <= 1);
    * values are kept in float64 unless they already are float32 (never cast into the keys' dtype,
      where a float64 value beyond float32's range would become inf). Clipping to ``clip`` happens
      in :func:`encode_values` with overflow-safe norms.

    Keys keep their float dtype (integer keys become float64)."""
    k = np.asarray(keys)
    k = k.astype(np.float64) if k.dtype.kind != "f" else k.copy()
    v = np.asarray(values)
    v = v.astype(np.float32 if v.dtype == np.float32 else np.float64, copy=True)
    if k.size:
        k[~np.all(np.isfinite(k), axis=1)] = 0
        nk = _row_norms(k.astype(np.float64))
        big = nk > 1.0 + KEY_NORM_SLACK
        if np.any(big):
            k[big] = (k[big].astype(np.float64) / nk[big, None]).astype(k.dtype)
    if v.size:
        v[~np.all(np.isfinite(v), axis=1)] = 0
    return k, v


def stack_shards(keys: list, values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stack ragged shards into (S_h, n_max, dim) arrays plus a (S_h, n_max) record mask. Values keep
    their own dtype (float32 only if every shard's values are float32; never the keys' dtype)."""
    n_max = max(1, max(k.shape[0] for k in keys))
    S_h = len(keys)
    kd, vd = keys[0].shape[1], values[0].shape[1]
    dt = np.result_type(*(k.dtype for k in keys))
    vdt = np.result_type(np.float32, *(v.dtype for v in values))
    K = np.zeros((S_h, n_max, kd), dtype=dt)
    Vv = np.zeros((S_h, n_max, vd), dtype=vdt)
    M = np.zeros((S_h, n_max), dtype=bool)
    for i, (k, v) in enumerate(zip(keys, values)):
        K[i, : k.shape[0]] = k
        Vv[i, : v.shape[0]] = v
        M[i, : k.shape[0]] = True
    return K, Vv, M


def clip_factors(Vv: np.ndarray, clip: float) -> np.ndarray:
    """Per-record factors ``min(1, clip / ||v||)`` (shape ``Vv.shape[:-1]``, float64): a value row
    times its factor has L2 norm <= ``clip`` (zero rows keep factor 1)."""
    norms = _row_norms(Vv.astype(np.float64, copy=False))     # overflow-safe: a 1e300 row keeps its direction
    return np.minimum(1.0, clip / np.where(norms > 0, norms, 1.0))


def encode_values(Vv: np.ndarray, clip: float, *, rows: int = 64) -> np.ndarray:
    """Every record's clipped value, fixed-point encoded once (ring elements, shape of ``Vv``): what
    :func:`encoded_candidates` gathers. Stored as int32 when every encoding fits (|v| <= clip, so
    whenever clip * 2**16 < 2**31; the same integers, half the memory), else int64. Raises
    ``ValueError`` for a non-finite value.

    Computed ``rows`` shards at a time (a few MB, in cache: 2.5x faster than whole-array passes
    for 2,500 shards x 50 x 128); each record's factor is the one :func:`clip_factors` gives
    for the whole array (a row's norm does not depend on its neighbours)."""
    out = np.empty(Vv.shape, dtype=np.int32)
    for a in range(0, Vv.shape[0], V.positive_int("rows", rows)):
        chunk = Vv[a:a + rows]
        enc = encode(chunk.astype(np.float64) * clip_factors(chunk, clip)[..., None])
        if enc.size and int(np.abs(enc).max()) >= 2**31:   # does not fit: int64 for all of it
            return encode(Vv.astype(np.float64) * clip_factors(Vv, clip)[..., None])
        out[a:a + rows] = enc
    return out


def _local_top(q: np.ndarray, K: np.ndarray, M: np.ndarray, k_local: int, mode: str):
    """Scores (B, S_h, k'), valid (B, S_h, k'), and the kept records' indices and flags (B, S_h, kk)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Found {mode!r}.")
    B = q.shape[0]
    S_h, n_max, _ = K.shape
    # one BLAS product over all records (einsum did not use BLAS: 6 ms vs <1 ms at B = 100, 1,000 records)
    sc = (K.reshape(S_h * n_max, -1) @ q.astype(K.dtype, copy=False).T).reshape(S_h, n_max, B)
    sc = sc.transpose(2, 0, 1).astype(np.float64)
    sc = np.where(M[None], sc, -np.inf)
    kk = min(k_local, n_max)
    # Stable sort of -score: higher score first, exact ties to the lower record index;
    # masked-out rows (-inf) sort last.
    order = np.argsort(-sc, axis=2, kind="stable")[..., :kk]
    top = np.take_along_axis(sc, order, axis=2)
    ok = np.isfinite(top)
    scores = np.full((B, S_h, k_local), PAD_SCORE)
    valid = np.zeros((B, S_h, k_local), dtype=np.int64)
    scores[..., :kk] = np.where(ok, top, PAD_SCORE)
    valid[..., :kk] = ok
    if mode == "broadcast":
        valid[:] = 1  # padding rows become zero-value dummies flagged valid
    return scores, valid, order, ok


def local_candidates(q: np.ndarray, K: np.ndarray, Vv: np.ndarray, M: np.ndarray, k_local: int, clip: float,
                     mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each shard's padded local top-k' for a batch of unit queries ``q`` (B, key_dim).

    Returns ``scores`` (B, S_h, k'), ``values`` (B, S_h, k', value_dim) clipped to
    ``clip``, ``valid`` (B, S_h, k') int64 0/1. Order within a shard: higher score
    first, ties to the lower record index (a stable sort), then padding.
    """
    scores, valid, order, ok = _local_top(q, K, M, k_local, mode)
    B, S_h, kk = order.shape
    s_idx = np.arange(S_h)[None, :, None]
    vals = Vv[s_idx, order].astype(np.float64) * clip_factors(Vv, clip)[s_idx, order][..., None]  # (B, S_h, kk, vd)
    values = np.zeros((B, S_h, k_local, Vv.shape[2]), dtype=np.float64)
    values[..., :kk, :] = np.where(ok[..., None], vals, 0.0)
    return scores, values, valid


def encoded_candidates(q: np.ndarray, K: np.ndarray, Venc: np.ndarray, M: np.ndarray, k_local: int,
                       mode: str, *, widen: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`local_candidates` as ring elements, from values encoded once (:func:`encode_values`):
    ``encode(scores)``, the selected rows of ``Venc`` (padding rows 0; widened to int64, or with
    ``widen=False`` in ``Venc``'s own integer type: the same integers, which the host's sharing reads
    as they are) and ``valid``, int64.
    Equal to encoding :func:`local_candidates`' output (the clipping factor of a record is the same
    float whichever path multiplies it; tested)."""
    scores, valid, order, ok = _local_top(q, K, M, k_local, mode)
    B, S_h, kk = order.shape
    values = np.zeros((B, S_h, k_local, Venc.shape[2]), dtype=np.int64 if widen else Venc.dtype)
    values[..., :kk, :] = Venc[np.arange(S_h)[None, :, None], order]
    if not ok.all():
        values[..., :kk, :][~ok] = 0
    return encode(scores), values, valid


class ShardHostCore:
    """One host's shards and its candidate/sharing step (the body of the Ray actor)."""

    def __init__(self, shard_ids, keys: list | None, values: list | None, *, clip: float, k_local: int,
                 n_parties: int, seed: int, recipe=None, sizes=None):
        self.shard_ids = np.asarray(shard_ids, dtype=np.int64)
        self.generated = recipe is not None
        if recipe is not None:   # data at the host: generate its own shards (fedmem.bench.shards.ShardRecipe)
            if keys is not None or values is not None:
                raise ValueError("keys and values must be None when a recipe is given (the host generates them).")
            keys, values = recipe.shards_for(self.shard_ids)
        elif keys is None or values is None:
            raise ValueError("keys and values must be given (or a recipe). Found None.")
        if len(self.shard_ids) != len(keys) or len(keys) != len(values) or not keys:
            raise ValueError(f"shard_ids, keys and values must have the same non-zero length. Found "
                             f"{len(self.shard_ids)}, {len(keys)}, {len(values)}.")
        self.clip = V.positive("clip", clip)
        self.k_local = V.positive_int("k_local", k_local)
        self.n_parties = V.positive_int("n_parties", n_parties, minimum=2)
        # the records' contract, enforced here (the side whose output the booking's sensitivity
        # assumes): structure first (public metadata), then every record clipped into contract
        check_shards(keys, values, sizes=sizes, shard_ids=self.shard_ids)
        keys, values = zip(*(sanitize_shard(k, v) for k, v in zip(keys, values)))
        self.K, values, self.M = stack_shards(list(keys), list(values))
        # every record's clipped value, encoded once (queries gather ring elements; no float copy kept)
        self.Venc = encode_values(values, self.clip)
        self._rng = np.random.default_rng(np.random.SeedSequence(int(seed)))

    def candidates(self, q, mode: str, *, compress: bool = False):
        """Share packets (one per party) for a batch of queries ``q`` (B, key_dim).

        Shares are seed-compressed (:func:`~fedmem.federation.sharing.share_candidates_seeded`):
        parties ``0..n-2`` get the AES-256-CTR keystream of a fresh 32-byte seed drawn from this
        host's generator, the last party the difference. ``compress=True`` leaves their packets
        as :class:`~fedmem.federation.sharing.SeedPacket` (what is sealed and sent); otherwise
        they are expanded here."""
        q = np.asarray(q, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != self.K.shape[2]:
            raise ValueError(f"q must have shape (B, {self.K.shape[2]}). Found {q.shape}.")
        s, v, ok = encoded_candidates(q, self.K, self.Venc, self.M, self.k_local, mode, widen=False)
        return share_encoded_seeded(s, v, ok, self.shard_ids, self.n_parties, self._rng, compress=compress)

    def plain_candidates(self, q, mode: str):
        """Unshared candidates (evaluation only; the engine's ``ground_truth``)."""
        q = np.asarray(q, dtype=np.float64)
        s, v, ok = encoded_candidates(q, self.K, self.Venc, self.M, self.k_local, mode)
        return decode(s), decode(v), ok   # the encoded values exactly (|x| < 2^53: decoding is exact)

    def info(self) -> dict:
        import sys

        from fedmem import _malloc

        return {"pid": os.getpid(), "shards": int(len(self.shard_ids)), "torch_loaded": "torch" in sys.modules,
                "generated": self.generated, "malloc_kept": _malloc.KEPT}

    def ping(self) -> bool:
        """True while this host holds its shards (an unloaded pooled host fails: it must be re-created)."""
        if "Venc" not in self.__dict__:
            raise RuntimeError("this shard host holds no shards (unloaded).")
        return True


class _HostActor(ShardHostCore):
    """Ray actor wrapper: multi-return ``candidates`` (one object per party)."""

    def __init__(self, *args, **kw):
        from fedmem._malloc import keep_freed_memory

        keep_freed_memory()   # a host's batch arrays stay in its heap between batches (fedmem._malloc)
        super().__init__(*args, **kw)

    def load(self, shard_ids, keys, values, **kw) -> bool:
        """Become a new host of other shards (a pooled actor, :mod:`fedmem.federation.host_pool`):
        everything this instance held is dropped, then the constructor runs again with these
        arguments (the same ones a new actor gets, so the same state)."""
        self.unload()
        ShardHostCore.__init__(self, shard_ids, keys, values, **kw)
        return True

    def unload(self) -> bool:
        """Drop the shards, their keys and values and the share generator (an idle pooled host holds
        no data; every data method fails until the next :meth:`load`)."""
        self.__dict__.clear()
        return True

    def candidates_split(self, q, mode: str):
        packets = self.candidates(q, mode)
        return tuple(packets) if len(packets) > 1 else packets[0]

    def candidates_refs(self, q, mode: str, party_keys=None, run_id: bytes | None = None) -> dict:
        """Share packets stored in the object store by this host, one per party, as refs.

        With ``party_keys`` (each party's raw X25519 public key, in rank order) and the
        driver's ``run_id``, every packet is sealed to its party first
        (:func:`~fedmem.federation.sharing.seal_packet`): the object store, its plasma file
        and every process that can read them see only ciphertext bound to this run, this
        party and these shards.

        Sealed, the first ``n-1`` parties' packets are seed packets (the 32-byte seed of their
        AES-256-CTR shares; the party expands it when it opens the packet), the last party's the
        shares themselves.

        Returns ``{"refs": [one item per party], "shard_ids": ...}``: an item is an
        ObjectRef to a packet this host put in the object store, or, for a sealed packet of
        at most :data:`INLINE_SEALED_BYTES` of ciphertext (a sealed seed: 48 bytes), the
        :class:`~fedmem.federation.sharing.SealedPacket` itself. The driver relays the items
        (public metadata and ciphertext it cannot open) and each party fetches its own
        packets from this host's node. This host owns the put objects, so if it dies before
        a party fetched them the fetch fails (``OwnerDiedError``) and the query fails closed.
        Unsealed packets (shares in the clear) are always put: they never pass through the driver.
        """
        import ray

        packets = self.candidates(q, mode, compress=party_keys is not None)
        if party_keys is None:
            return {"refs": [ray.put(p) for p in packets], "shard_ids": self.shard_ids.copy()}
        if run_id is None or len(party_keys) != len(packets):
            raise ValueError(f"party_keys must hold one public key per party ({len(packets)}) and come with a "
                             f"run_id. Found {len(party_keys)} keys, run_id={run_id!r}.")
        sealed = [seal_packet(p, bytes(k), run_id, r) for r, (p, k) in enumerate(zip(packets, party_keys))]
        return {"refs": [p if len(p.ciphertext) <= INLINE_SEALED_BYTES else ray.put(p) for p in sealed],
                "shard_ids": self.shard_ids.copy()}

    def where(self) -> dict:
        """Where this host runs: ``{"node_id", "worker_id", "pid"}`` (placement is public)."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "worker_id": ctx.get_worker_id(), "pid": os.getpid()}

    def stall(self, seconds: float) -> bool:
        """Fault-injection hook for tests: keep this (single-threaded) host busy."""
        import time

        time.sleep(float(seconds))
        return True


_ACTOR = None


def host_actor_class():
    """The ``ray.remote`` shard-host actor class (built lazily so importing this module needs no Ray)."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1)(_HostActor)
    return _ACTOR


def split_shards(n_shards: int, hosts: int) -> list[np.ndarray]:
    """Contiguous, near-equal split of global shard ids among ``hosts`` hosts."""
    n_shards = V.positive_int("n_shards", n_shards)
    hosts = V.positive_int("hosts", hosts)
    if hosts > n_shards:
        raise ValueError(f"hosts must be <= shards ({n_shards}). Found {hosts!r}.")
    return [a for a in np.array_split(np.arange(n_shards, dtype=np.int64), hosts)]
