"""Public comparator schedules of the merge-tree top-k: Batcher's odd-even merge sort layers, their
pruning, and the half-cleaner merge network (:func:`merge_network`).
"""

from __future__ import annotations


def oddeven_layers(n: int):
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


def prune(layers, needed: int, pad_from: int | None = None):
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
    sort_layers = prune(oddeven_layers(M), needed=min(k, m), pad_from=m)
    mix = list(range(K - k, k))
    cleaners = []
    st = K // 2
    while st >= 1:
        cleaners.append([(i, i + st) for i in range(K) if (i // st) % 2 == 0])
        st //= 2
    return K, M, sort_layers, mix, prune(cleaners, needed=k)
