"""The secure selection programs: rank, grouped and merge top-k, threshold and broadcast as
generators over :mod:`fedmem.federation.mpc.rounds`, their comparison networks and plans,
and the naive CrypTen argmax baseline."""

from __future__ import annotations

import numpy as np

from fedmem.federation.sharing import FRAC_BITS, MASK_FILL, SCORE_BOUND, SelectionSpec, decode, encode


PROVIDERS = ("TFP", "TTP")
IMPLS = ("auto", "rank", "grouped", "merge", "argmax")
CONSTANT_ROUNDS_MAX = 1_000_000
"""Memory cap of the constant-round methods: ``impl="auto"`` never picks grouped or rank
for a batch needing more secure comparisons than this (their comparisons are all in
flight at once); below it the cost model decides (:func:`choose_impl`)."""

FIT_POINTS = [("rank", 1, 0.2138), ("grouped", 1, 0.2544), ("grouped", 10, 0.286), ("grouped", 50, 1.1728),
              ("grouped", 100, 1.9841), ("merge", 1, 1.4983), ("merge", 50, 1.7003), ("merge", 100, 2.3146)]
"""Measured ``(impl, B, protocol seconds)`` of one batch in the engine's own configuration
(2 parties, TFP, AES-CTR triples, ``shards_sorted=False``, 40 x 5, k = 5; medians of 3,
interleaved), by ``scripts/bench_engine.py --fit-impl --repeats 3`` on the shared 2-core
machine at load average 24 (so every time is ~3x an idle machine's; the choice depends
only on the ratio of the two constants, which load scales alike)."""

ROUND_S, COMPARISON_S = 6.42e-3, 4.28e-6
"""Cost model of :func:`choose_impl`: seconds per communication round (latency, Python per
round) and per secure comparison (triples, bit operations, bytes); the least-squares fit of
:data:`FIT_POINTS` (:func:`fit_cost_model`; a test checks the constants are that fit)."""


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
    comparisons and products run through :mod:`fedmem.federation.mpc.rounds` (CrypTen's
    communicator and triple provider, fused rounds), except the naive baseline
    (``impl="argmax"``), which runs on CrypTen's ``MPCTensor`` as a user would write it.
    """
    import torch

    from fedmem.federation.mpc import rounds as MR

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
            impl = choose_impl(B, S, m, spec.k, shards_sorted)
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
    from fedmem.federation.mpc.rounds import mul

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
    for name, x in _support_outputs(mask, B, S, m, spec):
        opened.append(x)
        names.append(name)
    return _decode_opened(names, R.round([("open", x) for x in opened]) if opened else [])


def _support_outputs(mask, B: int, S: int, m: int, spec: SelectionSpec) -> list[tuple[str, object]]:
    """Count and per-shard tallies of the selection: linear in the mask's shares (no communication);
    ``mask`` is raw share tensors or a CrypTen ``MPCTensor``."""
    out = []
    if "count" in spec.reveal:
        out.append(("count", mask.sum(1)))
    if "tallies" in spec.reveal:
        out.append(("tallies", mask.view(B, S, m).sum(2)))
    return out


def _decode_opened(names, plain) -> dict:
    """Opened ring elements by name: the sum decoded from fixed point, count and tallies as integers."""
    out = {}
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
    for name, x in _support_outputs(mask, B, S, m, spec):
        opened.append(x)
        names.append(name)
    plain = ArithmeticSharedTensor.reveal_batch([x._tensor for x in opened]) if opened else []
    return _decode_opened(names, plain if isinstance(plain, (list, tuple)) else [plain])


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

    from fedmem.federation.mpc.rounds import bits_for

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

    from fedmem.federation.mpc.rounds import bits_for

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


def fit_cost_model(points, S: int = 40, m: int = 5, k: int = 5, shards_sorted: bool = False):
    """Least-squares ``(ROUND_S, COMPARISON_S)`` from measured ``(impl, B, seconds)`` points
    (protocol seconds of one batch of B queries, in the configuration ``S, m, k, shards_sorted``)."""
    costs = impl_costs(S, m, k, shards_sorted)
    A = np.array([[costs[i][0], B * costs[i][1]] for i, B, _ in points], dtype=float)
    y = np.array([t for _, _, t in points], dtype=float)
    w = 1.0 / y     # relative errors: small and large batches count alike
    (r, c), *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    return float(r), float(c)


def impl_costs(S: int, m: int, k: int, shards_sorted: bool = False) -> dict:
    """``{impl: (rounds, comparisons per query)}`` of every top-k method (public shapes only).

    Rounds are those of a 2-party run including the secure sum and the final opening;
    comparisons count every compared pair (63-bit or small-range)."""
    from fedmem.federation.mpc.rounds import bits_for, ltz_rounds

    N = S * m
    full = ltz_rounds(2)
    out = {"rank": (full + ltz_rounds(2, bits_for(max(N, k))) + 2, N * (N - 1) // 2 + N)}
    G, gcost = _grouped_plan_cost(S, m, k)
    if G is not None:
        g, n2 = G * m, -(-S // G) * k
        out["grouped"] = (2 * full + ltz_rounds(2, bits_for(max(g, k))) + ltz_rounds(2, bits_for(max(n2, k))) + 2,
                          gcost)
    K, M, sort_layers, mix, clean = merge_network(m, k)
    levels = max(0, (S - 1).bit_length())
    layers = (0 if shards_sorted else len(sort_layers)) + levels * (bool(mix) + len(clean)) + 1
    comps = (0 if shards_sorted else S * sum(map(len, sort_layers))) + \
        (S - 1) * (len(mix) + sum(map(len, clean))) + N
    out["merge"] = (layers * full + 2, comps)
    return out


def predicted_seconds(B: int, S: int, m: int, k: int, shards_sorted: bool = False) -> dict:
    """The cost model's protocol seconds per impl: ``ROUND_S * rounds + COMPARISON_S * B * comparisons``."""
    return {name: ROUND_S * r + COMPARISON_S * B * c for name, (r, c) in impl_costs(S, m, k, shards_sorted).items()}


def choose_impl(B: int, S: int, m: int, k: int, shards_sorted: bool = False) -> str:
    """What ``impl="auto"`` runs for a top-k batch (a public function of the shapes only).

    The method with the smallest predicted time (:func:`predicted_seconds`: a two-constant
    model, seconds per round and per comparison, fitted to measurements in the engine's
    own configuration), among those whose batch fits the memory cap
    ``CONSTANT_ROUNDS_MAX`` (grouped and rank hold all their comparisons at once; merge
    is always allowed). For 40 x 5, k = 5 and unsorted shards the model switches from
    grouped to merge at the batch size :func:`switch_batch` returns.
    """
    pred = predicted_seconds(B, S, m, k, shards_sorted)
    costs = impl_costs(S, m, k, shards_sorted)
    ok = {n: t for n, t in pred.items() if n == "merge" or B * costs[n][1] <= CONSTANT_ROUNDS_MAX}
    return min(ok, key=lambda n: (ok[n], n != "grouped"))


def switch_batch(S: int, m: int, k: int, shards_sorted: bool = False, limit: int = 4096) -> int | None:
    """Smallest batch size from which :func:`choose_impl` picks ``merge`` (None: not below ``limit``)."""
    for B in range(1, limit + 1):
        if choose_impl(B, S, m, k, shards_sorted) == "merge":
            return B
    return None


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
