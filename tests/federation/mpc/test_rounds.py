"""Fused comparison rounds and the dealer's triple keystream (fedmem.federation.mpc.rounds),
with simulated parties.

Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.federation.sharing import reconstruct, share
from tests.federation.mpc.helpers import byte_uniformity_pvalue


# ----------------------------------------------------------------------------- fused rounds (simulated parties)

def _simulate(gens, n, rng):
    """Run one SPMD sub-protocol per simulated party in lockstep; each round's requests are
    answered from the reconstructed plaintext with fresh random shares (an ideal functionality
    for mul/and/b2a/open), so only the protocol logic above those requests is under test."""
    import torch

    def ashare(z):
        parts = [torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=tuple(z.shape), dtype=np.int64,
                                               endpoint=True)) for _ in range(n - 1)]
        return parts + [z - sum(parts, torch.zeros_like(z))]

    def xshare(z):
        parts = [torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=tuple(z.shape), dtype=np.int64,
                                               endpoint=True)) for _ in range(n - 1)]
        last = z.clone()
        for p in parts:
            last = last ^ p
        return parts + [last]

    def xor_all(ts):
        out = ts[0].clone()
        for t in ts[1:]:
            out = out ^ t
        return out

    sends = [None] * n
    while True:
        reqs, done = [], []
        for g, s in zip(gens, sends):
            try:
                reqs.append(g.send(s))
            except StopIteration as stop:
                done.append(stop.value)
        if done:
            assert len(done) == n, "SPMD: every party finishes in the same round"
            return done                         # one return value per party
        answers = [[] for _ in range(n)]
        for j, q in enumerate(reqs[0]):
            per = [r[j] for r in reqs]
            if q[0] == "and":
                z = xor_all([p[1] for p in per]) & xor_all([p[2] for p in per])
                for a, s in zip(answers, xshare(z)):
                    a.append(s)
            elif q[0] == "mul":
                z = getattr(torch, q[1])(sum(p[2] for p in per), sum(p[3] for p in per))
                for a, s in zip(answers, ashare(z)):
                    a.append(s)
            elif q[0] == "b2a":
                bit = xor_all([p[1] for p in per]) & 1
                outs = [ashare(bit)] + [ashare(bit.reshape(bit.shape + (1,) * nd) * sum(p[2][i][0] for p in per))
                                        for i, (_, nd) in enumerate(q[2])]
                for r in range(n):
                    answers[r].append([o[r] for o in outs])
            else:
                raise AssertionError(q[0])
        sends = answers


def _ltz_parties(xs, L, n, ys=None):
    """Rounds.ltz objects for n simulated parties (the sub-protocols only read rank and n)."""
    import torch

    from fedmem.federation.mpc.rounds import Rounds

    gens = []
    for r in range(n):
        R = Rounds.__new__(Rounds)
        R.rank, R.n = r, n
        gens.append(R.ltz(torch.from_numpy(xs[r]), L, [] if ys is None else [(torch.from_numpy(ys[r]), 1)]))
    return gens


def _ltz_values(x, L, n, rng):
    """Reconstructed [x < 0] through Rounds.ltz on n simulated parties (x: int64 ring values)."""
    outs = _simulate(_ltz_parties(share(np.asarray(x, dtype=np.int64), n, rng), L, n), n, rng)
    return reconstruct([o[0].numpy() for o in outs])


@pytest.mark.parametrize("n", [2, 3])
def test_fused_comparison_is_exact_at_every_bound(n):
    """Rounds.ltz = [x < 0] for x at the edges of (-2^L, 2^L), for every L, with 2 and 3
    parties (carry-save layer); the same values with a bound one bit too small are caught."""
    from fedmem.federation.mpc.rounds import ltz_rounds

    rng = np.random.default_rng(40 + n)
    for L in (1, 2, 3, 5, 8, 13, 38, 47, 62, 63):
        top = (1 << L) - 1
        x = np.array([0, 1, -1, top, -top, top - 1, -(top - 1), 2, -2], dtype=np.int64)
        x = np.concatenate([x[np.abs(x) <= top], rng.integers(-top, top, size=40, endpoint=True)])
        for _ in range(2):   # fresh shares each time
            np.testing.assert_array_equal(_ltz_values(x, L, n, rng), (x < 0).astype(np.int64), err_msg=f"L={L}")
        if L >= 2:           # L-1 bits: the sign of |x| >= 2^(L-1) comes out wrong
            assert not np.array_equal(_ltz_values(x, L - 1, n, rng), (x < 0).astype(np.int64)), L
    assert ltz_rounds(2) == 8 and ltz_rounds(2, 5) == 5 and ltz_rounds(3) == 9


def test_fused_comparison_products_and_bounds():
    """The products fused into the conversion round equal bit * y; bits_for picks the smallest bound."""
    from fedmem.federation.mpc.rounds import bits_for

    assert [bits_for(b) for b in (0, 1, 2, 3, 4, 20, 2**62, 2**70)] == [1, 1, 2, 2, 3, 5, 63, 63]
    with pytest.raises(ValueError, match="bound"):
        bits_for(-1)
    rng = np.random.default_rng(44)
    x = rng.integers(-50, 50, size=(3, 7))
    y = rng.integers(-2**40, 2**40, size=(3, 7, 4))
    outs = _simulate(_ltz_parties(share(x, 2, rng), 6, 2, share(y, 2, rng)), 2, rng)
    bit = reconstruct([o[0].numpy() for o in outs])
    prod = reconstruct([o[1].numpy() for o in outs])
    np.testing.assert_array_equal(bit, (x < 0).astype(np.int64))
    np.testing.assert_array_equal(prod, (x < 0)[..., None] * y)


def test_triple_keystream_is_order_exact_with_or_without_precomputation():
    """The dealer's AES-CTR keystream: what a party takes never depends on how much was
    generated ahead (both parties stay in step), the pool stays bounded, and the output
    passes the same byte-uniformity check that catches weak masks."""
    import threading

    from fedmem.federation.mpc.rounds import KeyStream

    key = bytes(range(32))
    ahead, lazy = KeyStream(key, cap_elements=5000), KeyStream(key, cap_elements=0)
    stop = threading.Event()
    got_a, got_l = [], []
    for n in (1, 7, 4096, 3, 20000, 1):
        ahead.refill(stop)                      # what the background thread does between queries
        assert ahead._pooled <= ahead.cap       # bounded memory
        got_a.append(ahead.take(n).clone())
        got_l.append(lazy.take(n).clone())
    for a, b in zip(got_a, got_l):
        assert np.array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(KeyStream(bytes(32), 0).take(64).numpy(), KeyStream(key, 0).take(64).numpy())
    assert byte_uniformity_pvalue(KeyStream(key, 0).take(60_000).numpy()) > 1e-4
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        KeyStream(b"short", 0)
