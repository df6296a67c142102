"""Which top-k method ``impl="auto"`` runs: comparison counts and rounds of every method (public
shapes only), the two-constant cost model fitted to measurements, and :func:`choose_impl`.
"""

from __future__ import annotations

import numpy as np

from fedmem.federation.mpc.networks.comparators import merge_network

# rounds (which imports torch) is imported inside impl_costs: shard hosts import fedmem.federation.mpc
# with numpy only (tests/test_lazy_imports.py; torch is ~12 s of `python -X importtime` on this 2-core
# machine).


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
    from fedmem.federation.mpc.rounds import bits_for, ltz_rounds  # lazy: loads torch (~2.5 s)

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
