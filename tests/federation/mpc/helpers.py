"""Helpers shared by the MPC-layer tests (tests/federation/test_sharing.py, test_engine_mpc.py and
tests/federation/mpc/): random candidates, a brute-force reference, a byte-uniformity check,
equality of revealed outputs, refs of a dead host. Moved from tests/test_mpc.py."""

from __future__ import annotations

import numpy as np
from scipy import stats

from fedmem.federation.sharing import SCORE_BOUND, Revealed, decode, encode, share_candidates

ALL = frozenset({"sum", "count", "tallies"})


def make_candidates(rng, B, S, m, d, *, n_parties=2, n_hosts=3, decimals=1, p_valid=0.75):
    """Random candidates on several hosts with shuffled, non-contiguous global shard ids.

    Scores are rounded to ``decimals`` so exact ties are frequent. Returns the per-party
    packet lists and the plaintext inputs.
    """
    ids = rng.permutation(3 * S)[:S].astype(np.int64)
    sc = np.round(rng.uniform(-1, 1, (B, S, m)), decimals)
    vals = rng.uniform(-1, 1, (B, S, m, d))
    ok = rng.random((B, S, m)) < p_valid
    vals[~ok] = 0.0
    sc[~ok] = -SCORE_BOUND  # what a shard host puts in padding rows (ignored by selection)
    cuts = np.array_split(np.arange(S), n_hosts)
    per_host = [share_candidates(sc[:, c], vals[:, c], ok[:, c], ids[c], n_parties, rng) for c in cuts if len(c)]
    packets = [[h[p] for h in per_host] for p in range(n_parties)]
    return packets, (sc, vals, ok, ids)


def brute_force(sc, vals, ok, ids, spec):
    """Independent reference straight from the documented semantics, one query at a time."""
    B, S, m = sc.shape
    order = np.argsort(ids)
    enc = encode(sc)
    sums, counts, tallies = [], [], []
    for b in range(B):
        cands = [(s_pos, c) for s_pos in range(S) for c in range(m) if ok[b, order[s_pos], c]]
        if spec.mode == "topk":
            cands.sort(key=lambda t: (-enc[b, order[t[0]], t[1]], ids[order[t[0]]], t[1]))
            chosen = cands[: spec.k]
        elif spec.mode == "threshold":
            chosen = [t for t in cands if enc[b, order[t[0]], t[1]] >= encode(spec.threshold)]
        else:
            chosen = cands
        tal = np.zeros(S, dtype=np.int64)
        ring = np.zeros(vals.shape[-1], dtype=np.int64)
        for s_pos, c in chosen:
            tal[s_pos] += 1
            ring += encode(vals[b, order[s_pos], c])
        sums.append(decode(ring))
        counts.append(len(chosen))
        tallies.append(tal)
    return np.array(sums), np.array(counts), np.array(tallies)


def byte_uniformity_pvalue(arr: np.ndarray) -> float:
    """Smallest chi-square p-value over the 8 byte positions of int64 ring elements."""
    b = np.ascontiguousarray(arr, dtype=np.int64).view(np.uint8).reshape(-1, 8)
    return min(stats.chisquare(np.bincount(b[:, j], minlength=256)).pvalue for j in range(8))


def assert_same(a: Revealed, b: Revealed):
    for f in ("sum", "count", "tallies"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=f)


def dead_refs(ray, packets):
    """Per-party refs to results of a shard host that died before producing them (unfetchable)."""

    @ray.remote(num_cpus=0, max_restarts=0)
    class Host:
        def packet(self, x):
            return x

    h = Host.remote()
    ray.kill(h, no_restart=True)
    return [[h.packet.remote(x) for x in party] for party in packets]
