"""The secure top-k selection networks as sub-protocol generators over
:mod:`fedmem.federation.mpc.rounds`: ``rank``, ``grouped`` and ``merge`` (with their composite
keys, local rank sums and compare-exchange layers).
"""

from __future__ import annotations

from fedmem.federation.mpc.networks.comparators import merge_network

# torch, and rounds (which imports it), are imported inside the functions that run in a party: shard
# hosts import fedmem.federation.mpc with numpy only (tests/test_lazy_imports.py; torch is ~12 s of
# `python -X importtime` on this 2-core machine).


def composite_keys(e, first: bool):
    """``e'_j = N e_j + (N - 1 - j)``: distinct keys ordered exactly like the tie-break."""
    import torch

    N = e.shape[1]
    key = e * N
    if first:
        key = key + (N - 1 - torch.arange(N, dtype=torch.long))
    return key


def ranks(ls, I, J, n: int, shape, first: bool):
    """Shares of each element's rank from the pairwise bits ``ls = [x_i < x_j]`` (linear, local)."""
    import torch

    r = torch.zeros(shape, dtype=torch.long)
    r.index_add_(len(shape) - 1, I, ls)
    r.index_add_(len(shape) - 1, J, ls, alpha=-1)
    if first:
        r += torch.arange(n, dtype=torch.long)   # rank_t = t + sum_{j>t} l_tj - sum_{i<t} l_it
    return r


def rank_gen(R, e, val, k: int, first: bool):
    """``rank``: all N(N-1)/2 pairs in one comparison, then [rank < k] fused with ``* valid``.

    ``u`` beats ``t`` iff e_u > e_t or (e_u = e_t and u < t); the rank (number of
    candidates that beat ``t``) is linear in the pair bits. 15 rounds with 2 parties."""
    import torch

    from fedmem.federation.mpc.rounds import bits_for  # lazy: loads torch (~2.5 s)

    B, N = e.shape
    I, J = torch.triu_indices(N, N, offset=1)
    (ls,) = yield from R.ltz(e[:, I] - e[:, J])   # l_ij = [e_i < e_j]: j beats i
    r = ranks(ls, I, J, N, (B, N), first)
    if first:
        r -= k
    _, mask = yield from R.ltz(r, bits_for(max(N, k)), [(val, 0)])   # [rank - k < 0] * valid
    return mask


def grouped_gen(R, e, val, m: int, k: int, first: bool, G: int):
    """``grouped``: two constant-round levels (4 comparisons, 26 rounds with 2 parties).

    1. composite distinct keys (:func:`composite_keys`), groups of ``G`` shards
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

    from fedmem.federation.mpc.rounds import bits_for  # lazy: loads torch (~2.5 s)

    B, N = e.shape
    S = N // m
    g, ng = G * m, -(-S // G)
    n2 = ng * k
    x = torch.full((B, ng * g), -1 if first else 0, dtype=torch.long)
    x[:, :N] = composite_keys(e, first)
    x = x.view(B, ng, g)
    vp = torch.zeros((B, ng * g), dtype=torch.long)
    vp[:, :N] = val
    vp = vp.view(B, ng, g)
    I, J = torch.triu_indices(g, g, offset=1)
    (ls,) = yield from R.ltz(x[..., I] - x[..., J])
    r = ranks(ls, I, J, g, (B, ng, g), first)
    steps = r.unsqueeze(2).expand(B, ng, k, g).clone()
    if first:
        steps -= torch.arange(1, k + 1, dtype=torch.long).view(1, 1, k, 1)
    _, bx, bv = yield from R.ltz(steps, bits_for(max(g, k)), [(x.unsqueeze(2), 0), (vp.unsqueeze(2), 0)])
    bx[:, :, 1:] -= bx[:, :, :-1].clone()   # P * key, P * valid (P linear in the bits)
    bv[:, :, 1:] -= bv[:, :, :-1].clone()
    z = bx.sum(-1).reshape(B, n2)           # P @ keys: the groups' top-k keys
    I2, J2 = torch.triu_indices(n2, n2, offset=1)
    (ls2,) = yield from R.ltz(z[:, I2] - z[:, J2])
    r2 = ranks(ls2, I2, J2, n2, (B, n2), first)
    if first:
        r2 -= k
    _, spv = yield from R.ltz(r2, bits_for(max(n2, k)), [(bv.reshape(B, n2, g), 1)])
    return spv.view(B, ng, k, g).sum(2).reshape(B, ng * g)[:, :N].contiguous()


def ce_gen(R, x, lo, hi):
    """One layer of a sorting network on the last axis: afterwards x[lo] >= x[hi] (8 rounds)."""
    a, b = x[..., lo], x[..., hi]
    _, delta = yield from R.ltz(a - b, ys=[(b - a, 0)])   # [a < b] * (b - a), fused
    out = x.clone()
    out[..., lo] = a + delta
    out[..., hi] = b - delta
    return out


def merge_gen(R, e, val, m: int, k: int, first: bool, shards_sorted: bool = False):
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
    key = composite_keys(e, first)
    pad = -1 if first else 0
    x = torch.full((B, S, M), pad, dtype=torch.long)
    x[:, :, :m] = key.view(B, S, m)
    if not shards_sorted:
        for layer in sort_layers:
            x = yield from ce_gen(R, x, [c[0] for c in layer], [c[1] for c in layer])
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
            c = yield from ce_gen(R, c, [q[0] for q in layer], [q[1] for q in layer])
        c[..., k:] = pad
        lists = torch.cat([c, lists[:, 2 * p:]], dim=1) if L % 2 else c
    tau = lists[:, 0, k - 1]
    _, below = yield from R.ltz(key - tau[:, None], ys=[(val, 0)])   # [e'_j < tau] * valid
    return val - below
