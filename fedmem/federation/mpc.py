"""Compute parties: secure global selection, sum, count and per-shard tallies.

DESIGN.md, "One federated query, end to end", steps 3-4. Every shard host sends each
compute party one :class:`~fedmem.federation.sharing.SharePacket` (additive shares of
its padded local top-k' candidates). The parties jointly compute, without any of them
seeing a plaintext score, value or flag:

1. a secret-shared 0/1 selection mask over all ``N = S * m`` candidates (global top-k,
   threshold, or broadcast; semantics and tie-break in ``fedmem.federation.sharing``);
2. the secure sum of the selected value vectors, the secure count and the per-shard
   tallies (the "receipts" whose leakage papers/003 is about);

and open only the outputs that :class:`SelectionSpec.reveal` names.

Two implementations with identical semantics:

* :class:`PlaintextParties`: the reference/baseline. It reconstructs the shares and
  computes in numpy (no secrecy); used to test the MPC and as the fast engine option.
* :class:`CryptenParties`: ``n`` Ray actors (2 by default, 3 allowed), each one CrypTen
  party over torch.distributed/gloo, on distinct nodes when the cluster has enough
  (rendezvous at rank 0's node IP; docs/cluster.md). Each actor fetches and receives
  only its own shares and wraps them with ``MPCTensor.from_shares``.

Secure top-k. With effective scores ``e_j = score_j + FILL * valid_j`` (linear in the
shares; every valid row above every invalid one, see :data:`FILL`), candidate ``u``
beats ``t`` iff ``e_u > e_t`` or (``e_u = e_t`` and ``u < t``). Three methods, same
output (``impl=``; ``"auto"`` picks by :func:`choose_impl` from public shapes only); all
run on the raw shares through :mod:`fedmem.federation.mpc_rounds` (CrypTen's
communicator and triple provider, independent steps fused into shared rounds):

* ``rank`` (:func:`_rank_gen`, constant rounds): for all ``N(N-1)/2`` pairs ``i < j`` at
  once, one vectorised secure comparison gives ``l_ij = [e_i < e_j]``. The rank of ``t``
  (number of candidates that beat it) is *linear* in the ``l``'s,
  ``rank_t = t + sum_{j > t} l_tj - sum_{i < t} l_it``, so each party computes its share
  locally; ``mask_t = [rank_t < k] * valid_t`` is one small-range comparison with the
  product fused into its last round: 15 rounds (2 parties) whatever ``k`` and ``N``.
* ``grouped`` (:func:`_grouped_gen`, constant rounds): the same rank inside groups of
  shards, a secret one-hot compaction of each group's top-k, and a second rank over the
  survivors: 4 comparison layers (28 rounds), ~4x fewer comparisons than ``rank`` for 40 x 5.
* ``merge`` (:func:`_merge_gen`): sorted shard lists merged pairwise in a tree of
  bitonic top-K merges: O(N log^2 k) comparisons, O(log S log k) rounds; best for large
  batches and many shards.

The naive approach (``k`` sequential log-depth CrypTen argmaxes) is kept as
``impl="argmax"`` for the benchmark (on CrypTen's ``MPCTensor``). Every selection mask is an integer (scale-1)
sharing and ``valid`` is shared at scale 1, so ``mask * values`` needs no fixed-point
truncation: the revealed sum is the exact ring sum of the encoded selected values,
bit-identical to :class:`PlaintextParties`.

CrypTen's trust model (stated plainly): semi-honest (honest-but-curious) parties, no
MACs, so a party that deviates from the protocol can silently corrupt results; the
default provider ``TFP`` ("trusted first party") has party 0 generate the Beaver
triples and binary triples for everyone, so party 0 must be trusted not to collude;
``TTP`` moves that role to a separate trusted-third-party process (an extra actor).
Revealed outputs are opened to every party (and returned to the aggregator).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.errors import MpcFailure
from fedmem.federation.sharing import (
    FRAC_BITS, MASK_FILL, REVEALABLE, SCORE_BOUND, Revealed, SelectionSpec, SharePacket, decode, encode,
    reconstruct,
)

PROVIDERS = ("TFP", "TTP")
IMPLS = ("auto", "rank", "grouped", "merge", "argmax")
CONSTANT_ROUNDS_MAX = 150_000
"""``impl="auto"`` uses a constant-round method (grouped or rank) while the batch needs at
most this many secure comparisons (one query of 40 x 5 candidates, k = 5: 4,175 grouped,
19,900 rank), else the merge tree (1,067 per query); see :func:`choose_impl`."""


# ----------------------------------------------------------------------------- layout

def assemble(packets: Sequence[SharePacket]):
    """Concatenate one party's packets from every shard host in ascending shard-id order.

    Returns ``(scores (B, N), values (B, N, d), valid (B, N), shard_ids (S,), m)`` with
    flat candidate index ``j = s * m + c`` (``s`` = position of the shard in ascending
    global id order, ``c`` = candidate index within the shard).
    """
    packets = list(packets)
    if not packets:
        raise ValueError("packets must hold at least one SharePacket per party. Found [].")
    for p in packets:
        if not isinstance(p, SharePacket):
            raise TypeError(f"packets must be SharePacket objects. Found {type(p).__name__}.")
    B, m, d = packets[0].batch, packets[0].m, packets[0].d
    for p in packets[1:]:
        if (p.batch, p.m, p.d) != (B, m, d):
            raise ValueError(f"packets must agree on (batch, m, d) = {(B, m, d)}. Found {(p.batch, p.m, p.d)}.")
    ids = np.concatenate([p.shard_ids for p in packets]).astype(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"shard_ids must be distinct across shard hosts. Found duplicates in {ids.tolist()!r}.")
    order = np.argsort(ids, kind="stable")
    S = len(ids)
    if len(packets) == 1 and np.array_equal(order, np.arange(S)):   # one host, ids in order: views, no copy
        p = packets[0]
        return (p.scores.reshape(B, S * m), p.values.reshape(B, S * m, d), p.valid.reshape(B, S * m), ids, m)
    scores = np.concatenate([p.scores for p in packets], axis=1)[:, order].reshape(B, S * m)
    valid = np.concatenate([p.valid for p in packets], axis=1)[:, order].reshape(B, S * m)
    values = np.concatenate([p.values for p in packets], axis=1)[:, order].reshape(B, S * m, d)
    return scores, values, valid, ids[order], m


def _check_packets(packets, n_parties: int):
    if not isinstance(packets, (list, tuple)) or len(packets) != n_parties:
        got = len(packets) if isinstance(packets, (list, tuple)) else type(packets).__name__
        raise ValueError(f"packets must be a list with one entry per party ({n_parties}). Found {got}.")
    per = [list(p) if isinstance(p, (list, tuple)) else [p] for p in packets]
    n_hosts = {len(p) for p in per}
    if len(n_hosts) != 1:
        raise ValueError(f"packets must give every party the same number of host packets. Found {sorted(n_hosts)}.")
    if any(_is_ref(x) for party in per for x in party):
        return per  # resolved inside each party; shard ids are cross-checked on the results
    ref = [tuple(x.shard_ids.tolist()) for x in per[0]]
    for party in per[1:]:
        if [tuple(x.shard_ids.tolist()) for x in party] != ref:
            raise ValueError("packets must list the same shard hosts (same shard_ids, same order) for every party.")
    return per


def _is_ref(x) -> bool:
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a hard dependency
        return False
    return isinstance(x, ray.ObjectRef)


def _resolve(packets, timeout_s: float | None = None):
    """Fetch any Ray ObjectRefs among one party's packets (inside that party's process).

    A ref whose shard host (its owner) died, a lost object or a timeout raises
    :class:`~fedmem.errors.MpcFailure`: the caller must fail closed.
    """
    packets = list(packets)
    idx = [i for i, x in enumerate(packets) if _is_ref(x)]
    if idx:
        import ray

        try:
            got = ray.get([packets[i] for i in idx], timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - dead host, lost object, timeout: fail closed
            raise MpcFailure(f"shares could not be fetched from the shard hosts: {exc!r}") from exc
        for i, g in zip(idx, got):
            packets[i] = g
    return packets


def _check_spec(spec):
    if not isinstance(spec, SelectionSpec):
        raise TypeError(f"spec must be a SelectionSpec. Found {type(spec).__name__}.")


# ----------------------------------------------------------------------------- reference

def plaintext_mask(scores_int: np.ndarray, valid_int: np.ndarray, spec: SelectionSpec) -> np.ndarray:
    """Selection mask (B, N) bool on reconstructed ring elements: the semantic reference."""
    valid = valid_int.astype(bool)
    if spec.mode == "broadcast":
        return valid
    if spec.mode == "threshold":
        return (scores_int >= encode(spec.threshold)) & valid
    B, N = scores_int.shape
    eff = np.where(valid, scores_int + encode(MASK_FILL), 0)
    # Stable sort of -eff: higher effective score first, ties keep the lower flat index first.
    top = np.argsort(-eff, axis=1, kind="stable")[:, : spec.k]
    mask = np.zeros((B, N), dtype=bool)
    np.put_along_axis(mask, top, True, axis=1)
    return mask & valid


class PlaintextParties:
    """Reference compute parties: reconstruct the shares and select in numpy (no secrecy).

    Same inputs, semantics and outputs as :class:`CryptenParties`; ``stats`` reports
    wall seconds and zero rounds/bytes.
    """

    def __init__(self, n_parties: int = 2):
        self.n_parties = V.positive_int("n_parties", n_parties, minimum=2)

    def run(self, packets, spec: SelectionSpec) -> Revealed:
        """``packets[p]``: party p's packets, one per shard host (``SharePacket`` or Ray
        ``ObjectRef`` to one; refs are fetched here)."""
        _check_spec(spec)
        t0 = time.perf_counter()
        per = [_resolve(p) for p in _check_packets(packets, self.n_parties)]
        per = _check_packets(per, self.n_parties)
        parts = [assemble(p) for p in per]
        ids, m = parts[0][3], parts[0][4]
        scores = reconstruct([p[0] for p in parts])
        valid = reconstruct([p[2] for p in parts])
        if not np.all((valid == 0) | (valid == 1)):
            raise MpcFailure("valid flags reconstruct to values other than 0/1: inconsistent shares.")
        mask = plaintext_mask(scores, valid, spec)
        B, N = mask.shape
        out = {}
        if "sum" in spec.reveal:
            # ring sum of the selected values = sum over parties of the selected share rows (mod 2^64):
            # no party's values are reconstructed, and no (B, N, d) temporary is built
            ring = np.zeros((B, parts[0][1].shape[2]), dtype=np.int64)
            b_idx, n_idx = np.nonzero(mask)
            with np.errstate(over="ignore"):
                for p in parts:
                    np.add.at(ring, b_idx, p[1][b_idx, n_idx])
            out["sum"] = decode(ring)
        if "count" in spec.reveal:
            out["count"] = mask.sum(axis=1).astype(np.int64)
        if "tallies" in spec.reveal:
            out["tallies"] = mask.reshape(B, N // m, m).sum(axis=2).astype(np.int64)
        stats = {"seconds": time.perf_counter() - t0, "rounds": 0, "bytes": 0, "secure": False}
        return Revealed(sum=out.get("sum"), count=out.get("count"), tallies=out.get("tallies"),
                        stats=stats, shard_ids=ids)

    def close(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------- secure program

SUM_BLOCK = 1 << 23
"""Most value elements (B x candidates x d) in one Beaver product of the secure sum (64 MB
of int64); beyond it the sum runs in blocks of candidates, one round per block."""

FILL = int(encode(MASK_FILL)) + 1
"""Added to a valid row's encoded score: ``e = score + FILL * valid`` (linear, no
multiplication) puts every valid row (>= FILL - 2^36 > 2^36) above every invalid row
(|score| <= 2^36 encoded, ``SCORE_BOUND``), preserving the order and ties among valid rows."""


def _secure_program(scores, values, valid, m: int, spec: SelectionSpec, rank: int, impl: str = "auto",
                    shards_sorted: bool = False):
    """Run inside ONE CrypTen party on that party's shares; returns the opened outputs.

    Every party executes exactly this code on its own shares (SPMD). Linear steps act on
    the local share tensors directly (public constants are added by party 0 only);
    comparisons and products run through :mod:`fedmem.federation.mpc_rounds` (CrypTen's
    communicator and triple provider, fused rounds), except the naive baseline
    (``impl="argmax"``), which runs on CrypTen's ``MPCTensor`` as a user would write it.
    """
    import torch

    from fedmem.federation import mpc_rounds as MR

    B, N = scores.shape
    S = N // m
    first = rank == 0

    def t(a):
        a = np.ascontiguousarray(a)
        if not a.flags.writeable:   # zero-copy from the object store: read-only, and never written here
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(a)
        return torch.from_numpy(a)

    if spec.mode == "topk" and impl == "argmax" and N > spec.k:
        return _naive_program(t(scores), t(values), t(valid), m, spec, rank)
    R = MR.Rounds()
    val = t(valid)   # raw 0/1 shares, scale 1
    if spec.mode == "broadcast":
        mask = val
    elif spec.mode == "threshold":
        d = t(scores).clone()
        if first:
            d -= int(encode(spec.threshold))
        # |score - threshold| <= 2 * 2^36 (SCORE_BOUND): 38 bits
        _, below_val = R.drive(R.ltz(d, MR.bits_for(2 * int(encode(SCORE_BOUND))), [(val, 0)]))
        mask = val - below_val    # valid and not below the threshold
    else:
        e = t(scores) + FILL * val
        if impl == "auto":
            impl = choose_impl(B, S, m, spec.k)
        if N <= spec.k:
            mask = val
        elif impl == "merge":
            mask = R.drive(_merge_gen(R, e, val, m, spec.k, first, shards_sorted))
        elif impl == "grouped" and grouped_plan(S, m, spec.k) is not None:
            mask = R.drive(_grouped_gen(R, e, val, m, spec.k, first, grouped_plan(S, m, spec.k)))
        else:
            mask = R.drive(_rank_gen(R, e, val, spec.k, first))
    return _open_outputs(R, mask, t(values) if "sum" in spec.reveal else None, B, S, m, spec)


def _open_outputs(R, mask, vals, B: int, S: int, m: int, spec: SelectionSpec) -> dict:
    """Secure sum (one matmul round), count and tallies (linear), opened in one round."""
    from fedmem.federation.mpc_rounds import mul

    opened, names = [], []
    if "sum" in spec.reveal:
        # scale 1 x scale 2^16: the exact ring sum of the selected encoded values. Large inputs
        # go in blocks of candidates, one round each (a public function of the shapes), so that
        # the Beaver triple and the opened masks never hold more than SUM_BLOCK elements.
        N, d = vals.shape[1], vals.shape[2]
        step = max(1, SUM_BLOCK // max(1, B * d))
        total = None
        for lo in range(0, N, step):
            part = R.drive(mul("matmul", mask[:, None, lo:lo + step], vals[:, lo:lo + step])).squeeze(1)
            total = part if total is None else total + part
        opened.append(total)
        names.append("sum")
    if "count" in spec.reveal:
        opened.append(mask.sum(1))
        names.append("count")
    if "tallies" in spec.reveal:
        opened.append(mask.view(B, S, m).sum(2))
        names.append("tallies")
    out = {}
    if opened:
        plain = R.round([("open", x) for x in opened])
        for name, x in zip(names, plain):
            arr = x.numpy().astype(np.int64)
            out[name] = decode(arr) if name == "sum" else arr
    return out


def _naive_program(scores, values, valid, m: int, spec: SelectionSpec, rank: int) -> dict:
    """The naive baseline on CrypTen's ``MPCTensor``: ``k`` sequential argmaxes."""
    from fedmem._crypten import MPCTensor
    from crypten.mpc.primitives import ArithmeticSharedTensor

    B, N = scores.shape
    S = N // m
    val = MPCTensor.from_shares(valid, precision=0)
    shifted = scores.clone()
    if rank == 0:
        shifted += int(encode(MASK_FILL))
    eff = val * MPCTensor.from_shares(shifted, precision=FRAC_BITS)   # valid * (score + F)
    mask = _naive_topk(eff, val, spec.k)
    opened, names = [], []
    if "sum" in spec.reveal:
        vals = MPCTensor.from_shares(values, precision=FRAC_BITS)
        opened.append(mask.unsqueeze(1).matmul(vals).squeeze(1))
        names.append("sum")
    if "count" in spec.reveal:
        opened.append(mask.sum(1))
        names.append("count")
    if "tallies" in spec.reveal:
        opened.append(mask.view(B, S, m).sum(2))
        names.append("tallies")
    out = {}
    if opened:
        plain = ArithmeticSharedTensor.reveal_batch([x._tensor for x in opened])
        if not isinstance(plain, (list, tuple)):
            plain = [plain]
        for name, x in zip(names, plain):
            arr = x.numpy().astype(np.int64)
            out[name] = decode(arr) if name == "sum" else arr
    return out


def _composite_keys(e, first: bool):
    """``e'_j = N e_j + (N - 1 - j)``: distinct keys ordered exactly like the tie-break."""
    import torch

    N = e.shape[1]
    key = e * N
    if first:
        key = key + (N - 1 - torch.arange(N, dtype=torch.long))
    return key


def _ranks(ls, I, J, n: int, shape, first: bool):
    """Shares of each element's rank from the pairwise bits ``ls = [x_i < x_j]`` (linear, local)."""
    import torch

    r = torch.zeros(shape, dtype=torch.long)
    r.index_add_(len(shape) - 1, I, ls)
    r.index_add_(len(shape) - 1, J, ls, alpha=-1)
    if first:
        r += torch.arange(n, dtype=torch.long)   # rank_t = t + sum_{j>t} l_tj - sum_{i<t} l_it
    return r


def _rank_gen(R, e, val, k: int, first: bool):
    """``rank``: all N(N-1)/2 pairs in one comparison, then [rank < k] fused with ``* valid``.

    ``u`` beats ``t`` iff e_u > e_t or (e_u = e_t and u < t); the rank (number of
    candidates that beat ``t``) is linear in the pair bits. 15 rounds with 2 parties."""
    import torch

    from fedmem.federation.mpc_rounds import bits_for

    B, N = e.shape
    I, J = torch.triu_indices(N, N, offset=1)
    (ls,) = yield from R.ltz(e[:, I] - e[:, J])   # l_ij = [e_i < e_j]: j beats i
    r = _ranks(ls, I, J, N, (B, N), first)
    if first:
        r -= k
    _, mask = yield from R.ltz(r, bits_for(max(N, k)), [(val, 0)])   # [rank - k < 0] * valid
    return mask


def _grouped_gen(R, e, val, m: int, k: int, first: bool, G: int):
    """``grouped``: two constant-round levels (4 comparisons, 26 rounds with 2 parties).

    1. composite distinct keys (:func:`_composite_keys`), groups of ``G`` shards
       (``g = G m`` candidates; the last group padded with key -1 and validity 0);
    2. level 1: all-pairs rank ``r`` inside each group;
    3. compaction: ``P[i, t] = [r_t < i+1] - [r_t < i]`` (one-hot of the in-group rank,
       i < k); the comparison's last round also yields ``[r_t < i+1] * key_t`` and
       ``[r_t < i+1] * valid_t``, so the group's top-k keys ``z = P @ keys`` and
       ``P * valid`` are linear afterwards. Every global top-k candidate is in its
       group's top-k;
    4. level 2: all-pairs rank of the ``ng k`` survivors, ``s = [rank_2 < k]`` fused with
       ``s * (P * valid)``, summed over ``i``: the mask.
    """
    import torch

    from fedmem.federation.mpc_rounds import bits_for

    B, N = e.shape
    S = N // m
    g, ng = G * m, -(-S // G)
    n2 = ng * k
    x = torch.full((B, ng * g), -1 if first else 0, dtype=torch.long)
    x[:, :N] = _composite_keys(e, first)
    x = x.view(B, ng, g)
    vp = torch.zeros((B, ng * g), dtype=torch.long)
    vp[:, :N] = val
    vp = vp.view(B, ng, g)
    I, J = torch.triu_indices(g, g, offset=1)
    (ls,) = yield from R.ltz(x[..., I] - x[..., J])
    r = _ranks(ls, I, J, g, (B, ng, g), first)
    steps = r.unsqueeze(2).expand(B, ng, k, g).clone()
    if first:
        steps -= torch.arange(1, k + 1, dtype=torch.long).view(1, 1, k, 1)
    _, bx, bv = yield from R.ltz(steps, bits_for(max(g, k)), [(x.unsqueeze(2), 0), (vp.unsqueeze(2), 0)])
    bx[:, :, 1:] -= bx[:, :, :-1].clone()   # P * key, P * valid (P linear in the bits)
    bv[:, :, 1:] -= bv[:, :, :-1].clone()
    z = bx.sum(-1).reshape(B, n2)           # P @ keys: the groups' top-k keys
    I2, J2 = torch.triu_indices(n2, n2, offset=1)
    (ls2,) = yield from R.ltz(z[:, I2] - z[:, J2])
    r2 = _ranks(ls2, I2, J2, n2, (B, n2), first)
    if first:
        r2 -= k
    _, spv = yield from R.ltz(r2, bits_for(max(n2, k)), [(bv.reshape(B, n2, g), 1)])
    return spv.view(B, ng, k, g).sum(2).reshape(B, ng * g)[:, :N].contiguous()


def _ce_gen(R, x, lo, hi):
    """One layer of a sorting network on the last axis: afterwards x[lo] >= x[hi] (8 rounds)."""
    a, b = x[..., lo], x[..., hi]
    _, delta = yield from R.ltz(a - b, ys=[(b - a, 0)])   # [a < b] * (b - a), fused
    out = x.clone()
    out[..., lo] = a + delta
    out[..., hi] = b - delta
    return out


def _merge_gen(R, e, val, m: int, k: int, first: bool, shards_sorted: bool = False):
    """Secure top-k by a tree of top-K merges of sorted lists (K = next power of two >= k).

    ``e`` (B, N) are shares of the effective scores. All on shares:

    1. composite keys ``e'_j = N * e_j + (N - 1 - j)``: distinct and ordered exactly
       like the documented tie-break (higher score, then lower flat index);
    2. each shard's m keys are sorted descending by Batcher's odd-even merge sort
       (comparators touching the padding or feeding only positions >= k are pruned) and
       cut to the top k, padded with the key -1 to length K (with ``shards_sorted`` the
       hosts' order is trusted and this sort is skipped);
    3. pairs of sorted lists are merged keeping the top K: ``c_i = max(a_i, b_{K-1-i})``
       is bitonic and holds the top K of the union (only ``K-k <= i < k`` needs a
       comparison, the rest face padding), then pruned half-cleaner layers sort it;
       level by level until one list remains (an odd list passes through);
    4. ``tau`` = element k-1 of that list (the k-th largest key) and the selection is
       ``[e'_j >= tau] * valid`` (fused into the last comparison's final round).

    Valid keys are positive and above the padding (-1); invalid keys may sit below it,
    which can only reorder entries below every valid key (0/1 principle with the
    threshold at any valid key), and the final ``* valid`` removes them. About
    N(log^2 m + log^2 K)/2 comparisons, O(log^2 m + log S log K) rounds.
    """
    import torch

    B, N = e.shape
    S = N // m
    K, M, sort_layers, mix, clean_layers = merge_network(m, k)
    key = _composite_keys(e, first)
    pad = -1 if first else 0
    x = torch.full((B, S, M), pad, dtype=torch.long)
    x[:, :, :m] = key.view(B, S, m)
    if not shards_sorted:
        for layer in sort_layers:
            x = yield from _ce_gen(R, x, [c[0] for c in layer], [c[1] for c in layer])
    lists = torch.full((B, S, K), pad, dtype=torch.long)
    top = min(k, m)
    lists[:, :, :top] = x[:, :, :top]
    del x
    while lists.shape[1] > 1:
        L = lists.shape[1]
        p = L // 2
        a, b = lists[:, 0:2 * p:2], lists[:, 1:2 * p:2].flip(-1)
        c = torch.where(torch.arange(K) < K - k, a, b)  # the max is known where one side is padding
        if mix:
            am, bm = a[..., mix], b[..., mix]
            _, delta = yield from R.ltz(am - bm, ys=[(bm - am, 0)])
            c[..., mix] = am + delta                     # max(a_i, b_{K-1-i})
        for layer in clean_layers:
            c = yield from _ce_gen(R, c, [q[0] for q in layer], [q[1] for q in layer])
        c[..., k:] = pad
        lists = torch.cat([c, lists[:, 2 * p:]], dim=1) if L % 2 else c
    tau = lists[:, 0, k - 1]
    _, below = yield from R.ltz(key - tau[:, None], ys=[(val, 0)])   # [e'_j < tau] * valid
    return val - below


def _oddeven_layers(n: int):
    """Layers of Batcher's odd-even merge sort for ``n`` (a power of two), as (lo, hi) pairs."""
    layers = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            layer = [(i + j, i + j + k)
                     for j in range(k % p, n - k, 2 * k)
                     for i in range(min(k, n - j - k))
                     if (i + j) // (2 * p) == (i + j + k) // (2 * p)]
            layers.append(layer)
            k //= 2
        p *= 2
    return layers


def _prune(layers, needed: int, pad_from: int | None = None):
    """Drop comparators that cannot matter (a network where every comparator puts the max at lo).

    ``pad_from``: positions >= it hold a known minimum (-inf padding) that never moves, so a
    comparator touching one is a no-op. ``needed``: only output positions < it are used;
    comparators feeding none of them are dead (backward liveness).
    """
    if pad_from is not None:
        layers = [[(lo, hi) for lo, hi in layer if hi < pad_from] for layer in layers]
    live = set(range(needed))
    kept = []
    for layer in reversed(layers):
        keep = [(lo, hi) for lo, hi in layer if lo in live or hi in live]
        for lo, hi in keep:
            live.update((lo, hi))
        kept.append(keep)
    return [layer for layer in reversed(kept) if layer]


def merge_network(m: int, k: int):
    """Public comparator schedule of the merge-tree top-k (see :func:`_merge_topk`).

    Returns ``(K, M, sort_layers, mix, clean_layers)``: list length K (power of two >= k),
    padded shard length M, the pruned shard-sort layers, the positions ``i`` where a
    merge compares ``a_i`` with ``b_{K-1-i}``, and the pruned half-cleaner layers.
    """
    K = 1 << max(0, (k - 1).bit_length())
    M = 1 << max(0, (max(m, 1) - 1).bit_length())
    sort_layers = _prune(_oddeven_layers(M), needed=min(k, m), pad_from=m)
    mix = list(range(K - k, k))
    cleaners = []
    st = K // 2
    while st >= 1:
        cleaners.append([(i, i + st) for i in range(K) if (i // st) % 2 == 0])
        st //= 2
    return K, M, sort_layers, mix, _prune(cleaners, needed=k)


def grouped_plan(S: int, m: int, k: int):
    """Shards per group G for the two-level rank method, or None when one level is cheaper.

    Minimises the comparison count ``ng*g(g-1)/2 + ng*g*k + n2(n2-1)/2 + n2`` (level-1
    pairs, compaction, level-2 pairs, final test) with ``g = G*m`` candidates per group,
    ``ng = ceil(S/G)`` groups and ``n2 = ng*k`` survivors, against ``N(N-1)/2`` for rank.
    """
    return _grouped_plan_cost(S, m, k)[0]


def choose_impl(B: int, S: int, m: int, k: int) -> str:
    """What ``impl="auto"`` runs for a top-k batch (a public function of the shapes only).

    A constant-round method (``grouped`` when it needs fewer comparisons, else ``rank``)
    while the batch needs at most ``CONSTANT_ROUNDS_MAX`` comparisons; beyond that the
    merge tree, whose O(N log^2 k) comparisons win once the volume, not the round count,
    dominates (measured crossover: between 10 and 100 queries of 40 x 5 candidates).
    """
    G, cost = _grouped_plan_cost(S, m, k)
    if B * cost <= CONSTANT_ROUNDS_MAX:
        return "rank" if G is None else "grouped"
    return "merge"


def _grouped_plan_cost(S: int, m: int, k: int):
    N = S * m
    best, best_cost = None, N * (N - 1) // 2
    for G in range(1, S):
        g = G * m
        if g <= k:
            continue
        ng = -(-S // G)
        n2 = ng * k
        cost = ng * g * (g - 1) // 2 + ng * g * k + n2 * (n2 - 1) // 2 + n2
        if cost < best_cost:
            best, best_cost = G, cost
    return best, best_cost


def _naive_topk(eff, val, k: int):
    """Baseline: ``k`` sequential CrypTen argmaxes (log-reduction), knocking out each winner.

    Benchmark only (``impl="argmax"``): CrypTen's argmax returns a random one-hot among
    exact ties, so this does not implement the documented tie-break.
    """
    mask = None
    cur = eff
    for _ in range(k):
        oh = cur.argmax(dim=1, one_hot=True)  # (B, N) one-hot, scale 1
        mask = oh if mask is None else mask + oh
        cur = cur - oh * cur  # winner's effective score -> 0 (below every valid one)
    return mask * val


class _CryptenParty:
    """One compute party (the body of a Ray actor). Holds only its own shares.

    Start-up is two calls so that the rendezvous can live on any node: rank 0's
    :meth:`endpoint` picks a free port on its own node's IP; the driver hands that
    address to every party's :meth:`init`. A query is ONE call, :meth:`load_run`: it
    fetches this party's packets (Ray ObjectRefs are resolved here, never in the driver;
    the fetch is bounded by the timeout), then all parties exchange public metadata
    (fetch failed?, shapes, a checksum of the shard ids) in one all-gather *before* the
    protocol: a dead shard host fails the query on every party alike, none enters the
    protocol and none is stranded inside it; otherwise :meth:`run` executes the secure
    program on the loaded shares.
    """

    def __init__(self, rank: int, world_size: int, provider: str, threads: int):
        self.rank, self.world_size, self.provider = rank, world_size, provider
        self._loaded = None
        import torch

        torch.set_num_threads(threads)

    def node(self) -> dict:
        """Where this party runs: ``{"node_id", "ip", "pid"}`` (public placement facts)."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": _node_ip(), "pid": os.getpid()}

    def endpoint(self) -> str:
        """Rank 0 only: ``tcp://<this node's IP>:<free port on it>`` for the CrypTen rendezvous."""
        ip = _node_ip()
        return f"tcp://{_url_host(ip)}:{_free_port(ip)}"

    def _env(self, rank: int, rendezvous: str):
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.world_size), "RENDEZVOUS": rendezvous,
               "DISTRIBUTED_BACKEND": "gloo"}
        ifname = os.environ.get("FEDMEM_GLOO_IFNAME") or _ifname_for(_node_ip())
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
        os.environ.update(env)

    def init(self, rendezvous: str):
        from fedmem._crypten import crypten

        self._env(self.rank, rendezvous)
        crypten.cfg.mpc.provider = self.provider
        crypten.cfg.communicator.verbose = True
        crypten.init()
        return self.node()

    def serve_ttp(self, rendezvous: str):
        """TTP provider only: run CrypTen's trusted-third-party server loop (returns at shutdown)."""
        from fedmem._crypten import crypten
        from crypten.mpc.provider.ttp_provider import TTPServer

        self._env(self.world_size, rendezvous)
        crypten.cfg.mpc.provider = "TTP"
        crypten.cfg.communicator.verbose = True
        crypten.init()
        TTPServer()
        return "ttp done"

    def load(self, packets, timeout_s: float | None = None):
        """Fetch and assemble this party's packets; returns public metadata or the fetch error."""
        self._loaded = None
        try:
            scores, values, valid, ids, m = assemble(_resolve(packets, timeout_s))
        except MpcFailure as exc:
            return {"error": str(exc)}
        self._loaded = (scores, values, valid, ids, m)
        return {"ids": ids, "shape": (scores.shape[0], scores.shape[1], values.shape[2], m)}

    def load_run(self, packets, timeout_s, spec, impl="auto", shards_sorted=False):
        """:meth:`load`, an agreement step, then :meth:`run`, in ONE actor call (one Ray round trip).

        Agreement: every party contributes ``[fetch failed, B, N, d, m, crc32(shard ids)]``
        to one all-gather (before the protocol's statistics start). Only when every party
        fetched and all agree does any party enter the protocol; otherwise each returns the
        same ``{"error": ...}`` and stays warm (no share was used)."""
        import zlib

        import torch

        from fedmem._crypten import comm

        meta = self.load(packets, timeout_s)
        if "error" in meta:
            mine = [1, 0, 0, 0, 0, 0]
        else:
            B, N, d, m = meta["shape"]
            mine = [0, B, N, d, m, zlib.crc32(np.ascontiguousarray(meta["ids"], dtype=np.int64).tobytes())]
        got = comm.get().all_gather(torch.tensor(mine, dtype=torch.long))
        rows = [g.tolist() for g in got]
        if any(r[0] for r in rows):
            self._loaded = None
            return {"error": meta.get("error") or "another party could not fetch its shares from the shard hosts "
                                                  "(shares could not be fetched)"}
        if any(r != rows[0] for r in rows[1:]):
            self._loaded = None
            return {"error": "parties received packets from different shards or of different shapes; no output "
                             "was computed."}
        return self.run(spec, impl, shards_sorted)

    def run(self, spec, impl="auto", shards_sorted=False):
        from fedmem._crypten import comm

        if self._loaded is None:
            raise MpcFailure("run called without loaded packets.")
        scores, values, valid, ids, m = self._loaded
        self._loaded = None
        c = comm.get()
        c.reset_communication_stats()
        t0, c0 = time.perf_counter(), time.process_time()
        out = _secure_program(scores, values, valid, m, spec, self.rank, impl, shards_sorted)
        st = c.get_communication_stats()
        out["_stats"] = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                         "rounds": int(st["rounds"]), "bytes": int(st["bytes"])}
        out["_ids"] = ids
        return out

    def pid(self):
        return os.getpid()

    def peak_rss(self) -> int:
        """Peak resident memory of this party process so far, in bytes (benchmarks)."""
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def shutdown(self):
        from fedmem._crypten import crypten

        crypten.uninit()
        return True


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _free_port(ip: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``ip`` right now (this node's address)."""
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _ifname_for(ip: str) -> str | None:
    """The network interface that carries ``ip`` (gloo must bind there), or None if unknown."""
    try:
        import psutil
    except ImportError:  # psutil is optional (not every Ray install has it): gloo then picks its default
        return None      # interface; FEDMEM_GLOO_IFNAME overrides
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs):
            return name
    return None


class SharedNodeWarning(UserWarning):
    """The compute parties share a Ray node (fewer alive nodes than parties): no separation."""


PLACEMENTS = ("auto", "spread", "pack")
_BUNDLE = {"CPU": 0.01}
"""A party's placement-group bundle: a token CPU share (parties are idle between queries)."""


def _eligible_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= _BUNDLE["CPU"])


class CryptenParties:
    """``n_parties`` CrypTen compute parties as Ray actors over gloo, one per node when possible.

    Starts its actors on construction (Ray must be initialised, or is initialised
    locally) and keeps them warm across :meth:`run` calls. Placement (``placement``):

    * ``"auto"`` (default): when the cluster has at least ``n_parties`` alive nodes with
      a CPU, the parties go to distinct nodes (a ``STRICT_SPREAD`` placement group, one
      token bundle ``{"CPU": 0.01}`` per party); otherwise they share a node and a
      :class:`SharedNodeWarning` says so (the single-machine simulation);
    * ``"spread"``: distinct nodes or :class:`~fedmem.errors.MpcFailure` at start;
    * ``"pack"``: no placement group and no warning (benchmarks on one machine).

    Rendezvous: rank 0 picks a free port on its own node's IP
    (``ray.util.get_node_ip_address()`` inside the actor) and returns
    ``tcp://IP:PORT``; the driver passes it to every party, and gloo binds to the
    interface that carries each party's node IP (``FEDMEM_GLOO_IFNAME`` overrides).
    :attr:`nodes` records where each rank runs. With ``provider="TTP"`` the trusted third
    party is one more actor, spread too when there are ``n_parties + 1`` nodes.

    Starting (CrypTen rendezvous) is bounded by ``start_timeout_s`` and every
    :meth:`run` by ``timeout_s``; a timeout, a dead actor or a party exception raises
    :class:`~fedmem.errors.MpcFailure` after killing all parties (no output of that
    batch reaches the caller); the next :meth:`run` starts fresh parties. Shares that
    cannot be fetched from a shard host raise ``MpcFailure`` before any party enters the
    protocol (the parties stay warm). ``threads`` is each party's torch intra-op thread count.

    ``shards_sorted=True`` trusts that every shard sends its rows sorted by score
    descending (ties by lower candidate index) with invalid/padding rows last, as
    fedmem's shard hosts do, and skips the in-MPC shard sort of the merge method (about a
    third of its comparisons). Secrecy is unaffected; if a shard breaks the promise the
    top-k may be wrong, including for other shards' candidates, so the default is False.
    It has no effect on ``rank``, ``threshold`` or ``broadcast``.
    """

    def __init__(self, n_parties: int = 2, *, timeout_s: float = 60.0, provider: str = "TFP", threads: int = 1,
                 start_timeout_s: float = 180.0, shards_sorted: bool = False, placement: str = "auto"):
        self.n_parties = V.positive_int("n_parties", n_parties, minimum=2)
        if self.n_parties > 3:
            raise ValueError(f"n_parties must be 2 or 3. Found {n_parties!r}.")
        self.timeout_s = V.positive("timeout_s", timeout_s)
        self.start_timeout_s = V.positive("start_timeout_s", start_timeout_s)
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {PROVIDERS}. Found {provider!r}.")
        self.provider = provider
        self.threads = V.positive_int("threads", threads)
        if not isinstance(shards_sorted, bool):
            raise TypeError(f"shards_sorted must be a bool. Found {shards_sorted!r}.")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}. Found {placement!r}.")
        self.shards_sorted = shards_sorted
        self.placement = placement
        self._actors: list = []
        self._ttp = None
        self._ttp_ref = None
        self._pg = None
        self._closed = False
        self.restarts = 0
        self.nodes: list[dict] = []
        self.strategy = None
        self._start()

    # -- lifecycle
    def _placement(self, n_actors: int) -> list[dict]:
        """Ray ``.options`` per actor (parties in rank order, then the TTP if any)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = self.n_parties
        nodes = _eligible_nodes() if self.placement != "pack" else 0
        if self.placement == "pack" or nodes < n:
            if self.placement == "spread":
                raise MpcFailure(f"placement='spread' needs {n} alive nodes with a CPU; the cluster has {nodes}.")
            if self.placement == "auto":
                import warnings

                warnings.warn(f"the {n} compute parties share one Ray node (the cluster has {nodes} alive node(s) "
                              f"with a CPU): this simulates the protocol but separates no trust. Start one node per "
                              f"party (docs/cluster.md).", SharedNodeWarning, stacklevel=4)
            self.strategy = None
            return [{} for _ in range(n_actors)]
        spread = n_actors if nodes >= n_actors else n
        self._pg = ray.util.placement_group([dict(_BUNDLE) for _ in range(spread)], strategy="STRICT_SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - cannot place: fail closed
            self._kill()
            raise MpcFailure(f"compute parties could not be placed on {spread} distinct nodes within "
                             f"{self.start_timeout_s:g} s: {exc!r}") from exc
        self.strategy = "STRICT_SPREAD"
        return [{"scheduling_strategy": PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i)}
                if i < spread else {} for i in range(n_actors)]

    def _start(self):
        import ray

        from fedmem._ray import ensure_ray

        ensure_ray()
        actor_cls = ray.remote(num_cpus=0, max_restarts=0)(_CryptenParty)
        n = self.n_parties
        opts = self._placement(n + (self.provider == "TTP"))
        self._actors = [actor_cls.options(**opts[r]).remote(r, n, self.provider, self.threads) for r in range(n)]
        try:
            rdv = ray.get(self._actors[0].endpoint.remote(), timeout=self.start_timeout_s)
            refs = [a.init.remote(rdv) for a in self._actors]
            if self.provider == "TTP":
                self._ttp = actor_cls.options(**opts[n]).remote(n, n, self.provider, self.threads)
                self._ttp_ref = self._ttp.serve_ttp.remote(rdv)
            self.nodes = ray.get(refs, timeout=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any start failure is an MPC failure
            self._kill()
            raise MpcFailure(f"compute parties failed to start within {self.start_timeout_s:g} s: {exc!r}") from exc
        self.rendezvous = rdv

    def _kill(self):
        import ray

        for a in [*self._actors, *([self._ttp] if self._ttp is not None else [])]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors, self._ttp, self._ttp_ref = [], None, None
        if self._pg is not None:
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._pg = None

    @property
    def actors(self) -> list:
        """The live party actors (rank order); exposed for fault-injection tests."""
        return list(self._actors)

    def close(self):
        import ray

        if self._closed:
            return
        self._closed = True
        if self._actors:
            try:
                ray.get([a.shutdown.remote() for a in self._actors], timeout=min(10.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - best effort; killed below
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- compute
    def run(self, packets, spec: SelectionSpec, *, impl: str = "auto") -> Revealed:
        """Secure selection/aggregation; see the module docstring. Never hangs past ``timeout_s``.

        ``packets[p]`` lists party p's packets, one per shard host, as ``SharePacket`` or as
        Ray ``ObjectRef`` to one (what fedmem's shard hosts hand out): refs are fetched
        inside party p's actor, straight from the host's node, so the driver never holds a
        share. Each party fetches, then the parties check among themselves that every one
        got its shares and the same shards (an all-gather of public metadata); only then do
        they enter the protocol (one actor call per party and query).
        """
        import ray

        if self._closed:
            raise MpcFailure("CryptenParties is closed.")
        _check_spec(spec)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}. Found {impl!r}.")
        per = _check_packets(packets, self.n_parties)
        if not self._actors:
            self.restarts += 1
            self._start()
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        try:
            # one call per party: fetch, agree (all fetched, same shards and shapes), then the protocol
            refs = [a.load_run.remote(per[r], self.timeout_s, spec, impl, self.shards_sorted)
                    for r, a in enumerate(self._actors)]
            outs = ray.get(refs, timeout=max(0.001, deadline - time.perf_counter()))
            errors = [o["error"] for o in outs if "error" in o]
            if errors:   # no party entered the protocol: fail closed, parties stay warm
                fetch = [e for e in errors if "could not be fetched" in e]
                raise MpcFailure(f"no output was computed: {(fetch or errors)[0]}")
        except MpcFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - timeout, dead actor or party error: fail closed
            self._kill()
            kind = "timed out" if isinstance(exc, ray.exceptions.GetTimeoutError) else "failed"
            raise MpcFailure(f"secure computation {kind} (timeout {self.timeout_s:g} s); "
                             f"no output reached the caller, parties were stopped: {exc!r}") from exc
        first = outs[0]
        if any(not np.array_equal(o["_ids"], first["_ids"]) for o in outs[1:]):
            self._kill()
            raise MpcFailure("parties received packets from different shards; results discarded.")
        for o in outs[1:]:
            for name in REVEALABLE & set(first):
                if not np.array_equal(o[name], first[name]):
                    raise MpcFailure(f"parties opened different values for {name!r}: inconsistent run.")
        stats = {
            "secure": True,
            "seconds": time.perf_counter() - t0,
            "party_seconds": max(o["_stats"]["seconds"] for o in outs),
            # CPU time of the busiest party process: a load-insensitive measure of the work.
            "party_cpu_seconds": max(o["_stats"]["cpu_seconds"] for o in outs),
            "rounds": first["_stats"]["rounds"],
            # CrypTen logs per party; the system total is the sum over parties halved.
            "bytes": sum(o["_stats"]["bytes"] for o in outs) // 2,
        }
        return Revealed(sum=first.get("sum"), count=first.get("count"), tallies=first.get("tallies"),
                        stats=stats, shard_ids=first["_ids"])
